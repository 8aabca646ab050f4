"""Readable errors for bad user input: which field, what is wrong, how to fix it."""

from __future__ import annotations

from pydantic import ValidationError


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


def from_validation_error(exc: ValidationError, source: str | None = None) -> SpecError:
    """Turn pydantic's error list into one SpecError naming the first bad field."""
    lines = []
    first_field = None
    for err in exc.errors():
        field = _location(tuple(err.get("loc", ()))) or "(root)"
        first_field = first_field or field
        got = err.get("input")
        hint = f" (got {got!r})" if not isinstance(got, dict | list) else ""
        lines.append(f"field '{field}': {err['msg']}{hint}")
    message = "; ".join(lines)
    error = SpecError(message, field=None, source=source)
    error.field = first_field
    return error
