"""Job descriptions: what a user submits."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shoal.spec.errors import SpecError, from_validation_error


class JobSpec(BaseModel):
    """One training job.

    ``batch_size`` and ``num_replicas`` are the user's own configuration: policies that do not
    adapt jobs (fifo, tiresias) run exactly that; adaptive policies treat ``batch_size`` as the
    initial batch size and choose replicas within ``[min_replicas, max_replicas]``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["train"] = "train"
    tenant: str = Field(default="default", min_length=1)
    weight: float = Field(default=1.0, gt=0, description="share weight of this job's tenant")
    application: str = Field(min_length=1, description="profile or model name, e.g. cifar10")
    submit_time: float = Field(default=0.0, ge=0, description="seconds after the trace start")
    target_epochs: int | None = Field(default=None, ge=1)
    batch_size: int | None = Field(default=None, ge=1, description="user's global batch size")
    num_replicas: int = Field(default=1, ge=1, description="user's device count")
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int | None = Field(default=None, ge=1)
    adaptive_batch: bool = Field(default=True, description="the scheduler may tune batch size")
    rigid: bool = Field(default=False, description="runs only at exactly num_replicas devices")
    preemptible: bool = Field(default=True, description="may be stopped once started")
    device_types: list[str] | None = Field(default=None, description="allowed device types")
    command: list[str] | None = Field(default=None, description="program run by real backends")

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


def parse_job(data: object, source: str | None = None) -> JobSpec:
    if not isinstance(data, dict):
        raise SpecError("a job must be a mapping of fields", source=source)
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc, source) from exc


def load_job_yaml(text: str, source: str | None = None) -> JobSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", source=source) from exc
    return parse_job(data, source)


_WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


def load_workload_csv(path: str | Path) -> list[JobSpec]:
    """Jobs from a Pollux-format workload trace: ``name,time,application,num_replicas,batch_size``.

    Extra columns ``tenant`` and ``weight`` are honoured when present.
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
            for extra in ("tenant", "weight"):
                if row.get(extra):
                    data[extra] = row[extra]
            jobs.append(parse_job(data, source=f"{path}:{line}"))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise SpecError("job names must be unique", field="name", source=str(path))
    return jobs
