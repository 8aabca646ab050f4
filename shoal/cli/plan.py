"""``shoal plan``: the best parallel plans for a model on a set of devices."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from typing import Any

import click
from rich.table import Table

from shoal.cli.console import output_console
from shoal.perf.catalog import model_names, parse_model
from shoal.perf.parallel import (
    GIB,
    KNOWN_DEVICES,
    PlanSearchResult,
    known_device,
    search_module_plans,
    search_plans,
)
from shoal.spec.errors import SpecError


def parse_devices(text: str) -> tuple[int, str]:
    """``8xa100-80g`` -> (8, "a100-80g")."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*([A-Za-z0-9_.-]+)\s*", text)
    if not match or int(match.group(1)) < 1:
        raise SpecError(
            f"expected COUNTxTYPE such as 8xa100-80g, got {text!r}; "
            f"types: {', '.join(sorted(KNOWN_DEVICES))}",
            field="devices",
        )
    known_device(match.group(2))
    return int(match.group(1)), match.group(2).lower()


def load_factory(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(f"expected pkg.mod:factory, got {spec!r}", field="module")
    # As `python -m` does, modules in the current directory are importable (the console script
    # alone would not put it on the path).
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"cannot import {module_name!r}: {exc}", field="module") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SpecError(f"{module_name!r} has no attribute {attr!r}", field="module") from None


def _module_result(spec: str, count: int, device_name: str, per_node: int,
                   global_batch: int) -> PlanSearchResult:
    from shoal.perf.measure import measure_training_step

    factory = load_factory(spec)
    made: dict[str, Any] = {}

    def build() -> Any:
        built = factory()
        if not (isinstance(built, tuple) and len(built) == 2 and callable(built[1])):
            raise SpecError("the factory must return (module, make_inputs) where "
                            "make_inputs(batch_size) gives the module's input tensors",
                            field="module")
        made["inputs"] = built[1]
        return built[0]

    measured = measure_training_step(build, lambda b: made["inputs"](b), micro_batch=1)
    return search_module_plans(measured, known_device(device_name), count, per_node,
                               global_batch)


def _table(result: PlanSearchResult, top: int, title: str) -> Table:
    table = Table(title=title)
    for column in ("#", "dp", "tp", "pp", "v", "micro", "accum", "recompute", "zero",
                   "offload", "memory GiB", "step s", "samples/s"):
        table.add_column(column, justify="right")
    for rank, plan in enumerate(result.plans[:top], start=1):
        row = plan.to_dict()
        recompute = row["recompute"]
        if recompute == "full" and row["recompute_fraction"] < 1:
            recompute = f"full {row['recompute_fraction']:.0%}"
        table.add_row(str(rank), str(row["dp"]), str(row["tp"]), str(row["pp"]),
                      str(row["virtual_stages"]), str(row["micro_batch"]),
                      str(row["accumulation"]), recompute, str(row["zero_stage"]),
                      "yes" if row["offload"] else "no", f"{plan.memory_bytes / GIB:.1f}",
                      f"{plan.step_time_s:.3f}", f"{plan.throughput:.1f}")
    return table


@click.command("plan")
@click.option("--model", "model_spec",
              help="a named model (" + ", ".join(model_names()) + "), optionally with "
                   "overrides such as llama-7b:seq=4096, or "
                   "gpt:layers=..,hidden=..,heads=..,seq=..,vocab=..")
@click.option("--module", "module_spec",
              help="pkg.mod:factory returning (module, make_inputs); measured under "
                   "FakeTensorMode, planned with data parallelism, ZeRO and offload only")
@click.option("--devices", required=True, help="COUNTxTYPE, e.g. 8xa100-80g")
@click.option("--devices-per-node", type=int, default=None,
              help="devices in one node (default: min(COUNT, 8))")
@click.option("--global-batch", type=int, required=True, help="samples per optimizer step")
@click.option("--top", type=int, default=10, show_default=True, help="plans to show")
@click.option("--json", "json_out", default=None,
              help="write {'plans': [...]} to OUT ('-': stdout)")
def plan_command(model_spec: str | None, module_spec: str | None, devices: str,
                 devices_per_node: int | None, global_batch: int, top: int,
                 json_out: str | None) -> None:
    """Rank parallel plans (dp/tp/pp, micro-batching, recompute, ZeRO, offload) that fit memory."""
    try:
        if (model_spec is None) == (module_spec is None):
            raise SpecError("give exactly one of --model and --module", field="model")
        if global_batch < 1:
            raise SpecError(f"must be >= 1, got {global_batch}", field="global_batch")
        count, device_name = parse_devices(devices)
        per_node = devices_per_node or min(count, 8)
        if per_node < 1 or (count % per_node and count > per_node):
            raise SpecError(f"{count} devices do not fill nodes of {per_node}",
                            field="devices_per_node")
        if model_spec is not None:
            model = parse_model(model_spec)
            result = search_plans(model, known_device(device_name), count, per_node,
                                  global_batch)
            title = (f"{model.num_parameters() / 1e9:.2f}B-parameter GPT on {count} x "
                     f"{device_name}, global batch {global_batch}")
        else:
            assert module_spec is not None
            result = _module_result(module_spec, count, device_name, per_node, global_batch)
            title = f"{module_spec} on {count} x {device_name}, global batch {global_batch}"
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc

    payload = {"plans": [p.to_dict() for p in result.plans],
               "considered": result.considered, "search_seconds": result.seconds}
    if json_out == "-":
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    if json_out:
        with open(json_out, "w") as handle:
            json.dump(payload, handle, indent=2)
    console = output_console()
    if not result.plans:
        console.print(f"[red]no plan fits[/red] ({len(result.rejected)} rejected); e.g.:")
        for rejection in result.rejected[:5]:
            console.print(f"  {rejection.describe()}")
        raise SystemExit(1)
    console.print(_table(result, top, title))
    console.print(f"{len(result.plans)} plans fit, {len(result.rejected)} rejected, "
                  f"searched in {result.seconds:.2f} s")
