"""Heterogeneous profile sets: real T4 profiles scaled by Gavel's measured per-model speeds.

The only per-type measurements at hand are the Pollux T4 profiles (``pollux/traces``) and
Gavel's per-model K80/P100/V100 throughputs (``gavel/simulation_throughputs.json``). This module
derives, for every Pollux application, ``placements-<type>.csv`` / ``scalability-<type>.csv``
for V100 and A100 from them, so that the simulator reads them like real per-type measurements.

Per application and device type ``X`` (speeds relative to the T4):

* compute (``step_time - sync_time``) is divided by ``speed_X``, where
  ``speed_v100 = (V100 / P100 of the mapped Gavel job type) * P100_OVER_T4`` and
  ``speed_a100 = speed_v100 * A100_OVER_V100[model class]``. The Gavel ratio is the geometric
  mean over the job type's measured batch sizes (scale factor 1) of steps/s on V100 over P100;
* ``sync_time`` is multiplied by ``bandwidth_T4 / bandwidth_X`` of the link it crosses (the
  presets' ``intra_node_gbps`` inside one node, ``inter_node_gbps`` across nodes); a
  single-replica row crosses no link, its "sync" is local overhead and scales like compute;
* nodes of ``X`` may hold more devices than a T4 node (8 vs 4 in the presets). Rows for one
  node with 5..8 replicas, and for whole 8-device nodes across 2..16 nodes, are extrapolated
  from the T4 measurements with the throughput model's own form ``a + b * max(K - 2, 0)``
  (least squares per local batch size, slope kept >= 0) for both compute and sync, then
  scaled as above.

The T4 files and the ``validation-*.csv`` files are copied unchanged. Run
``python -m shoal.data.hetero_profiles --out DIR`` (see docs/heterogeneity.md).
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import math
import shutil
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.spec.cluster import DeviceType, load_cluster

APPLICATIONS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
BASE_TYPE = "t4"
TARGET_TYPES = ("v100", "a100")
PRESETS = ("hetero-64", "hetero-256")
GAVEL_FILE = "simulation_throughputs.json"

# Pollux application -> the closest job type Gavel measured (reasons in docs/heterogeneity.md).
GAVEL_JOB_TYPE = {
    "bert": "Transformer",
    "cifar10": "ResNet-18",
    "deepspeech2": "LM",
    "imagenet": "ResNet-50",
    "ncf": "Recommendation",
    "yolov3": "ResNet-50",
}
MODEL_CLASS = {
    "ResNet-18": "cnn",
    "ResNet-50": "cnn",
    "Transformer": "sequence",
    "LM": "sequence",
    "Recommendation": "recommendation",
}
# Gavel has no T4: datasheet FP32 peak of the P100 (PCIe, 9.3 TFLOPS) over the T4 (8.1 TFLOPS).
P100_OVER_T4 = 9.3 / 8.1
# Gavel has no A100. cnn: HBM bandwidth ratio A100-40GB / V100 (1555 / 900 GB/s); sequence:
# midpoint of Lambda's 1.95-2.5x estimate for language-model training with FP16 tensor cores;
# recommendation: 1.0, since Gavel measured this model *slower* on V100 than on P100 (it is
# bound by neither FLOPs nor bandwidth), so a newer generation is assumed not to help either.
A100_OVER_V100 = {"cnn": 1555 / 900, "sequence": 2.2, "recommendation": 1.0}
# Node counts of the extrapolated whole-node rows for types with more devices per node.
WHOLE_NODE_COUNTS = (2, 3, 4, 6, 8, 12, 16)

PLACEMENT_COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
SCALABILITY_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")


@dataclass(frozen=True)
class Row:
    """One measurement: ``nodes`` nodes, ``replicas`` devices, seconds per step and of sync."""

    nodes: int
    replicas: int
    local_bsz: int
    step: float
    sync: float
    placement: str | None = None  # digit string for placements*.csv rows

    @property
    def compute(self) -> float:
        return self.step - self.sync


# ----- Gavel speeds -----
def gavel_ratio(throughputs: dict, job_type: str, fast: str, slow: str) -> float:
    """Geometric mean over ``job_type``'s batch sizes of steps/s on ``fast`` over ``slow``."""
    logs = []
    for key, entry in throughputs[fast].items():
        name, scale = ast.literal_eval(key)
        if scale != 1 or name.split(" (batch size")[0] != job_type:
            continue
        a, b = entry["null"], throughputs[slow][key]["null"]
        if a > 0 and b > 0:
            logs.append(math.log(a / b))
    if not logs:
        raise ValueError(f"Gavel has no {fast}/{slow} measurements of job type '{job_type}'")
    return math.exp(sum(logs) / len(logs))


@dataclass(frozen=True)
class AppSpeed:
    application: str
    gavel_job_type: str
    model_class: str
    v100_over_p100: float
    speed: dict[str, float]  # device type -> compute speed relative to the T4


def app_speeds(gavel_dir: Path, gavel_file: str = GAVEL_FILE) -> dict[str, AppSpeed]:
    throughputs = json.loads((gavel_dir / gavel_file).read_text())
    out = {}
    for app in APPLICATIONS:
        job_type = GAVEL_JOB_TYPE[app]
        cls = MODEL_CLASS[job_type]
        ratio = gavel_ratio(throughputs, job_type, "v100", "p100")
        v100 = ratio * P100_OVER_T4
        speed = {BASE_TYPE: 1.0, "v100": v100, "a100": v100 * A100_OVER_V100[cls]}
        out[app] = AppSpeed(app, job_type, cls, ratio, speed)
    return out


# ----- device types from the presets -----
def preset_device_types(presets: Sequence[str] = PRESETS) -> tuple[dict[str, DeviceType],
                                                                     dict[str, int]]:
    """Link bandwidths per device type and the most devices per node any preset gives it."""
    types: dict[str, DeviceType] = {}
    per_node: dict[str, int] = {}
    for name in presets:
        cluster = load_cluster(name)
        for dtype in cluster.device_types:
            if dtype.name in types and types[dtype.name] != dtype:
                raise ValueError(f"presets disagree on device type '{dtype.name}'")
            types[dtype.name] = dtype
        for group in cluster.nodes:
            per_node[group.device_type] = max(per_node.get(group.device_type, 0),
                                              group.devices_per_node)
    return types, per_node


# ----- reading and scaling rows -----
def _read(path: Path, columns: Iterable[str]) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    missing = set(columns) - set(rows[0] if rows else {})
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return rows


def read_placements(path: Path) -> list[Row]:
    return [
        Row(len(r["placement"]), sum(map(int, r["placement"])), int(r["local_bsz"]),
            float(r["step_time"]), float(r["sync_time"]), r["placement"])
        for r in _read(path, PLACEMENT_COLUMNS)
    ]


def read_scalability(path: Path) -> list[Row]:
    return [
        Row(int(r["num_nodes"]), int(r["num_replicas"]), int(r["local_bsz"]),
            float(r["step_time"]), float(r["sync_time"]))
        for r in _read(path, SCALABILITY_COLUMNS)
    ]


def scale_row(row: Row, speed: float, base: DeviceType, target: DeviceType) -> Row:
    """The row on ``target``: compute / speed, sync scaled by the bandwidth of its link."""
    if row.replicas == 1:
        sync = row.sync / speed
    elif row.nodes == 1:
        sync = row.sync * base.intra_node_gbps / target.intra_node_gbps
    else:
        sync = row.sync * base.inter_node_gbps / target.inter_node_gbps
    return Row(row.nodes, row.replicas, row.local_bsz, row.compute / speed + sync, sync,
               row.placement)


def fit_linear(replicas: Sequence[int], values: Sequence[float]) -> tuple[float, float]:
    """Least squares ``values ~ a + b * max(K - 2, 0)`` with ``b >= 0``."""
    x = np.maximum(np.asarray(replicas, dtype=float) - 2, 0)
    y = np.asarray(values, dtype=float)
    if np.ptp(x) == 0:
        return float(y.mean()), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:
        return float(y.mean()), 0.0
    return float(intercept), float(slope)


def _extrapolate(rows: Sequence[Row], targets: Sequence[tuple[int, int]],
                 placement_of: dict[int, str] | None) -> list[Row]:
    """Rows at each (nodes, replicas) in ``targets`` from a per-batch fit of ``rows``."""
    by_bsz: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        by_bsz[row.local_bsz].append(row)
    out = []
    for nodes, replicas in targets:
        for bsz in sorted(by_bsz):
            group = by_bsz[bsz]
            if len({r.replicas for r in group}) < 2:
                continue
            ks = [r.replicas for r in group]
            a_c, b_c = fit_linear(ks, [r.compute for r in group])
            a_s, b_s = fit_linear(ks, [r.sync for r in group])
            sync = a_s + b_s * max(replicas - 2, 0)
            compute = a_c + b_c * max(replicas - 2, 0)
            placement = placement_of[replicas] if placement_of else None
            out.append(Row(nodes, replicas, bsz, compute + sync, sync, placement))
    return out


def wider_node_rows(placements: Sequence[Row], scalability: Sequence[Row], base_per_node: int,
                    per_node: int) -> tuple[list[Row], list[Row]]:
    """T4-equivalent rows for nodes with ``per_node`` > ``base_per_node`` devices.

    Returns (single-node placements with base_per_node+1..per_node replicas, whole-node
    multi-node scalability rows), both still in T4 time, to be scaled like measured rows.
    """
    if per_node <= base_per_node:
        return [], []
    single = [r for r in placements if r.nodes == 1 and r.replicas >= 2]
    ks = range(base_per_node + 1, per_node + 1)
    single_rows = _extrapolate(single, [(1, k) for k in ks], {k: str(k) for k in ks})
    multi = [r for r in (*placements, *scalability) if r.nodes >= 2]
    whole = [(n, n * per_node) for n in WHOLE_NODE_COUNTS]
    return single_rows, _extrapolate(multi, whole, None)


# ----- writing -----
def _fmt(value: float) -> str:
    return f"{value:.9g}"


def write_placements(path: Path, rows: Iterable[Row]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(PLACEMENT_COLUMNS)
        for r in rows:
            writer.writerow([r.placement, r.local_bsz, _fmt(r.step), _fmt(r.sync)])


def write_scalability(path: Path, rows: Iterable[Row]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(SCALABILITY_COLUMNS)
        for r in rows:
            writer.writerow([r.nodes, r.replicas, r.local_bsz, _fmt(r.step), _fmt(r.sync)])


def build_application(app: str, src: Path, dst: Path, speed: AppSpeed,
                      types: dict[str, DeviceType], per_node: dict[str, int]) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.csv")):
        if path.name in ("placements.csv", "scalability.csv") or path.name.startswith(
            "validation-"
        ):
            shutil.copyfile(path, dst / path.name)
    placements = read_placements(src / "placements.csv")
    scalability = read_scalability(src / "scalability.csv")
    base = types[BASE_TYPE]
    for dtype in TARGET_TYPES:
        extra_single, extra_multi = wider_node_rows(
            placements, scalability, per_node[BASE_TYPE], per_node[dtype]
        )
        s = speed.speed[dtype]
        target = types[dtype]
        write_placements(dst / f"placements-{dtype}.csv",
                         (scale_row(r, s, base, target) for r in (*placements, *extra_single)))
        write_scalability(dst / f"scalability-{dtype}.csv",
                          (scale_row(r, s, base, target) for r in (*scalability, *extra_multi)))


def _readme(speeds: dict[str, AppSpeed], types: dict[str, DeviceType],
            per_node: dict[str, int], gavel_file: str) -> str:
    option = "" if gavel_file == GAVEL_FILE else f" --gavel-file {gavel_file}"
    lines = [
        "# Heterogeneous profiles (T4 measured; V100 and A100 derived)",
        "",
        f"Generated by `python -m shoal.data.hetero_profiles --out data/profiles-hetero{option}`",
        "from `../shared/data/pollux/traces` (Pollux OSDI'21 artifact, Apache-2.0; real T4",
        "profiles)"
        f" and `../shared/data/gavel/{gavel_file}` (Gavel OSDI'20, MIT; per-model",
        "K80/P100/V100 throughputs). Do not edit by hand: change the generator and regenerate.",
        "`placements.csv`, `scalability.csv` and `validation-*.csv` are the T4 originals,",
        "unchanged. The mapping and its assumptions are explained in docs/heterogeneity.md.",
        "",
        "| application | Gavel job type | class | V100/P100 (Gavel) | v100 / t4 | a100 / t4 |",
        "|---|---|---|---|---|---|",
    ]
    for app, sp in speeds.items():
        lines.append(
            f"| {app} | {sp.gavel_job_type} | {sp.model_class} | {sp.v100_over_p100:.3f} | "
            f"{sp.speed['v100']:.3f} | {sp.speed['a100']:.3f} |"
        )
    lines += [
        "",
        f"Constants: P100/T4 = {P100_OVER_T4:.4f} (FP32 peak 9.3 / 8.1 TFLOPS); A100/V100 = "
        + ", ".join(f"{k} {v:.3f}" for k, v in A100_OVER_V100.items()) + ".",
        "",
        "Link bandwidths (GB/s, from the presets) scale `sync_time`:",
        "",
        "| type | intra-node | inter-node | devices per node |",
        "|---|---|---|---|",
    ]
    for name in (BASE_TYPE, *TARGET_TYPES):
        t = types[name]
        lines.append(f"| {name} | {t.intra_node_gbps:g} | {t.inter_node_gbps:g} | "
                     f"{per_node[name]} |")
    return "\n".join(lines) + "\n"


def build(out: Path, traces: Path, gavel: Path,
          gavel_file: str = GAVEL_FILE) -> dict[str, AppSpeed]:
    """Write the whole profile directory; returns the per-application speeds used."""
    speeds = app_speeds(gavel, gavel_file)
    types, per_node = preset_device_types()
    out.mkdir(parents=True, exist_ok=True)
    for app in APPLICATIONS:
        build_application(app, traces / app, out / app, speeds[app], types, per_node)
    mapping = {
        app: {"gavel_job_type": s.gavel_job_type, "model_class": s.model_class,
              "v100_over_p100": round(s.v100_over_p100, 6),
              "speed_vs_t4": {k: round(v, 6) for k, v in s.speed.items()}}
        for app, s in speeds.items()
    }
    (out / "mapping.json").write_text(json.dumps(mapping, indent=2, sort_keys=True) + "\n")
    (out / "README.md").write_text(_readme(speeds, types, per_node, gavel_file))
    return speeds


def main(argv: Sequence[str] | None = None) -> None:
    from shoal.backends.sim.locate import shared_data_dir

    data = shared_data_dir()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="profile directory to write")
    parser.add_argument("--traces", type=Path, default=data / "pollux" / "traces",
                        help="Pollux T4 profiles (default: shared/data/pollux/traces)")
    parser.add_argument("--gavel", type=Path, default=data / "gavel",
                        help="Gavel throughput folder (default: shared/data/gavel)")
    parser.add_argument("--gavel-file", default=GAVEL_FILE,
                        help=f"which Gavel measurement file to use (default: {GAVEL_FILE})")
    args = parser.parse_args(argv)
    for name, path in (("--traces", args.traces), ("--gavel", args.gavel)):
        if not path.is_dir():
            parser.error(f"{name}: directory {path} does not exist")
    if not (args.gavel / args.gavel_file).is_file():
        parser.error(f"--gavel-file: no file {args.gavel_file} in {args.gavel}")
    speeds = build(args.out, args.traces, args.gavel, args.gavel_file)
    for app, s in speeds.items():
        print(f"{app:12s} {s.gavel_job_type:15s} "
              + " ".join(f"{t}={v:.3f}" for t, v in s.speed.items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
