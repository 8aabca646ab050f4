"""'Did you mean' hints for names a user mistyped (fields, presets, policies, knobs)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, choices: Iterable[str]) -> str | None:
    """The choice ``name`` most likely misspells, or None when none is close.

    Case, '-' and '_' are ignored first (``hetero64`` -> ``hetero-64``, ``Target-Epochs`` ->
    ``target_epochs``); then difflib's similarity ratio must reach 0.75, which accepts one
    dropped, doubled or swapped letter in a word of six or more.
    """
    options = list(choices)

    def fold(text: str) -> str:
        return text.lower().replace("-", "").replace("_", "")

    folded = fold(name)
    for option in options:
        if fold(option) == folded:
            return option
    match = difflib.get_close_matches(folded, [fold(o) for o in options], n=1, cutoff=0.75)
    if not match:
        return None
    return next(o for o in options if fold(o) == match[0])


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for a close choice, else an empty string."""
    guess = closest(name, choices)
    return f" (did you mean '{guess}'?)" if guess is not None else ""
