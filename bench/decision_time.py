"""Time one scheduling decision of each policy at growing scale.

Synthetic jobs are drawn from the real Pollux profiles: each job gets the throughput model
fitted to all measurements of a random application, gradient statistics of a random epoch,
a random age, attained service and progress; a third of them already hold an allocation.

    .venv/bin/python bench/decision_time.py [--policies ...] [--scales 64x160,2048x1000,8192x4000]
        [--repeats 5] [--json out/decision_time.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from environment import describe
from policy_comparison import source_version
from rich.console import Console
from rich.table import Table
from threadpoolctl import threadpool_limits

from shoal.backends.sim.profile import ProfileLibrary
from shoal.core.placement import place
from shoal.core.types import ClusterState, Grant, JobLimits, JobState, JobView, ModelHints
from shoal.perf import GoodputModel, GradStats, fit_perf_params
from shoal.policy import make_policy
from shoal.spec import JobSpec
from shoal.spec.cluster import NodeInfo

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "pollux" / "traces"


def _app_models(lib: ProfileLibrary):
    out = []
    for name in lib.names():
        app = lib.get(name)
        dev = app.devices["t4"]
        keys, vals = [], []
        for pid, (bsz, ys) in dev.by_placement.items():
            counts = [int(c) for c in pid]
            for b, (step, sync) in zip(bsz, ys, strict=True):
                keys.append((len(counts), sum(counts), b))
                vals.append((step, sync))
        k = np.array(keys, dtype=float)
        v = np.array(vals, dtype=float)
        perf = fit_perf_params(k[:, 0], k[:, 1], k[:, 2], v[:, 0] - v[:, 1], v[:, 0])
        limits = JobLimits(app.init_batch_size, app.max_batch_size, app.min_local_bsz,
                           app.max_local_bsz, app.max_batch_size // app.min_local_bsz)
        stats = [app.grad_stats(app.init_batch_size, e) for e in range(app.max_epochs)]
        out.append((name, perf, limits, stats))
    return out


def synthetic(num_devices: int, num_jobs: int, models, seed: int = 0):
    rng = np.random.default_rng(seed)
    nodes = tuple(NodeInfo(i, "t4", 4) for i in range(num_devices // 4))
    cluster = ClusterState(nodes)
    views, grants = [], {}
    for i in range(num_jobs):
        name, perf, limits, stats = models[rng.integers(len(models))]
        sqr, var = stats[rng.integers(len(stats))]
        model = GoodputModel(perf, GradStats(sqr, var), limits.init_batch_size,
                             limits.max_batch_size, limits.min_local_bsz, limits.max_local_bsz)
        profiled = int(rng.choice([0, 1, 2, 4, 8, 16]))
        job = f"{name}-{i}"
        views.append((job, name, model, profiled, limits, rng))
        if profiled and rng.random() < 0.33:
            grants[job] = Grant(min(profiled, 4))
    current = place(grants, cluster, {})
    out = []
    for job, app, model, profiled, limits, rng in views:
        out.append(JobView(
            name=job, spec=JobSpec(name=job, application=app, batch_size=limits.init_batch_size),
            state=JobState.RUNNING if job in current else JobState.PENDING,
            submit_time=0.0, age=float(rng.uniform(60, 20000)),
            attained_service=float(rng.uniform(0, 50000)), num_restarts=int(rng.integers(0, 5)),
            allocation=current.get(job),
            hints=ModelHints({"t4": model} if profiled else {}, {"t4": profiled} if profiled
                             else {}, progress=float(rng.uniform(0, 0.95))),
            limits=limits,
        ))
    return out, cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fifo,tiresias,optimus,pollux,sia,shoal")
    parser.add_argument("--scales", default="64x160,2048x1000,8192x4000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", type=float, default=120.0,
                        help="skip further repeats of a (policy, scale) after this many seconds")
    parser.add_argument("--json", default="out/decision_time.json")
    args = parser.parse_args()
    models = _app_models(ProfileLibrary(DATA))
    rows = []
    table = Table(title="Decision time of one round (ms)")
    for col in ("policy", "devices", "jobs", "median", "p95", "runs"):
        table.add_column(col, justify="right")
    with threadpool_limits(limits=1):
        for scale in args.scales.split(","):
            devices, jobs = (int(x) for x in scale.split("x"))
            views, cluster = synthetic(devices, jobs, models)
            for name in args.policies.split(","):
                times = []
                spent = 0.0
                for _ in range(args.repeats):
                    policy = make_policy(name)
                    start = time.perf_counter()
                    policy.decide(views, cluster, 0.0)
                    elapsed = time.perf_counter() - start
                    times.append(elapsed)
                    spent += elapsed
                    if spent > args.budget:
                        break
                med = 1e3 * statistics.median(times)
                p95 = 1e3 * float(np.percentile(times, 95))
                rows.append({"policy": name, "devices": devices, "jobs": jobs,
                             "median_ms": med, "p95_ms": p95, "runs": len(times)})
                table.add_row(name, str(devices), str(jobs), f"{med:.1f}", f"{p95:.1f}",
                              str(len(times)))
    Console().print(table)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"source_version": source_version(), "environment": describe(),
                               "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
