"""How far a job's throughput model is off when the job first runs a configuration.

    .venv/bin/python bench/model_error.py [--workload W.csv] [--cluster hetero-64] \
        [--profiles data/profiles-hetero] [--policy shoal] [--json out/model_error.json]

Simulates one workload under one policy. Whenever a job starts training on a configuration
(device type, placement, micro-batch, accumulation steps) it has not run just before, the step
time its model predicts for it at that moment, before measuring it, is compared with the step
time the profile gives. These are the predictions policies act on when they move a job to a
size or a type it has not measured. Prints predicted / measured step time per application,
device type and span (one node or several) and writes the same as JSON. A ratio below 1 means
the model expected the configuration to be faster than it is.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from unittest import mock

import numpy as np
from rich.console import Console
from rich.table import Table

from shoal.backends.sim.job import SimJob
from shoal.backends.sim.profile import ProfileLibrary
from shoal.backends.sim.run import simulate
from shoal.metrics.report import summarize
from shoal.perf.throughput import predict_step_time
from shoal.policy.registry import tuned_policy
from shoal.spec import load_cluster, load_workload_csv

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT.parent / "shared" / "data" / "pollux" / "workloads" / "workload-7.csv"

Key = tuple[str, str, str]


def first_run_errors(workload: Path, cluster: str, profiles: Path, policy: str,
                     interval: float = 60.0, restart_delay: float = 30.0
                     ) -> tuple[dict[Key, list[float]], float]:
    """Predicted / measured step time of every first run of a configuration, by (application,
    device type, "single" or "multi" node), and the run's average JCT."""
    ratios: dict[Key, list[float]] = defaultdict(list)
    last: dict[str, tuple] = {}
    train = SimJob._train

    def recording_train(job: SimJob, now: float, seconds: float) -> None:
        alloc = job.allocation
        config = (alloc.device_type, alloc.placement, job.atomic_bsz, job.accum_steps)
        if last.get(job.name) != config:
            last[job.name] = config
            model = job.goodput_model(alloc.device_type)
            if model is not None:
                measured = job.app.step_time(alloc.placement, job.atomic_bsz,
                                             job.accum_steps, alloc.device_type)
                nodes = len(alloc.placement)
                predicted = float(predict_step_time(model.perf, nodes, alloc.num_replicas,
                                                    job.atomic_bsz, job.accum_steps))
                span = "multi" if nodes > 1 else "single"
                ratios[(job.app.name, alloc.device_type, span)].append(predicted / measured)
        train(job, now, seconds)

    with mock.patch.object(SimJob, "_train", recording_train):
        result = simulate(load_workload_csv(workload), tuned_policy(policy, {}),
                          load_cluster(cluster), ProfileLibrary(profiles), interval=interval,
                          restart_delay=restart_delay)
    return ratios, summarize(result, fairness=False)["summary"]["avg_jct_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--cluster", default="hetero-64")
    parser.add_argument("--profiles", type=Path, default=ROOT / "data" / "profiles-hetero",
                        help="per-type profiles (../shared/data/pollux/traces for pollux-t4-64)")
    parser.add_argument("--policy", default="shoal")
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "model_error.json")
    args = parser.parse_args()
    ratios, avg_jct = first_run_errors(args.workload, args.cluster, args.profiles, args.policy)
    rows = []
    for (app, dtype, span), values in sorted(ratios.items()):
        p10, median, p90 = np.percentile(values, [10, 50, 90])
        rows.append({"application": app, "device_type": dtype, "span": span,
                     "first_runs": len(values), "median": float(median), "p10": float(p10),
                     "p90": float(p90)})
    table = Table(title=f"{args.policy} on {args.cluster}, {args.workload.name} (avg JCT "
                        f"{avg_jct:.0f} s): predicted / measured step time at a first run")
    for column in ("application", "type", "span", "first runs", "median", "p10", "p90"):
        table.add_column(column, justify="left" if column in ("application", "type", "span")
                         else "right")
    for row in rows:
        table.add_row(row["application"], row["device_type"], row["span"],
                      str(row["first_runs"]), f"{row['median']:.2f}", f"{row['p10']:.2f}",
                      f"{row['p90']:.2f}")
    Console().print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "workload": str(args.workload), "cluster": args.cluster, "policy": args.policy,
        "avg_jct_s": avg_jct, "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
