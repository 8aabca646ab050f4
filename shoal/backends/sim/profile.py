"""Measured application profiles: step times per placement and gradient statistics per epoch.

A profile directory holds one folder per application with

* ``placements.csv`` (``placement,local_bsz,step_time,sync_time``; ``placement`` is a digit
  string, one digit per node giving the devices used there) and ``scalability.csv``
  (``num_nodes,num_replicas,local_bsz,step_time,sync_time``) for the base device type (T4), and
  ``placements-<type>.csv`` / ``scalability-<type>.csv`` for other device types;
* ``validation-<B>.csv`` per total batch size ``B``:
  ``progress,iteration,metric,grad_sqr,grad_var`` per epoch.

Step times of a placement that was measured are interpolated linearly in the local batch size;
other placements are interpolated linearly over (nodes, replicas, local batch) on a Delaunay
triangulation of all measurements. Placements are identified up to rotation, as measured.
"""

from __future__ import annotations

import bisect
import csv
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from scipy.interpolate import LinearNDInterpolator

from shoal.backends.sim.applications import KNOWN_APPLICATIONS, AppDefaults
from shoal.spec.errors import SpecError
from shoal.spec.suggest import did_you_mean

BASE_DEVICE_TYPE = "t4"
_MAX_INTERPOLATED_NODES = 16


def _read_columns(path: Path, required: tuple[str, ...]) -> dict[str, list[str]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise SpecError(f"missing column(s) {missing}", source=str(path))
        rows = list(reader)
    return {name: [row[name] for row in rows] for name in header}


@dataclass
class ValidationTrace:
    progress: np.ndarray
    iteration: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


class _LazyInterpolator:
    """LinearNDInterpolator built on first use: a profile measured on one node (all points in
    one plane, which Delaunay cannot triangulate) loads fine and answers its own placements."""

    def __init__(self, points: np.ndarray, values: np.ndarray):
        self.points, self.values = points, values
        self._built: LinearNDInterpolator | None = None

    def __call__(self, point: list[float]) -> np.ndarray:
        if self._built is None:
            self._built = LinearNDInterpolator(self.points, self.values)
        return np.asarray(self._built(point))


@dataclass
class DeviceProfile:
    """Step-time measurements of one application on one device type."""

    by_placement: dict[str, tuple[np.ndarray, np.ndarray]]  # id -> (local_bsz, [step, sync])
    interpolator: _LazyInterpolator
    local_bsz_range: tuple[int, int]
    _memo: dict[tuple[tuple[int, ...], float], tuple[float, float]] = field(default_factory=dict)

    def step_and_sync(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        key = (placement, local_bsz)
        cached = self._memo.get(key)
        if cached is not None:
            return cached
        counts = tuple(c for c in placement if c)
        rotated = min(counts[i:] + counts[:i] for i in range(len(counts)))
        ident = "".join(map(str, rotated))
        measured = self.by_placement.get(ident)
        if measured is not None:
            xs, ys = measured
            step = float(np.interp(local_bsz, xs, ys[:, 0]))
            sync = float(np.interp(local_bsz, xs, ys[:, 1]))
        else:
            nodes = min(len(rotated), _MAX_INTERPOLATED_NODES)
            value = self.interpolator([nodes, sum(rotated), local_bsz])[0]
            step, sync = float(value[0]), float(value[1])
        if not (np.isfinite(step) and np.isfinite(sync)):
            raise ValueError(
                f"placement {placement} with local batch {local_bsz} is outside the profile"
            )
        self._memo[key] = (step, sync)
        return step, sync


def _load_device_profile(app_dir: Path, suffix: str) -> DeviceProfile:
    cols = ("local_bsz", "step_time", "sync_time")
    placements = _read_columns(app_dir / f"placements{suffix}.csv", ("placement", *cols))
    scal = _read_columns(
        app_dir / f"scalability{suffix}.csv", ("num_nodes", "num_replicas", *cols)
    )
    ident = placements["placement"]
    bsz = np.array(placements["local_bsz"], dtype=float)
    step = np.array(placements["step_time"], dtype=float)
    sync = np.array(placements["sync_time"], dtype=float)
    by_placement: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for pid in dict.fromkeys(ident):
        mask = np.array([p == pid for p in ident])
        order = np.argsort(bsz[mask], kind="stable")
        by_placement[pid] = (bsz[mask][order], np.column_stack([step[mask], sync[mask]])[order])
    # Mean per (nodes, replicas, local_bsz) of the placement measurements, sorted by key, then
    # the scalability rows in file order.
    grouped: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
    for pid, b, s, y in zip(ident, bsz, step, sync, strict=True):
        key = (float(len(pid)), float(sum(map(int, pid))), float(b))
        grouped.setdefault(key, []).append((s, y))
    points = [list(k) for k in sorted(grouped)]
    values = [list(np.mean(grouped[k], axis=0)) for k in sorted(grouped)]
    for n, r, b, s, y in zip(
        scal["num_nodes"], scal["num_replicas"], scal["local_bsz"],
        scal["step_time"], scal["sync_time"], strict=True,
    ):
        points.append([float(n), float(r), float(b)])
        values.append([float(s), float(y)])
    interpolator = _LazyInterpolator(np.array(points), np.array(values))
    return DeviceProfile(by_placement, interpolator, (int(bsz.min()), int(bsz.max())))


class ApplicationProfile:
    """Everything the simulator knows about one application, on every profiled device type."""

    def __init__(self, app_dir: Path, defaults: AppDefaults | None = None):
        self.name = app_dir.name
        defaults = defaults or KNOWN_APPLICATIONS.get(self.name, AppDefaults())
        self.defaults = defaults
        self.validation: dict[int, ValidationTrace] = {}
        for path in app_dir.glob("validation-*.csv"):
            match = re.fullmatch(r"validation-(\d+)\.csv", path.name)
            if not match:
                continue
            cols = _read_columns(path, ("progress", "iteration", "metric", "grad_sqr", "grad_var"))
            self.validation[int(match.group(1))] = ValidationTrace(
                *(np.array(cols[c], dtype=float)
                  for c in ("progress", "iteration", "metric", "grad_sqr", "grad_var"))
            )
        if not self.validation:
            raise SpecError("no validation-<batch>.csv files", source=str(app_dir))
        self.validation = dict(sorted(self.validation.items()))
        self.batch_sizes = list(self.validation)
        self.devices: dict[str, DeviceProfile] = {}
        for dtype, suffix in _profile_files(app_dir):
            self.devices[dtype] = _load_device_profile(app_dir, suffix)
        if not self.devices:
            raise SpecError("no placements.csv or placements-<type>.csv", source=str(app_dir))
        lows, highs = zip(*(d.local_bsz_range for d in self.devices.values()), strict=True)
        self.init_batch_size = min(self.validation)
        self.max_batch_size = max(self.validation)
        self.min_local_bsz = min(lows)
        self.max_local_bsz = defaults.max_local_bsz or max(highs)
        self.available_epochs = min(len(v.progress) for v in self.validation.values())
        self.max_epochs = min(defaults.epochs or self.available_epochs, self.available_epochs)
        self._progress = [0.0] + [
            min(float(v.progress[e]) for v in self.validation.values())
            for e in range(self.available_epochs)
        ]
        self._grad_memo: dict[tuple[float, int], tuple[float, float]] = {}

    @property
    def device_types(self) -> list[str]:
        return list(self.devices)

    def _bracket(self, batch_size: float) -> tuple[int, int]:
        sizes = self.batch_sizes
        if batch_size < sizes[0] or batch_size > sizes[-1]:
            raise ValueError(f"{self.name}: batch size {batch_size} outside profiled {sizes}")
        hi = bisect.bisect_left(sizes, batch_size)
        lo = hi if sizes[hi] == batch_size else hi - 1
        return sizes[lo], sizes[hi]

    def _interpolate(self, batch_size: float, column: str, epoch: int) -> float:
        lo, hi = self._bracket(batch_size)
        lo_val = float(getattr(self.validation[lo], column)[epoch])
        if lo == hi:
            return lo_val
        hi_val = float(getattr(self.validation[hi], column)[epoch])
        return ((batch_size - lo) * hi_val + (hi - batch_size) * lo_val) / (hi - lo)

    def progress_at(self, epoch: int) -> float:
        """Scale-invariant progress needed to complete ``epoch`` epochs."""
        return self._progress[epoch]

    def completion_epoch(self, batch_size: float) -> int:
        """Index of the last epoch to train; the job finishes when it completes."""
        return self.max_epochs - 1

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        key = (batch_size, epoch)
        cached = self._grad_memo.get(key)
        if cached is None:
            cached = (
                self._interpolate(batch_size, "grad_sqr", epoch),
                self._interpolate(batch_size, "grad_var", epoch),
            )
            self._grad_memo[key] = cached
        return cached

    def iterations(self, batch_size: float, epoch: int) -> float:
        """Iterations done after completing ``epoch`` (0-based) at ``batch_size``."""
        return self._interpolate(batch_size, "iteration", epoch)

    def step_and_sync(
        self, placement: tuple[int, ...], local_bsz: float, device_type: str = BASE_DEVICE_TYPE
    ) -> tuple[float, float]:
        """Measured (step, sync) seconds of one micro-batch step at this placement."""
        return self.devices[device_type].step_and_sync(placement, local_bsz)

    def step_time(self, placement: tuple[int, ...], atomic_bsz: float, accum_steps: int,
                  device_type: str = BASE_DEVICE_TYPE) -> float:
        """Seconds per optimizer step at this placement (see :func:`optimizer_step_time`)."""
        step, sync = self.step_and_sync(placement, atomic_bsz, device_type)
        return optimizer_step_time(step, sync, accum_steps)


def optimizer_step_time(step: float, sync: float, accum_steps: int) -> float:
    """Seconds per optimizer step from one micro-batch step's measured (step, sync) seconds:
    each of the ``accum_steps`` extra micro-batches computes without synchronizing."""
    return step + (step - sync) * accum_steps


def _profile_files(app_dir: Path) -> list[tuple[str, str]]:
    """(device type, file suffix) of each profile in an application's directory: the
    unsuffixed ``placements.csv`` is the T4 profile, ``placements-<type>.csv`` another type's."""
    found = [(BASE_DEVICE_TYPE, "")] if (app_dir / "placements.csv").exists() else []
    for path in sorted(app_dir.glob("placements-*.csv")):
        dtype = path.stem.removeprefix("placements-")
        found.append((dtype, f"-{dtype}"))
    return found


class ProfileLibrary:
    """All applications in a profile directory, loaded on first use."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        if not self.root.is_dir():
            raise SpecError(
                f"profile directory '{self.root}' does not exist; pass --profiles DIR "
                "(e.g. ../shared/data/pollux/traces)",
                field="profiles",
            )
        self._apps: dict[str, ApplicationProfile] = {}

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def measured_device_types(self) -> set[str]:
        """The device types some application here has a profile for (from the file names,
        without loading the profiles)."""
        return {dtype for name in self.names() for dtype, _ in _profile_files(self.root / name)}

    def get(self, name: str) -> ApplicationProfile:
        app = self._apps.get(name)
        if app is None:
            app_dir = self.root / name
            if not app_dir.is_dir():
                raise SpecError(
                    f"unknown application '{name}'{did_you_mean(name, self.names())}; "
                    f"profiles in {self.root}: {self.names()}",
                    field="application",
                )
            app = self._apps[name] = ApplicationProfile(app_dir)
        return app


@cache
def shared_library(root: str) -> ProfileLibrary:
    """A process-wide cache of profile libraries, keyed by directory."""
    return ProfileLibrary(root)
