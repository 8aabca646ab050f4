"""Step time of a plain DDP loop vs the same model under shoal.train, 2 gloo processes.

    .venv/bin/python bench/train_overhead.py [--rounds 10 --steps 20 --width 1024]

Both loops run in the same two processes, interleaved round by round so that load from other
programs hits both alike. The plain loop is the textbook one (DataLoader + DistributedSampler +
DDP); the shoal loop adds the elastic loader, exact batch weighting, the gradient-noise hook,
the per-step control all-reduce and step-time profiling. Prints a table and writes JSON.
Goal: overhead <= 3% of step time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import shoal.train as st

    ctx = st.init(checkpoint_interval_s=None)
    rank, world = ctx.rank, ctx.world_size
    g = torch.Generator().manual_seed(0)
    samples = args.batch_size * args.steps
    data = TensorDataset(
        torch.randn(samples, args.width, generator=g), torch.randint(0, 10, (samples,), generator=g)
    )

    def make_model() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(args.depth):
            layers += [nn.Linear(args.width, args.width), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(args.width, 10))

    plain_model = DistributedDataParallel(make_model())
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=0.01, momentum=0.9)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    plain_loader = DataLoader(data, batch_size=args.batch_size // world, sampler=sampler)

    shoal_model = make_model()
    shoal_opt = torch.optim.SGD(shoal_model.parameters(), lr=0.01, momentum=0.9)
    loader = st.ElasticDataLoader(data, args.batch_size, stats_split_every=0)
    trainer = st.ElasticTrainer(shoal_model, shoal_opt, measure_noise=not args.no_noise)

    def plain_steps(epoch: int):  # type: ignore[no-untyped-def]
        sampler.set_epoch(epoch)
        for x, y in plain_loader:
            plain_opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(plain_model(x), y).backward()
            plain_opt.step()
            yield

    def shoal_steps(epoch: int):  # type: ignore[no-untyped-def]
        ctx.epochs.epoch = epoch
        for x, y in loader:
            trainer.backward(nn.functional.cross_entropy(trainer.model(x), y))
            if trainer.step():
                yield

    def timed(steps) -> float:  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        next(steps, None)
        return time.perf_counter() - start

    plain: list[float] = []
    shoal: list[float] = []
    # Alternate single steps so that changing load from other programs hits both loops alike.
    for r in range(args.rounds + 1):
        p_iter, s_iter = plain_steps(r), shoal_steps(r)
        for step in range(args.steps):
            first, second = (p_iter, s_iter) if step % 2 else (s_iter, p_iter)
            t_first, t_second = timed(first), timed(second)
            t_plain, t_shoal = (t_first, t_second) if step % 2 else (t_second, t_first)
            if r > 0:  # round 0 warms up
                plain.append(t_plain)
                shoal.append(t_shoal)
        for it in (p_iter, s_iter):
            for _ in it:
                pass
    dist.barrier()
    if rank == 0:
        stats = trainer.grad_stats
        result = {
            "plain_step_s": statistics.median(plain),
            "shoal_step_s": statistics.median(shoal),
            "plain_mean_s": statistics.fmean(plain),
            "shoal_mean_s": statistics.fmean(shoal),
            "steps_timed": len(plain),
            "noise_measured": stats is not None,
        }
        Path(args.result).write_text(json.dumps(result))
    st.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20, help="steps per round (one epoch)")
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--no-noise", action="store_true", help="shoal without noise scale")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", default=str(REPO / "out" / "bench" / "train_overhead.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result_path = out.with_suffix(".worker.json")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    forwarded = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items()
                 if key not in ("worker", "result", "out", "no_noise")]
    forwarded += ["--no-noise"] if args.no_noise else []
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": str(args.threads),
            "PYTHONPATH": str(REPO),
        }
        for var in ("SHOAL_CHECKPOINT_DIR", "SHOAL_SCHEDULER_URL", "SHOAL_BATCH_SIZE"):
            env.pop(var, None)
        cmd = [sys.executable, __file__, "--worker", "--result", str(result_path), *forwarded]
        procs.append(subprocess.Popen(cmd, env=env))
    if any(p.wait() != 0 for p in procs):
        sys.exit("a worker failed")
    result = json.loads(result_path.read_text())
    result_path.unlink()
    ratio = result["shoal_step_s"] / result["plain_step_s"]
    report = {
        "benchmark": "train_overhead",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "config": {k: v for k, v in vars(args).items() if k not in ("worker", "result", "out")},
        **result,
        "ratio": ratio,
        "overhead_pct": 100 * (ratio - 1),
        "goal_overhead_pct": 3.0,
    }
    out.write_text(json.dumps(report, indent=2))
    print(f"{'loop':<12}{'median step (ms)':>18}")
    print(f"{'plain DDP':<12}{1000 * result['plain_step_s']:>18.2f}")
    print(f"{'shoal.train':<12}{1000 * result['shoal_step_s']:>18.2f}")
    print(f"ratio {ratio:.3f}  (overhead {report['overhead_pct']:+.1f}%, goal <= 3%)  -> {out}")


if __name__ == "__main__":
    main()
