"""The ``serve`` and ``stream`` sections of a job: what a long-running service declares.

A ``serve`` job answers requests under a latency SLO; the scheduler gives it as many replicas
as its current arrival rate needs (see :mod:`shoal.core.demand`)::

    name: chat
    kind: serve
    serve:
      model: opt-6.7b
      slo_s: 1.0
      arrival: {rate: 20, cv: 2, steps: [{at_s: 600, rate: 60}]}
      latency: {v100: [0.12, 0.15, 0.19, 0.24]}   # seconds per batch of 1, 2, 3, 4
      max_replicas: 8

A ``stream`` job consumes an input stream and must keep its lag bounded::

    name: clicks
    kind: stream
    stream: {input_rate: 2000, throughput: {t4: 450, v100: 900}, max_lag_s: 30}
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

SERVICE_KINDS = ("serve", "stream")
_TRAIN_ONLY = ("target_epochs", "target_tokens", "batch_size")
_REPLICA_DEFAULTS = (("num_replicas", 1), ("min_replicas", 0), ("max_replicas", None))


def field_error(field: str, message: str, value: object, title: str = "JobSpec") -> ValidationError:
    """A validation error located at ``field`` (dotted). ``message`` must not contain braces."""
    error = PydanticCustomError("job_field", message)
    return ValidationError.from_exception_data(
        title, [InitErrorDetails(type=error, loc=tuple(field.split(".")), input=value)]
    )


class RateStep(BaseModel):
    """From ``at_s`` seconds after the job's submission on, the rate is ``rate``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at_s: float = Field(ge=0, description="seconds after the job's submission")
    rate: float = Field(gt=0, description="requests (or samples) per second from then on")


def _check_steps(steps: list[RateStep]) -> list[RateStep]:
    times = [s.at_s for s in steps]
    if times != sorted(times) or len(set(times)) != len(times):
        raise ValueError(f"steps must have strictly increasing at_s (got {times})")
    return steps


def rate_at(base: float, steps: list[RateStep], t: float) -> float:
    """The piecewise-constant rate ``t`` seconds after submission."""
    rate = base
    for step in steps:
        if step.at_s <= t:
            rate = step.rate
    return rate


class ArrivalSpec(BaseModel):
    """How requests arrive: replayed from a trace CSV, or a Gamma renewal process.

    Traces: an Azure LLM trace (``TIMESTAMP`` column, or the names ``code`` / ``conv``), or any
    CSV with a column of arrival seconds (``arrival_s``, or the one named by ``column``). With
    ``model_column`` only the rows whose value there equals ``serve.model`` are used.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: str | None = Field(default=None, min_length=1, description="CSV path or code/conv")
    column: str | None = Field(default=None, min_length=1, description="arrival-seconds column")
    model_column: str | None = Field(default=None, min_length=1,
                                     description="column naming each request's model")
    rate_scale: float = Field(default=1.0, gt=0, description="trace times are divided by this")
    rate: float | None = Field(default=None, gt=0, description="Gamma process: requests/s")
    cv: float = Field(default=1.0, gt=0, description="Gamma process: gap CV (1 = Poisson)")
    steps: list[RateStep] = Field(default_factory=list, description="Gamma process: rate changes")
    seed: int = Field(default=0, ge=0)

    @field_validator("steps")
    @classmethod
    def _sorted_steps(cls, steps: list[RateStep]) -> list[RateStep]:
        return _check_steps(steps)

    @model_validator(mode="after")
    def _one_process(self) -> ArrivalSpec:
        if (self.trace is None) == (self.rate is None):
            raise ValueError("give either trace (a CSV path, or code / conv) or rate (requests/s "
                             "of a Gamma process), not both or neither")
        # Checked against the defaults (not the fields given), so a dumped spec reloads.
        if self.trace is not None:
            for name, default in (("cv", 1.0), ("steps", [])):
                if getattr(self, name) != default:
                    raise field_error(name, "applies to Gamma arrivals (rate); a trace has its "
                                      "own timing: remove it or use rate_scale",
                                      getattr(self, name), "ArrivalSpec")
        else:
            for name, default in (("column", None), ("model_column", None), ("rate_scale", 1.0)):
                if getattr(self, name) != default:
                    raise field_error(name, "applies to trace arrivals; remove it or give trace",
                                      getattr(self, name), "ArrivalSpec")
        return self

    def rate_at(self, t: float) -> float | None:
        """The declared rate ``t`` seconds after submission (None for a trace)."""
        return None if self.rate is None else rate_at(self.rate, self.steps, t)


LatencyTable = dict[Annotated[int, Field(ge=1)], Annotated[float, Field(gt=0)]]


def _table_from(value: object) -> object:
    """A list of seconds means batch sizes 1, 2, 3, ...; a mapping is kept as is."""
    if isinstance(value, list | tuple):
        return {i + 1: v for i, v in enumerate(value)}
    return value


def load_latency_file(path: str | Path) -> dict[str, dict[int, float]]:
    """A latency profile CSV with columns ``device_type,batch_size,latency_s``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"latency file '{path}' does not exist; give a CSV with columns "
                         "device_type,batch_size,latency_s")
    tables: dict[str, dict[int, float]] = {}
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        need = {"device_type", "batch_size", "latency_s"}
        missing = need - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"latency file '{path}' lacks column(s) {sorted(missing)}; "
                             "expected device_type,batch_size,latency_s")
        for line, row in enumerate(reader, start=2):
            try:
                batch, seconds = int(row["batch_size"]), float(row["latency_s"])
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: batch_size must be a whole number and "
                                 "latency_s a number of seconds") from None
            tables.setdefault(row["device_type"].strip(), {})[batch] = seconds
    if not tables:
        raise ValueError(f"latency file '{path}' has no rows")
    return tables


class ServeSpec(BaseModel):
    """A model served under a latency SLO, with replicas scaled to its arrival rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="served model; the local backend serves 'tiny'")
    slo_s: float = Field(gt=0, description="latency SLO per request, seconds")
    arrival: ArrivalSpec | None = Field(
        default=None, description="arrival process; the simulator needs it, real backends "
        "measure the arrivals at the router")
    latency: dict[str, LatencyTable] | None = Field(
        default=None, description="seconds per batch, per device type: a list for batch sizes "
        "1, 2, ... or a mapping batch size -> seconds")
    latency_file: str | None = Field(default=None, min_length=1,
                                     description="CSV device_type,batch_size,latency_s")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=16, ge=1)
    max_batch: int | None = Field(default=None, ge=1, le=1024,
                                  description="largest batch; default: largest profiled size")
    max_wait_s: float = Field(default=0.005, ge=0, description="batching wait for more requests")
    target_utilization: float = Field(default=0.8, gt=0, le=1,
                                      description="planned load per replica, of its capacity")
    cold_start_s: float = Field(default=0.0, ge=0, description="a new replica's start-up time")
    downscale_delay_s: float = Field(default=60.0, ge=0,
                                     description="lower demand must hold this long to shrink")
    duration_s: float | None = Field(default=None, gt=0,
                                     description="how long the service runs; default: until "
                                     "the trace ends (simulator) or it is cancelled")

    @field_validator("latency", mode="before")
    @classmethod
    def _lists_are_batch_1_up(cls, value: object) -> object:
        if isinstance(value, dict):
            return {k: _table_from(v) for k, v in value.items()}
        return value

    @model_validator(mode="before")
    @classmethod
    def _read_latency_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("latency_file") and data.get("latency") is None:
            try:
                tables = load_latency_file(data["latency_file"])
            except ValueError as exc:
                raise field_error("latency_file", str(exc), data["latency_file"],
                                  "ServeSpec") from None
            return {**data, "latency": tables}
        return data

    @model_validator(mode="after")
    def _check(self) -> ServeSpec:
        if self.latency is None:
            raise field_error("latency", "a serve job needs a latency profile: add e.g. "
                              "latency: v100: [0.05, 0.07, 0.09] (seconds per batch of 1, 2, "
                              "3) or latency_file: profile.csv", {}, "ServeSpec")
        if not self.latency:
            raise field_error("latency", "give a profile for at least one device type", {},
                              "ServeSpec")
        for dtype, table in self.latency.items():
            where = f"latency.{dtype}"
            if 1 not in table:
                raise field_error(where, "the profile must include batch size 1", table,
                                  "ServeSpec")
            sizes = sorted(table)
            values = [table[b] for b in sizes]
            if any(b > a + 1e-12 for a, b in zip(values[1:], values, strict=False)):
                raise field_error(where, "latency must not decrease with batch size (a bigger "
                                  f"batch is never faster); got {values} for sizes {sizes}",
                                  table, "ServeSpec")
            if self.max_batch is not None and self.max_batch > sizes[-1]:
                raise field_error("max_batch", f"{self.max_batch} exceeds the largest profiled "
                                  f"batch size for {dtype} ({sizes[-1]}); profile larger "
                                  "batches or lower max_batch", self.max_batch, "ServeSpec")
        if self.min_replicas > self.max_replicas:
            raise field_error("min_replicas", f"{self.min_replicas} exceeds max_replicas "
                              f"({self.max_replicas}); lower min_replicas or raise max_replicas",
                              self.min_replicas, "ServeSpec")
        return self

    # ----- the numbers the scheduler and the simulator use -----
    @property
    def device_types(self) -> list[str]:
        return list(self.latency or {})

    def batch_limit(self, device_type: str) -> int:
        """The largest batch on ``device_type``: ``max_batch`` or the largest profiled size."""
        table = (self.latency or {})[device_type]
        return self.max_batch or max(table)

    def latency_s(self, device_type: str, batch: int) -> float:
        """Seconds to run a batch of ``batch`` on one device (linear between profiled sizes)."""
        table = (self.latency or {})[device_type]
        sizes = sorted(table)
        if batch in table:
            return table[batch]
        if batch > sizes[-1]:
            if len(sizes) == 1:
                return table[sizes[0]] * batch
            a, b = sizes[-2], sizes[-1]
            return table[b] + (batch - b) * (table[b] - table[a]) / (b - a)
        hi = next(s for s in sizes if s > batch)
        lo = max(s for s in sizes if s < batch)
        return table[lo] + (batch - lo) * (table[hi] - table[lo]) / (hi - lo)

    def replica_capacity(self, device_type: str) -> float:
        """Requests/s one replica sustains within the SLO, 0 if it cannot meet it at all.

        A request may arrive just after a batch started: it waits for that batch and then
        runs in the next, so a batch size ``b`` keeps the SLO when ``2 L(b) <= slo_s``. The
        replica runs the largest such batch back to back: ``b / L(b)`` requests/s. When even
        ``2 L(1)`` exceeds the SLO but ``L(1)`` does not, single requests served without
        queueing still meet it (capacity ``1 / L(1)``).
        """
        best = 0
        for b in range(1, self.batch_limit(device_type) + 1):
            if 2 * self.latency_s(device_type, b) <= self.slo_s:
                best = b
        if best:
            return best / self.latency_s(device_type, best)
        one = self.latency_s(device_type, 1)
        return 1.0 / one if one <= self.slo_s else 0.0

    def replicas_for(self, device_type: str, rate: float) -> int | None:
        """Replicas that keep the SLO at ``rate`` requests/s on ``device_type``, clipped to
        ``[min_replicas, max_replicas]``; None when the type cannot meet the SLO."""
        capacity = self.replica_capacity(device_type)
        if capacity <= 0:
            return None
        want = math.ceil(max(rate, 0.0) / (capacity * self.target_utilization) - 1e-9)
        return max(self.min_replicas, min(self.max_replicas, want))


class StreamSpec(BaseModel):
    """A stream consumer: keep up with an input rate so that the lag stays bounded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_rate: float = Field(gt=0, description="samples/s at the start")
    steps: list[RateStep] = Field(default_factory=list, description="later rate changes")
    throughput: dict[str, Annotated[float, Field(gt=0)]] = Field(
        min_length=1, description="samples/s one device of each type processes")
    scaling: float = Field(default=1.0, gt=0, le=1,
                           description="capacity on k devices = throughput * k ** scaling")
    max_lag_s: float = Field(gt=0, description="lag bound: seconds of input waiting")
    headroom: float = Field(default=1.2, ge=1, description="capacity planned per unit of rate")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=64, ge=1)
    startup_s: float = Field(default=5.0, ge=0, description="a new device's start-up time")
    downscale_delay_s: float = Field(default=60.0, ge=0,
                                     description="lower demand must hold this long to shrink")
    duration_s: float | None = Field(default=None, gt=0,
                                     description="how long the stream runs; default: until "
                                     "cancelled (the simulator needs it)")

    @field_validator("steps")
    @classmethod
    def _sorted_steps(cls, steps: list[RateStep]) -> list[RateStep]:
        return _check_steps(steps)

    @model_validator(mode="after")
    def _check(self) -> StreamSpec:
        if self.min_replicas > self.max_replicas:
            raise field_error("min_replicas", f"{self.min_replicas} exceeds max_replicas "
                              f"({self.max_replicas}); lower min_replicas or raise max_replicas",
                              self.min_replicas, "StreamSpec")
        return self

    @property
    def device_types(self) -> list[str]:
        return list(self.throughput)

    def rate_at(self, t: float) -> float:
        return rate_at(self.input_rate, self.steps, t)

    def capacity(self, device_type: str, devices: int, per_device: float | None = None) -> float:
        """Samples/s ``devices`` devices of ``device_type`` process (``per_device``: one
        device's measured speed, in place of the declared ``throughput``)."""
        speed = self.throughput[device_type] if per_device is None else per_device
        return speed * devices**self.scaling if devices > 0 else 0.0

    def devices_for(self, device_type: str, rate: float, backlog: float = 0.0,
                    per_device: float | None = None) -> int:
        """Fewest devices whose capacity covers ``headroom`` x ``rate`` plus draining
        ``backlog`` within half the lag bound, clipped to ``[min_replicas, max_replicas]``."""
        need = max(rate, 0.0) * self.headroom + max(backlog, 0.0) / (self.max_lag_s / 2)
        k = self.min_replicas
        while k < self.max_replicas and self.capacity(device_type, k, per_device) < need:
            k += 1
        return k


def fill_service_defaults(data: Any) -> Any:
    """Before validation: a serve / stream job may leave out ``application`` (it becomes the
    served model, or ``stream``); train-only fields on a service are reported here, before
    checks meant for training jobs run."""
    if not isinstance(data, dict) or data.get("kind") not in SERVICE_KINDS:
        return data
    kind = data["kind"]
    if data.get("model") is not None:
        fix = ("put the served model under serve.model" if kind == "serve" else "remove it")
        raise field_error("model", f"names a model to train; for a {kind} job {fix}",
                          data["model"])
    if not data.get("application"):
        section = data.get(kind)
        model = section.get("model") if isinstance(section, dict) else None
        data = {**data, "application": str(model or kind)}
    return data


def check_job_kind(job: Any) -> None:
    """After validation: the job's kind and its sections agree (raises ValidationError)."""
    kind = job.kind
    for section in SERVICE_KINDS:
        present = getattr(job, section) is not None
        if section == kind and not present:
            example = ("model, slo_s and latency (e.g. serve: model: opt-6.7b, slo_s: 1.0, "
                       "latency: v100: [0.1, 0.14])" if kind == "serve" else
                       "input_rate, throughput and max_lag_s (e.g. stream: input_rate: 1000, "
                       "throughput: t4: 400, max_lag_s: 30)")
            raise field_error(kind, f"a job of kind {kind} needs a {kind} section with "
                              f"{example}", {})
        if section != kind and present:
            raise field_error(section, f"a {section} section needs kind: {section} (the job's "
                              f"kind is {kind}); set kind: {section} or remove the section",
                              getattr(job, section).model_dump())
    if kind == "train":
        return
    for name in _TRAIN_ONLY:
        if getattr(job, name) is not None:
            raise field_error(name, f"applies to training jobs only; a {kind} job runs until "
                              f"its {kind}.duration_s or until cancelled: remove it",
                              getattr(job, name))
    for name, default in _REPLICA_DEFAULTS:
        if getattr(job, name) != default:
            raise field_error(name, f"a {kind} job's replicas come from its demand; set "
                              f"{kind}.{name} instead", getattr(job, name))
    if job.rigid:
        raise field_error("rigid", f"a {kind} job is resized with its demand; remove rigid",
                          True)
    section = getattr(job, kind)
    if job.device_types:
        usable = [t for t in job.device_types if t in section.device_types]
        if not usable:
            what = "latency" if kind == "serve" else "throughput"
            raise field_error("device_types", f"none of {job.device_types} has a profile in "
                              f"{kind}.{what} (profiled: {section.device_types}); add one or "
                              "change device_types", job.device_types)
