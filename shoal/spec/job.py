"""Job descriptions: what a user submits."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from shoal.spec.errors import SpecError, from_validation_error
from shoal.spec.serving import ServeSpec, StreamSpec, check_job_kind, fill_service_defaults

# Bounds that only catch typos and unit mistakes (a batch of 1e12, a job of a billion
# devices): far above any real job, low enough that no arithmetic on them overflows.
MAX_BATCH = 2**31 - 1
MAX_REPLICAS = 2**20


class JobSpec(BaseModel):
    """One training job.

    ``batch_size`` and ``num_replicas`` are the user's own configuration: policies that do not
    adapt jobs (fifo, tiresias) run exactly that; adaptive policies treat ``batch_size`` as the
    initial batch size and choose replicas within ``[min_replicas, max_replicas]``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["train", "serve", "stream"] = Field(
        default="train", description="train: runs to completion; serve / stream: a service "
        "sized by its demand, described by the section of the same name")
    tenant: str = Field(default="default", min_length=1, max_length=128)
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False,
                          description="share weight of this job's tenant")
    application: str = Field(min_length=1, max_length=256,
                             description="profile or model name, e.g. cifar10")
    submit_time: float = Field(default=0.0, ge=0, description="seconds after the trace start")
    target_epochs: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH,
                                   description="user's global batch size")
    max_batch_size: int | None = Field(
        default=None, ge=1, le=MAX_BATCH,
        description="largest global batch the scheduler may choose (default: batch_size, "
        "unless the training script states a larger bound)",
    )
    max_local_bsz: int | None = Field(
        default=None, ge=1, le=MAX_BATCH,
        description="largest batch one replica processes at once (device memory); a larger "
        "per-replica share is split into gradient-accumulation micro-steps",
    )
    workdir: str | None = Field(
        default=None, min_length=1,
        description="directory the command runs in; a relative path is taken from the "
        "directory the job was submitted from",
    )
    num_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS, description="user's device count")
    min_replicas: int = Field(default=0, ge=0, le=MAX_REPLICAS)
    max_replicas: int | None = Field(default=None, ge=1, le=MAX_REPLICAS)
    adaptive_batch: bool = Field(default=True, description="the scheduler may tune batch size")
    rigid: bool = Field(default=False, description="runs only at exactly num_replicas devices")
    preemptible: bool = Field(default=True, description="may be stopped once started")
    device_types: list[str] | None = Field(default=None, description="allowed device types")
    command: list[str] | None = Field(default=None, description="program run by real backends")
    model: str | None = Field(
        default=None,
        description="architecture instead of a measured profile: a name such as llama-7b or "
        "'gpt:layers=..,hidden=..,heads=..,seq=..,vocab=..'; batch_size is then the global "
        "batch in sequences and the scheduler picks the parallel plan per allocation",
    )
    target_tokens: int | None = Field(
        default=None, ge=1, description="tokens to train on, for a job that declares a model"
    )
    serve: ServeSpec | None = Field(default=None, description="the service of a kind: serve job")
    stream: StreamSpec | None = Field(default=None, description="the stream of a kind: stream job")

    @model_validator(mode="before")
    @classmethod
    def _service_defaults(cls, data: object) -> object:
        return fill_service_defaults(data)

    @model_validator(mode="after")
    def _check_kind(self) -> JobSpec:
        check_job_kind(self)
        return self

    @model_validator(mode="before")
    @classmethod
    def _application_from_model(cls, data: object) -> object:
        """A job that declares a model may leave out ``application``: it is the model."""
        if isinstance(data, dict) and data.get("model") is not None and not data.get(
                "application"):
            # An empty model name is reported on ``model`` by the check below.
            return {**data, "application": str(data["model"]).strip() or "model"}
        return data

    @model_validator(mode="after")
    def _check_model(self) -> JobSpec:
        if self.model is None:
            if self.target_tokens is not None:
                raise _field_error("target_tokens", "applies only to a job that declares a "
                                   "model; set model or use target_epochs", self.target_tokens)
            return self
        from shoal.perf.catalog import parse_model  # the parser `shoal plan --model` uses

        try:
            parse_model(self.model)
        except SpecError as exc:
            message = str(exc).split("': ", 1)[-1]
            raise _field_error(exc.field or "model", message, self.model) from None
        if self.batch_size is None:
            raise _field_error("batch_size", "a job that declares a model needs batch_size, "
                               "its global batch in sequences (e.g. 512)", None)
        if self.target_tokens is None:
            raise _field_error("target_tokens", "a job that declares a model needs "
                               "target_tokens, the tokens to train on (e.g. 1000000000)", None)
        if self.target_epochs is not None:
            raise _field_error("target_epochs", "a job that declares a model trains for "
                               "target_tokens; remove target_epochs", self.target_epochs)
        return self

    @model_validator(mode="after")
    def _check_batch_bounds(self) -> JobSpec:
        if (self.max_batch_size is not None and self.batch_size is not None
                and self.max_batch_size < self.batch_size):
            raise _field_error(
                "max_batch_size", f"max_batch_size ({self.max_batch_size}) is below batch_size "
                f"({self.batch_size}); raise it or leave it out for a fixed batch size",
                self.max_batch_size,
            )
        return self

    @model_validator(mode="after")
    def _check_ranges(self) -> JobSpec:
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas}); "
                "lower min_replicas or raise max_replicas"
            )
        if self.max_replicas is not None and self.num_replicas > self.max_replicas:
            raise ValueError(
                f"num_replicas ({self.num_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        return self


def _field_error(field: str, message: str, value: object) -> ValidationError:
    """A validation error located at ``field`` (dotted), for checks that span fields."""
    loc = tuple(field.split("."))
    error = PydanticCustomError("job_field", message)
    return ValidationError.from_exception_data(
        "JobSpec", [InitErrorDetails(type=error, loc=loc, input=value)]
    )


def parse_job(data: object, source: str | None = None) -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError("a job must be a mapping of fields", source=source)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, source, JobSpec) from exc


def load_job_yaml(text: str, source: str | None = None) -> JobSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", source=source) from exc
    return parse_job(data, source)


_WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


def load_workload_csv(path: str | Path) -> list[JobSpec]:
    """Jobs from a Pollux-format workload trace: ``name,time,application,num_replicas,batch_size``.

    Extra columns ``tenant``, ``weight``, ``model`` and ``target_tokens`` are honoured where a
    row fills them (a row with a ``model`` is a job that declares its architecture; see
    ``JobSpec.model``).
    """
    path = Path(path)
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in _WORKLOAD_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError(
                f"missing column(s) {missing}; a workload CSV needs {list(_WORKLOAD_COLUMNS)}",
                source=str(path),
            )
        jobs = []
        for line, row in enumerate(reader, start=2):
            data: dict[str, object] = {
                "name": row["name"],
                "application": row["application"],
                "submit_time": float(row["time"]),
                "num_replicas": int(row["num_replicas"]),
                "batch_size": int(row["batch_size"]),
            }
            for extra in ("tenant", "weight", "model", "target_tokens"):
                if row.get(extra):
                    data[extra] = row[extra]
            jobs.append(parse_job(data, source=f"{path}:{line}"))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise SpecError("job names must be unique", field="name", source=str(path))
    return jobs
