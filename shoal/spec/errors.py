"""Readable errors for bad user input: which field, what is wrong, how to fix it."""

from __future__ import annotations

import json
from typing import get_args

from pydantic import BaseModel, ValidationError

from shoal.spec.suggest import closest


class SpecError(ValueError):
    """A job, cluster or workload description is invalid.

    ``field`` is the dotted path of the offending field (e.g. ``jobs[3].batch_size``), so the
    CLI and the HTTP API can point at it.
    """

    def __init__(self, message: str, field: str | None = None, source: str | None = None):
        self.field = field
        self.source = source
        prefix = f"{source}: " if source else ""
        where = f"field '{field}': " if field else ""
        super().__init__(f"{prefix}{where}{message}")


def _location(loc: tuple) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def _shown(value: object, limit: int = 80) -> str:
    """The offending value as the message quotes it, cut short if long."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The pydantic model a field holds, looking inside Optional, list and tuple."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _fields_at(model: type[BaseModel], path: tuple) -> list[str] | None:
    """The field names the model nested at ``path`` accepts (None where that is not a model)."""
    current: type[BaseModel] | None = model
    for item in path:
        if isinstance(item, int):
            continue  # an index into a list: its items are the field's model
        field = current.model_fields.get(item) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
    if current is None:
        return None
    return [info.alias or name for name, info in current.model_fields.items()]


def _fix(err: dict, model: type[BaseModel] | None) -> str:
    """How to fix one error, where more can be said than pydantic's message."""
    loc, got = tuple(err.get("loc", ())), err.get("input")
    if err.get("type") == "extra_forbidden" and model is not None and loc:
        allowed = _fields_at(model, loc[:-1])
        if allowed:
            guess = closest(str(loc[-1]), allowed)
            if guess is not None:
                return f"; did you mean '{guess}'?"
            return f"; accepted fields here: {', '.join(allowed)}"
    if err.get("type") == "list_type" and isinstance(got, str) and got.strip():
        return f"; write it as a list, e.g. {json.dumps(got.split())}"
    return ""


def from_validation_error(exc: ValidationError, source: str | None = None,
                          model: type[BaseModel] | None = None) -> SpecError:
    """Turn pydantic's error list into one SpecError naming the first bad field.

    With ``model`` (the model validated), a misspelled field gets the closest accepted name,
    or the list of accepted names where none is close.
    """
    lines = []
    first_field = None
    for err in exc.errors():
        field = _location(tuple(err.get("loc", ()))) or "(root)"
        first_field = first_field or field
        got = err.get("input")
        hint = f" (got {_shown(got)})" if not isinstance(got, dict | list) else ""
        lines.append(f"field '{field}': {err['msg']}{hint}{_fix(err, model)}")
    message = "; ".join(lines)
    error = SpecError(message, field=None, source=source)
    error.field = first_field
    return error
