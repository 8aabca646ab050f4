"""What a real job has reported, turned into the scheduler's models (ModelHints, JobLimits).

A report (see docs/training.md) carries step and sync times per configuration ``(nodes,
replicas, local_bsz, accum_steps)``, the gradient statistics at the initial batch size, batch
bounds and progress. The throughput model is fitted with the same code the simulator uses
(:func:`shoal.perf.fit_perf_params`), so the same policies decide for real jobs.

A job that declares its model (``JobSpec.model``) is not fitted: its goodput is the planner's
(:class:`~shoal.perf.planned.PlannedGoodput`, as in the simulator), at its fixed global batch,
and its progress is the tokens it has trained over its ``target_tokens``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shoal.core.types import JobLimits, ModelHints
from shoal.perf import GoodputModel, GradStats, PerfParams, fit_perf_params
from shoal.perf.parallel import Plan
from shoal.perf.planned import PlannedGoodput
from shoal.perf.throughput import projected_params
from shoal.spec.job import JobSpec

_REFIT_SECONDS = 15.0


@dataclass(frozen=True)
class _Fit:
    perf: PerfParams
    keys: frozenset[tuple[int, int, int, int]]  # the configurations it was fitted to
    at: float


def _cap(value: int, bound: int | None) -> int:
    return value if bound is None else min(value, bound)


@dataclass
class JobModel:
    device_type: str
    target_epochs: int | None
    init_batch_size: int | None = None
    max_batch_size: int | None = None
    max_local_bsz: int | None = None
    batch_size: int | None = None
    grad: GradStats | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    epoch: int = 0
    fraction: float = 0.0  # of the job done, 0..1
    steps: int = 0
    samples_per_second: float = 0.0
    last_report: dict[str, Any] | None = None
    reports: int = 0
    epoch_trace: list[dict[str, Any]] = field(default_factory=list)  # see ElasticTrainer
    spec_max_batch_size: int | None = None  # the job spec's bounds cap what the job reports
    spec_max_local_bsz: int | None = None
    # A job that declares its model: the planner's goodput per device type it may run on.
    planned_types: dict[str, PlannedGoodput] = field(default_factory=dict)
    target_tokens: int | None = None
    # Peak rate per device type of the cluster (backends with several types set it): on a
    # type the job has not run on, it is predicted from the type it ran most replicas on, with
    # the compute time scaled by the ratio of peaks (a data-sheet prior until it runs there).
    type_peaks: dict[str, float] = field(default_factory=dict)
    # Step times a probe measured (one replica, on a type the job had not run on); rows of a
    # type the job's own reports cover are superseded by those.
    probe_rows: list[dict[str, Any]] = field(default_factory=list)
    _fits: dict[str, _Fit] = field(default_factory=dict)  # per device type
    _progress_log: list[tuple[float, float]] = field(default_factory=list)

    @classmethod
    def for_spec(cls, device_type: str, spec: JobSpec,
                 planned: Mapping[str, PlannedGoodput] | None = None) -> JobModel:
        return cls(device_type, spec.target_epochs, spec_max_batch_size=spec.max_batch_size,
                   spec_max_local_bsz=spec.max_local_bsz, planned_types=dict(planned or {}),
                   target_tokens=spec.target_tokens)

    @property
    def planned(self) -> PlannedGoodput | None:
        """The planned goodput on the job's current device type (None unless it declares its
        model)."""
        if not self.planned_types:
            return None
        return self.planned_types.get(self.device_type) or next(iter(self.planned_types.values()))

    def plan_for(self, per_node: list[int], device_type: str | None = None) -> Plan | None:
        """The parallel plan of an allocation (``per_node`` devices of ``device_type``, default
        the current type, on each of its nodes), for a job that declares its model; None for
        other jobs and where no plan fits."""
        planned = self.planned_types.get(device_type) if device_type else self.planned
        return None if planned is None else planned.plan_on(per_node)

    # ----- input -----
    def update(self, report: dict[str, Any], now: float | None = None) -> None:
        now = time.time() if now is None else now
        if report.get("probe"):
            self._add_probe(report.get("profile"))
            return
        self.reports += 1
        self.last_report = report
        for key in ("init_batch_size", "max_batch_size", "max_local_bsz", "batch_size"):
            value = report.get(key)
            if isinstance(value, int) and value > 0:
                setattr(self, key, value)
        if report.get("grad_sqr") is not None and report.get("grad_var") is not None:
            self.grad = GradStats(float(report["grad_sqr"]), float(report["grad_var"]))
        rows = report.get("profile")
        if isinstance(rows, list) and rows:
            self.rows = rows
        trace = report.get("epochs")
        if isinstance(trace, list) and len(trace) >= len(self.epoch_trace):
            self.epoch_trace = trace
        self.epoch = int(report.get("epoch") or 0)
        self.steps = int(report.get("steps") or 0)
        self.samples_per_second = float(report.get("samples_per_second") or 0.0)
        self.fraction = self._fraction(report)
        self._progress_log.append((now, self.fraction))
        self._progress_log = self._progress_log[-30:]

    def _add_probe(self, rows: object) -> None:
        """Keep a probe's rows (those naming their device type), replacing earlier probes'."""
        if not isinstance(rows, list):
            return
        fresh = [r for r in rows if isinstance(r, dict) and r.get("device_type")]
        types = {r["device_type"] for r in fresh}
        self.probe_rows = [r for r in self.probe_rows if r["device_type"] not in types] + fresh

    @property
    def all_rows(self) -> list[dict[str, Any]]:
        """The job's own rows, then probe rows of the types those do not cover."""
        own = {str(r.get("device_type") or self.device_type) for r in self.rows}
        return self.rows + [r for r in self.probe_rows if r["device_type"] not in own]

    def _fraction(self, report: dict[str, Any]) -> float:
        if report.get("done"):
            return 1.0
        if self.planned is not None and self.target_tokens:
            tokens = float(report.get("samples") or 0) * self.planned.model.seq
            return min(1.0, tokens / self.target_tokens)
        if not self.target_epochs:
            return 0.0
        position, total = report.get("epoch_position"), report.get("epoch_samples")
        within = position / total if position is not None and total else 0.0
        return min(1.0, (self.epoch + within) / self.target_epochs)

    # ----- models -----
    def rows_by_type(self) -> dict[str, list[dict[str, Any]]]:
        """Usable profile rows per device type. A row without ``device_type`` (a trainer that
        was not told its type) counts as measured on the type the job runs on now."""
        out: dict[str, list[dict[str, Any]]] = {}
        for row in self.all_rows:
            if row.get("step_time", 0) > 0 and row.get("count", 0) > 0:
                out.setdefault(str(row.get("device_type") or self.device_type), []).append(row)
        return out

    def perf_params(self, device_type: str | None = None) -> PerfParams | None:
        """The throughput model fitted to the steps measured on ``device_type`` (default: the
        type the job runs on); None where it has not run."""
        return self._fit(device_type or self.device_type, self.rows_by_type(), time.time())

    def _fit(self, dtype: str, by_type: Mapping[str, list[dict[str, Any]]],
             now: float) -> PerfParams | None:
        usable = by_type.get(dtype)
        if not usable:
            return None
        keys = frozenset(
            (r["num_nodes"], r["num_replicas"], r["local_bsz"], r["accum_steps"]) for r in usable
        )
        fit = self._fits.get(dtype)
        if fit is None or keys != fit.keys or now - fit.at > _REFIT_SECONDS:
            nodes, replicas, bsz, grad, step = [], [], [], [], []
            for r in usable:
                accum = int(r["accum_steps"])
                # Per micro-batch compute; the step without accumulation is compute + sync.
                micro = max((r["step_time"] - r["sync_time"]) / (accum + 1), 1e-6)
                nodes.append(r["num_nodes"])
                replicas.append(r["num_replicas"])
                bsz.append(r["local_bsz"])
                grad.append(micro)
                step.append(max(r["step_time"] - accum * micro, micro))
            perf = fit_perf_params(nodes, replicas, bsz, grad, step,
                                   warm_start=None if fit is None else fit.perf)
            fit = self._fits[dtype] = _Fit(perf, keys, now)
        return fit.perf

    @property
    def perf(self) -> PerfParams | None:
        """The last fit on the type the job runs on (without refitting)."""
        fit = self._fits.get(self.device_type)
        return None if fit is None else fit.perf

    @staticmethod
    def _profiled(by_type: Mapping[str, list[dict[str, Any]]]) -> dict[str, int]:
        """Per device type, the most replicas the job has measured steps on."""
        return {dtype: max(int(r["num_replicas"]) for r in rows)
                for dtype, rows in by_type.items()}

    def _params(self, dtype: str, by_type: Mapping[str, list[dict[str, Any]]]
                ) -> PerfParams | None:
        """Parameters on ``dtype``: its fit, projected from the most-explored type where it
        ran one replica only (as the simulator and Sia do); where it never ran, the peak-rate
        prior (``type_peaks``)."""
        now = time.time()
        profiled = self._profiled(by_type)
        perf = projected_params(
            dtype, profiled, lambda t: self._fit(t, by_type, now),
            lambda t: min(int(r["local_bsz"]) for r in by_type[t]))
        own_peak = self.type_peaks.get(dtype)
        measured = [t for t in profiled if self.type_peaks.get(t)]
        if perf is not None or not own_peak or not measured:
            return perf
        base = max(measured, key=lambda t: profiled[t])
        perf = self._params(base, by_type)
        if perf is None:
            return None
        ratio = self.type_peaks[base] / own_peak
        return replace(perf, alpha_c=perf.alpha_c * ratio, beta_c=perf.beta_c * ratio)

    def goodput(self, limits: JobLimits,
                device_type: str | None = None) -> GoodputModel | PlannedGoodput | None:
        """The goodput model on ``device_type`` (default: the type the job runs on)."""
        if self.planned_types:
            return self.planned_types.get(device_type or self.device_type) or self.planned
        return self._goodput(limits, device_type or self.device_type, self.rows_by_type())

    def _goodput(self, limits: JobLimits, dtype: str,
                 by_type: Mapping[str, list[dict[str, Any]]]) -> GoodputModel | None:
        perf = self._params(dtype, by_type)
        if perf is None or self.grad is None:
            return None
        return GoodputModel(
            perf, self.grad, limits.init_batch_size, limits.max_batch_size,
            limits.min_local_bsz, limits.max_local_bsz,
        )

    def hints(self, limits: JobLimits) -> ModelHints:
        if self.planned_types:  # the planner needs no measurement to trust any size
            return ModelHints(goodput=dict(self.planned_types),
                              max_profiled_replicas={t: limits.max_replicas
                                                     for t in self.planned_types},
                              epoch=self.epoch, progress=self.fraction)
        by_type = self.rows_by_type()
        profiled = self._profiled(by_type)
        models = {dtype: self._goodput(limits, dtype, by_type)
                  for dtype in {**profiled, **self.type_peaks}}
        return ModelHints(
            goodput={dtype: m for dtype, m in models.items() if m is not None},
            max_profiled_replicas=profiled,
            epoch=self.epoch,
            progress=self.fraction,
        )

    def limits(self, base: JobLimits) -> JobLimits:
        """``base`` (from the spec) refined by the bounds the job itself reported."""
        init = self.init_batch_size or base.init_batch_size
        max_batch = max(_cap(self.max_batch_size or base.max_batch_size,
                             self.spec_max_batch_size), init)
        max_local = _cap(self.max_local_bsz or max_batch, self.spec_max_local_bsz)
        return JobLimits(
            init_batch_size=init,
            max_batch_size=max_batch,
            min_local_bsz=base.min_local_bsz,
            max_local_bsz=max(max_local, base.min_local_bsz),
            max_replicas=base.max_replicas,
            fixed_batch=base.fixed_batch,
        )

    def best_batch(self, limits: JobLimits, num_nodes: int, num_replicas: int,
                   device_type: str | None = None) -> int | None:
        """The global batch with the best goodput on this allocation (None without a model);
        on a type the job has not run on yet, as measured on the type it runs on."""
        if limits.fixed_batch is not None:
            return limits.fixed_batch
        model = self.goodput(limits, device_type) or self.goodput(limits)
        if model is None:
            return None
        choice = model.optimize(num_nodes, num_replicas)
        batch = num_replicas * int(choice.atomic_bsz) * (int(choice.accum_steps) + 1)
        return int(min(max(batch, limits.init_batch_size), limits.max_batch_size))

    def eta_seconds(self) -> float | None:
        """Seconds left at the recent rate of progress (None until it can be told)."""
        if self.fraction >= 1.0:
            return 0.0
        if len(self._progress_log) < 2:
            return None
        (t0, f0), (t1, f1) = self._progress_log[0], self._progress_log[-1]
        if f1 <= f0 or t1 <= t0:
            return None
        return float((1.0 - f1) * (t1 - t0) / (f1 - f0))

    def _noise_scale(self) -> float | None:
        if self.grad is None:
            return None
        phi = self.grad.noise_scale(self.init_batch_size or 1)
        return phi if np.isfinite(phi) else None

    def summary(self) -> dict[str, Any]:
        perf = self.perf
        return {
            "epoch": self.epoch,
            "progress": self.fraction,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "samples_per_second": self.samples_per_second,
            "noise_scale": self._noise_scale(),
            "perf_params": None if perf is None else dict(
                zip(("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma"),
                    np.round(perf.as_array(), 6).tolist(), strict=True)
            ),
            "profile": self.all_rows,
            "epochs": self.epoch_trace,
            "bounds": {"init_batch_size": self.init_batch_size,
                       "max_batch_size": self.max_batch_size,
                       "max_local_bsz": self.max_local_bsz},
            "eta_seconds": self.eta_seconds(),
            "reports": self.reports,
        }
