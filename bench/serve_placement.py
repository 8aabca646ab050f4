"""Serving placement on the Azure `code` trace: shoal (AlpaServe-style model-parallel greedy
plus shoal's refinement moves) against selective replication and periodic re-placement, swept
over cluster size, SLO scale and arrival burstiness. Prints tables, writes JSON and PNG plots.

    .venv/bin/python bench/serve_placement.py            # 5 minutes of trace (~9 min, 2 cores)
    .venv/bin/python bench/serve_placement.py --devices 40,44,48,52,56 --sweeps devices
    .venv/bin/python bench/serve_placement.py --seed 1 --devices 44,48,52,56 --sweeps devices \
        --out bench/results/serve_placement_seed1.json --plots /tmp/plots
    .venv/bin/python bench/serve_placement.py --long     # 15 minutes of trace
    .venv/bin/python bench/serve_placement.py --quick    # smaller sweep

The device sweep also runs two ablations, so the gain can be attributed: shoal's search
without the refinement moves (``shoal-greedy-only``, AlpaServe's greedy) and selective
replication with them (``selective-replication+refine``). It reports, per policy, the smallest
cluster on the grid where SLO attainment reaches 99% and the devices the placement used there.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shoal.serve.evaluate import ServeSimConfig, build_problem, run_policy
from shoal.serve.placement import (
    PlacementChoice,
    PlacementProblem,
    alpaserve_place,
    selective_replication,
)
from shoal.serve.plots import plot_sweep

POLICIES = ("shoal", "selective-replication", "periodic")
ABLATIONS: dict[str, Callable[[PlacementProblem, ServeSimConfig], PlacementChoice]] = {
    "shoal-greedy-only": lambda p, c: alpaserve_place(
        p, screen_keep_every=c.screen_keep_every, refine=False),
    "selective-replication+refine": lambda p, c: selective_replication(p, refine=True),
}
TARGET = 0.99
BASE = ServeSimConfig(trace="code", models=8, devices="v100:32", slo_scale=5.0, rate_scale=2.0,
                      duration_s=900.0, mix=("opt-6.7b",), max_batch=4, seed=0,
                      period_s=60.0, screen_keep_every=4)


def run_point(config: ServeSimConfig, ablations: bool) -> dict[str, dict]:
    out = {}
    for policy in POLICIES:
        res = run_policy(policy, build_problem(config), config)
        out[policy] = {"summary": res["summary"], "parallel": res.get("parallel"),
                       "search_seconds": res["search_seconds"],
                       "simulations": res.get("simulations")}
    if ablations:
        for name, place in ABLATIONS.items():
            problem = build_problem(config)
            started = time.perf_counter()
            choice = place(problem, config)
            out[name] = {"summary": {"slo_attainment": choice.attainment,
                                     "devices": choice.devices},
                         "parallel": {"group_size": choice.group_size, "pp": choice.pp,
                                      "tp": choice.tp},
                         "search_seconds": time.perf_counter() - started,
                         "simulations": problem.simulations}
    return out


def sweep(name: str, values: list, make, console: Console, ablations: bool = False) -> dict:
    names = list(POLICIES) + (list(ABLATIONS) if ablations else [])
    table = Table(title=f"SLO attainment (%) vs {name}")
    table.add_column(name)
    for policy in names:
        table.add_column(policy)
    table.add_column("shoal split (size,pp,tp)")
    points = []
    for value in values:
        started = time.perf_counter()
        results = run_point(make(value), ablations)
        points.append({"value": value, "results": results})
        split = results["shoal"]["parallel"]
        table.add_row(str(value), *(_cell(results[p]["summary"], name, value) for p in names),
                      f"{split['group_size']},{split['pp']},{split['tp']}")
        console.print(f"  {name}={value}: {time.perf_counter() - started:.0f} s")
    console.print(table)
    return {"name": name, "points": points}


def _cell(summary: dict, name: str, value: float) -> str:
    text = f"{100 * summary['slo_attainment']:.2f}"
    if name == "devices" and summary["devices"] < value:
        text += f" ({summary['devices']} used)"
    return text


def crossings(devices_sweep: dict) -> dict[str, dict | None]:
    """Per policy: the smallest cluster on the grid with attainment >= TARGET (and the devices
    its placement used), None if no grid point reaches it."""
    out: dict[str, dict | None] = {}
    names = devices_sweep["points"][0]["results"].keys()
    for policy in names:
        out[policy] = None
        for point in devices_sweep["points"]:
            summary = point["results"][policy]["summary"]
            if summary["slo_attainment"] >= TARGET:
                out[policy] = {"cluster": point["value"], "devices_used": summary["devices"],
                               "slo_attainment": summary["slo_attainment"]}
                break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--long", action="store_true")
    parser.add_argument("--devices", default=None,
                        help="comma-separated cluster sizes of the device sweep (V100s)")
    parser.add_argument("--sweeps", default="devices,slo_scale,cv",
                        help="which sweeps to run (devices, slo_scale, cv)")
    parser.add_argument("--seed", type=int, default=BASE.seed,
                        help="seed of the model popularity assignment (and Gamma re-timing)")
    parser.add_argument("--out", default="bench/results/serve_placement.json")
    parser.add_argument("--plots", default="docs/serving")
    parser.add_argument("--replot", action="store_true",
                        help="only redraw the plots from the JSON at --out")
    args = parser.parse_args()
    console = Console()
    if args.replot:
        write_plots(json.loads(Path(args.out).read_text()), Path(args.plots))
        return
    if args.devices:
        devices = [int(d) for d in args.devices.split(",") if d.strip()]
    else:
        devices = [16, 32, 48] if args.quick else [16, 24, 32, 40, 44, 48, 52, 56, 64]
    slo_scales = [2.5, 10.0] if args.quick else [2.5, 5.0, 10.0, 20.0]
    cvs = [1.0, 8.0] if args.quick else [1.0, 4.0, 8.0]
    wanted = {s.strip() for s in args.sweeps.split(",") if s.strip()}
    base = replace(BASE if args.long else replace(BASE, duration_s=300.0), seed=args.seed)
    report: dict = {"base": {**base.__dict__, "mix": list(base.mix)}, "target": TARGET,
                    "sweeps": []}
    started = time.perf_counter()
    if "devices" in wanted:
        devices_sweep = sweep("devices", devices,
                              lambda d: replace(base, devices=f"v100:{d}"), console,
                              ablations=True)
        report["sweeps"].append(devices_sweep)
        report["reaches_target"] = crossings(devices_sweep)
        table = Table(title=f"smallest cluster on the grid with SLO attainment >= {TARGET:.0%}")
        for column in ("policy", "cluster", "devices used", "attainment"):
            table.add_column(column)
        for policy, hit in report["reaches_target"].items():
            table.add_row(policy, *(("-", "-", "not reached") if hit is None else (
                str(hit["cluster"]), str(hit["devices_used"]),
                f"{100 * hit['slo_attainment']:.2f}")))
        console.print(table)
    if "slo_scale" in wanted:
        report["sweeps"].append(sweep("slo_scale", slo_scales,
                                      lambda s: replace(base, slo_scale=s), console))
    if "cv" in wanted:
        report["sweeps"].append(sweep("cv", cvs, lambda c: replace(base, cv=c), console))
    report["wall_seconds"] = time.perf_counter() - started
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    write_plots(report, Path(args.plots))
    console.print(f"wrote {args.out} and plots in {args.plots}/ "
                  f"({report['wall_seconds']:.0f} s)")


def write_plots(report: dict, plots: Path) -> None:
    plots.mkdir(parents=True, exist_ok=True)
    labels = {"devices": "devices (V100)", "slo_scale": "SLO scale", "cv": "CV of inter-arrivals"}
    for sw in report["sweeps"]:
        x = [p["value"] for p in sw["points"]]
        series = {pol: [p["results"][pol]["summary"]["slo_attainment"] for p in sw["points"]]
                  for pol in POLICIES}
        plot_sweep(x, series, labels[sw["name"]], plots / f"attainment_vs_{sw['name']}.png")
        if sw["name"] == "devices":
            plot_devices_zoom(sw, plots / "attainment_vs_devices_zoom.png")


def plot_devices_zoom(sw: dict, out: Path, from_devices: int = 40) -> None:
    """The device sweep from ``from_devices`` on, with the ablations dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in sw["points"] if p["value"] >= from_devices] or sw["points"]
    x = [p["value"] for p in points]
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, name in enumerate(points[0]["results"]):
        if name == "periodic":
            continue
        y = [100 * p["results"][name]["summary"]["slo_attainment"] for p in points]
        dashed = name in ABLATIONS
        ax.plot(x, y, marker="x" if dashed else "o", linestyle="--" if dashed else "-",
                color=f"C{k}", label=name)
    ax.axhline(100 * TARGET, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("devices (V100)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title("near 99% (dotted), ablations dashed")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
