"""``python -m shoal.service``: run the scheduler service in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import uvicorn

from shoal.service.app import create_app
from shoal.service.config import ServiceConfig, info_path, shoal_home, write_info
from shoal.service.runner import Runner


def parse_args(argv: list[str]) -> ServiceConfig:
    parser = argparse.ArgumentParser(prog="python -m shoal.service")
    parser.add_argument("--home", default=None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db-url", default=None)
    parser.add_argument("--policy", default="pollux")
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--cores-per-slot", type=int, default=None)
    parser.add_argument("--slot-memory-gb", type=float, default=None)
    parser.add_argument("--max-retries", type=int, default=3)
    parser.add_argument("--backoff", type=float, default=2.0)
    parser.add_argument("--checkpoint-interval", type=float, default=30.0)
    parser.add_argument("--restart-delay", type=float, default=10.0)
    parser.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE",
                        help="change a knob of the shoal policy (repeatable)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--backend", choices=["local", "ray"], default="local")
    parser.add_argument("--address", default=None)
    parser.add_argument("--checkpoint-dir", default=None)
    args = parser.parse_args(argv)
    return ServiceConfig(
        home=shoal_home(args.home),
        port=args.port,
        db_url=args.db_url,
        policy=args.policy,
        interval_s=args.interval,
        device=args.device,
        slots=args.slots,
        cores_per_slot=args.cores_per_slot,
        slot_memory_gb=args.slot_memory_gb,
        max_retries=args.max_retries,
        backoff_s=args.backoff,
        checkpoint_interval_s=args.checkpoint_interval,
        restart_delay_s=args.restart_delay,
        knobs=tuple(args.knob),
        host=args.host,
        backend=args.backend,
        ray_address=args.address,
        checkpoint_dir=Path(args.checkpoint_dir).expanduser().resolve()
        if args.checkpoint_dir else None,
    )


def serve(config: ServiceConfig) -> None:
    config.home.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    runner = Runner(config)
    server = uvicorn.Server(
        uvicorn.Config(create_app(runner), host=config.host, port=config.port,
                       log_level="warning", access_log=False)
    )
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        server.should_exit = True

    # uvicorn installs its own handlers inside run(); ours wrap the stop in a checkpoint.
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.start()
    write_info(config, os.getpid())
    try:
        server.run()
    finally:
        runner.shutdown()
        info_path(config.home).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    serve(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
