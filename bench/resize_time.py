"""Resize time of the example jobs through the local backend's own start/stop code.

For each job: start it on the first world size, let it train, then ask for each next size in
turn (``LocalJob.set_target``, as the service does) and time

* ``signal``: from the stop signal (SIGTERM to the running replicas) to the first completed
  step at the new size -- the resize goal (<= 5 s) is about this one;
* ``downtime``: from the last step at the old size to the first step at the new one (the time
  the job does not train);
* ``decision``: from ``set_target`` to the first step at the new size (with pre-warming this
  includes the new replicas' start-up, during which the old ones keep training).

    .venv/bin/python bench/resize_time.py [--jobs examples/mlp_digits/job.yaml ...] \
        [--sizes 1,2,1] [--no-prewarm]

Step times of every process are recorded by a ``sitecustomize`` hook on
``ElasticTrainer.step`` (the library is not modified). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shoal.backends.local.devices import DevicePool  # noqa: E402
from shoal.backends.local.job import LocalJob, Phase, RunSettings  # noqa: E402
from shoal.backends.local.model import JobModel  # noqa: E402
from shoal.core.types import Allocation, JobLimits  # noqa: E402
from shoal.demo import profiled_examples, scale_epochs  # noqa: E402
from shoal.spec.job import load_job_yaml  # noqa: E402

HOOK = '''
import json, os, time
try:
    from shoal.train import trainer as _t
except Exception:
    _t = None
if _t is not None:
    _step = _t.ElasticTrainer.step
    _out = open(os.environ["BENCH_STEPS"], "a", buffering=1)
    def step(self, *a, **k):
        done = _step(self, *a, **k)
        if done:
            _out.write(json.dumps({"t": time.time(), "ws": self._ctx.world_size,
                                   "rank": self._ctx.rank, "pid": os.getpid()}) + "\\n")
        return done
    _t.ElasticTrainer.step = step
'''


def _steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def _run_until_first_step(job: LocalJob, path: Path, world: int, after: float,
                          timeout: float) -> tuple[float, float | None]:
    """Tick the job until every rank of the new size stepped; (first step, stop signal)."""
    deadline = time.time() + timeout
    stop_signal = None
    while time.time() < deadline:
        job.tick(time.time())
        if stop_signal is None and job.phase == Phase.STOPPING:
            stop_signal = time.time()
        if job.phase in (Phase.FAILED, Phase.FINISHED):
            raise RuntimeError(f"{job.name} ended ({job.phase}: {job.failed_reason})")
        firsts: dict[int, float] = {}
        for s in _steps(path):
            if s["ws"] == world and s["t"] > after:
                firsts.setdefault(s["pid"], s["t"])
        if len(firsts) >= world:
            return max(firsts.values()), stop_signal
        time.sleep(0.02)
    raise TimeoutError(f"{job.name}: no step at world size {world} within {timeout} s")


def measure(job_file: Path, workdir: Path, sizes: list[int], timeout: float,
            prewarm: bool) -> dict:
    # The small examples finish within seconds on a fast machine: train them long enough to
    # still be training after the resizes.
    spec = load_job_yaml(scale_epochs(job_file.read_text(), 20), source=str(job_file))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as scratch:
        home = Path(scratch)
        hook_dir = home / "hook"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(HOOK)
        steps_file = home / "steps.jsonl"
        os.environ["BENCH_STEPS"] = str(steps_file)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(hook_dir), str(REPO)])
        settings = RunSettings(home=home, pool=DevicePool("cpu", max(sizes), 1),
                               checkpoint_interval_s=3600.0, prewarm=prewarm)
        batch = spec.batch_size or 1
        limits = JobLimits(batch, batch, 1, batch, max(sizes))
        job = LocalJob(spec, workdir, limits, settings, JobModel("cpu", spec.target_epochs))
        job.set_target(Allocation("cpu", (0,) * sizes[0]), None)
        started = time.time()
        first, _ = _run_until_first_step(job, steps_file, sizes[0], started, timeout)
        cold = first - started
        resizes = []
        for old, new in itertools.pairwise(sizes):
            settle = time.time() + 3.0  # let it train a little at this size
            while time.time() < settle:
                job.tick(time.time())
                time.sleep(0.05)
            decided = time.time()
            job.set_target(Allocation("cpu", (0,) * new), None)
            first, stop_signal = _run_until_first_step(job, steps_file, new, decided, timeout)
            last_old = max(s["t"] for s in _steps(steps_file) if s["ws"] == old and s["t"] < first)
            resizes.append({
                "from": old, "to": new,
                "decision_s": first - decided,
                "signal_s": first - (stop_signal or decided),
                "downtime_s": first - last_old,
            })
        job.cancel()
        deadline = time.time() + 60
        while not job.terminal and time.time() < deadline:
            job.tick(time.time())
            time.sleep(0.1)
        return {"job": spec.name, "cold_start_s": cold, "resizes": resizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="*", type=Path,
                        default=profiled_examples())
    parser.add_argument("--sizes", default="1,2,1", help="world sizes in turn")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--no-prewarm", action="store_true",
                        help="resize by stop and cold start (no pre-warmed replicas)")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "bench" / "resize_time.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    pairs = list(itertools.pairwise(sizes))
    header = " ".join(f"{a}->{b} sig/down/dec s".rjust(22) for a, b in pairs)
    print(f"{'job':<18} {'cold start s':>12} {header}")
    for job_file in args.jobs:
        result = measure(job_file, REPO, sizes, args.timeout, prewarm=not args.no_prewarm)
        results.append(result)
        cells = " ".join(
            f"{r['signal_s']:6.1f} {r['downtime_s']:6.1f} {r['decision_s']:6.1f}".rjust(22)
            for r in result["resizes"]
        )
        print(f"{result['job']:<18} {result['cold_start_s']:>12.1f} {cells}", flush=True)
    signal = [r["signal_s"] for res in results for r in res["resizes"]]
    downtime = [r["downtime_s"] for res in results for r in res["resizes"]]
    summary = {
        "median_signal_s": statistics.median(signal),
        "max_signal_s": max(signal),
        "median_downtime_s": statistics.median(downtime),
        "goal_signal_s": 5.0,
    }
    print(f"signal -> first step at the new size: median {summary['median_signal_s']:.1f} s, "
          f"max {summary['max_signal_s']:.1f} s (goal <= 5 s); downtime median "
          f"{summary['median_downtime_s']:.1f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "resize_time",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "prewarm": not args.no_prewarm,
        "sizes": sizes,
        "load_average_1m": os.getloadavg()[0],
        **summary,
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
