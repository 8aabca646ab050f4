"""Plan-search timings and choices for published Megatron GPT configurations.

Run: .venv/bin/python bench/plan_search.py [--out bench/results/plan_search.json]
Prints a table and writes JSON. Each search is timed as the best of 3 runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shoal.perf.models import MEGATRON_GPT_TABLE, megatron_gpt
from shoal.perf.parallel import GIB, MEGATRON_2021, SearchSpace, known_device, search_plans

# Narayanan et al. 2021 report 502 PFLOP/s on 3072 A100s for the 1T model (163 TFLOP/s/GPU).
PUBLISHED_1T_TFLOPS_PER_GPU = 163.0


def run(space_name: str, space: SearchSpace, billions: float, repeats: int = 3) -> dict:
    row = next(r for r in MEGATRON_GPT_TABLE if r[0] == billions)
    _, _, _, _, tp, pp, gpus, batch = row
    model = megatron_gpt(billions)
    device = known_device("a100-80g")
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = search_plans(model, device, gpus, 8, batch, space)
        seconds.append(time.perf_counter() - started)
    best = result.best
    out = {"model_b": billions, "space": space_name, "gpus": gpus, "global_batch": batch,
           "published_tp": tp, "published_pp": pp, "search_s": min(seconds),
           "considered": result.considered, "fitting": len(result.plans),
           "rejected": len(result.rejected)}
    if best is not None:
        flops = batch * model.training_flops(
            1, best.config.recompute_fraction if best.config.recompute == "full" else 0.0)
        out.update(best.to_dict())
        out["smallest_fitting_mp"] = min(p.model_parallel_size for p in result.plans)
        out["predicted_tflops_per_gpu"] = flops / best.step_time_s / gpus / 1e12
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="bench/results/plan_search.json")
    args = parser.parse_args()
    rows = []
    for billions in (1.7, 18.4, 145.6, 529.6, 1008.0):
        for name, space in (("megatron-2021", MEGATRON_2021), ("full", SearchSpace())):
            rows.append(run(name, space, billions))
    table = Table(title="plan search on A100-80GB (8 per node), Megatron GPT configurations")
    for col in ("model", "space", "GPUs", "search s", "considered", "published tp x pp",
                "chosen dp/tp/pp/v", "min fitting tp*pp", "recompute", "zero", "GiB",
                "TFLOP/s/GPU"):
        table.add_column(col, justify="right")
    for r in rows:
        chosen = (f"{r['dp']}/{r['tp']}/{r['pp']}/{r['virtual_stages']}" if "dp" in r
                  else "none fits")
        table.add_row(f"{r['model_b']}B", r["space"], str(r["gpus"]), f"{r['search_s']:.3f}",
                      str(r["considered"]), f"{r['published_tp']} x {r['published_pp']}",
                      chosen, str(r.get("smallest_fitting_mp", "-")), str(r.get("recompute")),
                      str(r.get("zero_stage")), f"{r.get('memory_bytes', 0) / GIB:.1f}",
                      f"{r.get('predicted_tflops_per_gpu', 0):.0f}")
    Console().print(table)
    print(f"published 1T throughput: {PUBLISHED_1T_TFLOPS_PER_GPU} TFLOP/s per GPU")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows,
                               "published_1t_tflops_per_gpu": PUBLISHED_1T_TFLOPS_PER_GPU},
                              indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
