"""Resize time of the example jobs: seconds from the resize signal to the first step at the new
size, through the local backend's own start/stop code (SIGTERM -> checkpoint -> exit 3 ->
restart with the new world size).

    .venv/bin/python bench/resize_time.py [--jobs examples/mlp_digits/job.yaml ...]

The first completed optimizer step of every process is recorded by a ``sitecustomize`` hook
on ``ElasticTrainer.step`` (the library is not modified). Prints a table and writes
out/bench/resize_time.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
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
from shoal.spec.job import load_job_yaml  # noqa: E402

HOOK = '''
import json, os, time
try:
    from shoal.train import trainer as _t
except Exception:
    _t = None
if _t is not None:
    _step = _t.ElasticTrainer.step
    _seen = []
    def step(self, *a, **k):
        done = _step(self, *a, **k)
        if done and not _seen:
            _seen.append(1)
            with open(os.environ["BENCH_FIRST_STEPS"], "a") as f:
                f.write(json.dumps({"t": time.time(), "ws": self._ctx.world_size,
                                    "rank": self._ctx.rank}) + "\\n")
        return done
    _t.ElasticTrainer.step = step
'''


def _first_steps(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_first_step(job: LocalJob, path: Path, world: int, after: float, timeout: float) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job.tick(time.time())
        if job.phase in (Phase.FAILED, Phase.FINISHED):
            raise RuntimeError(f"{job.name} ended ({job.phase}: {job.failed_reason})")
        hits = [s["t"] for s in _first_steps(path) if s["ws"] == world and s["t"] > after]
        if len(hits) >= world:
            return max(hits)
        time.sleep(0.05)
    raise TimeoutError(f"{job.name}: no step at world size {world} within {timeout} s")


def measure(job_file: Path, workdir: Path, sizes: list[int], timeout: float) -> dict:
    spec = load_job_yaml(job_file.read_text(), source=str(job_file))
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as scratch:
        home = Path(scratch)
        hook_dir = home / "hook"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(HOOK)
        steps_file = home / "first_steps.jsonl"
        import os

        os.environ["BENCH_FIRST_STEPS"] = str(steps_file)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(hook_dir), str(REPO)])
        settings = RunSettings(home=home, pool=DevicePool("cpu", max(sizes), 1),
                               checkpoint_interval_s=3600.0)
        limits = JobLimits(spec.batch_size or 1, spec.batch_size or 1, 1, spec.batch_size or 1,
                           max(sizes))
        job = LocalJob(spec, workdir, limits, settings, JobModel("cpu", spec.target_epochs))
        job.set_target(Allocation("cpu", (0,) * sizes[0]), None)
        started = time.time()
        _wait_first_step(job, steps_file, sizes[0], started, timeout)
        cold = time.time() - started
        resizes = []
        for old, new in itertools.pairwise(sizes):
            time.sleep(2.0)  # let it train a little at this size
            signal_at = time.time()
            job.set_target(Allocation("cpu", (0,) * new), None)
            first = _wait_first_step(job, steps_file, new, signal_at, timeout)
            resizes.append({"from": old, "to": new, "seconds": first - signal_at})
        job.cancel()
        deadline = time.time() + 60
        while not job.terminal and time.time() < deadline:
            job.tick(time.time())
            time.sleep(0.1)
        return {"job": spec.name, "cold_start_s": cold, "resizes": resizes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="*", type=Path,
                        default=sorted((REPO / "examples").glob("*/job.yaml")))
    parser.add_argument("--sizes", default="1,2,1", help="world sizes in turn")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=REPO / "out" / "bench" / "resize_time.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    print(f"{'job':<20} {'cold start s':>12} " + " ".join(
        f"{a}->{b} s".rjust(9) for a, b in itertools.pairwise(sizes)))
    for job_file in args.jobs:
        result = measure(job_file, REPO, sizes, args.timeout)
        results.append(result)
        print(f"{result['job']:<20} {result['cold_start_s']:>12.1f} " + " ".join(
            f"{r['seconds']:>9.1f}" for r in result["resizes"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sizes": sizes, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
