"""Request arrivals: the Azure LLM traces and Gamma processes, assigned to models."""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from datetime import datetime
from functools import cached_property
from pathlib import Path

import numpy as np

from shoal.spec.errors import SpecError

AZURE_TRACE_DIR = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "azure-llm-2023"


@dataclass(frozen=True)
class Workload:
    """Requests sorted by arrival time; every array has one entry per request.

    ``work_s`` is an optional per-request service time (seconds) used by work-based latency
    models (closed-form checks, profiled real servers); LLM profiles use the token counts.
    """

    arrival_s: np.ndarray
    model: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    work_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("model", "prompt_tokens", "output_tokens"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"workload field '{name}' has {len(getattr(self, name))} entries, "
                                 f"arrival_s has {n}")
        if n > 1 and np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("workload arrivals must be sorted by time")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @cached_property
    def prompt_list(self) -> list[int]:
        return self.prompt_tokens.tolist()

    @cached_property
    def output_list(self) -> list[int]:
        return self.output_tokens.tolist()

    @property
    def num_models(self) -> int:
        return int(self.model.max()) + 1 if len(self) else 0

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    def window(self, start_s: float, end_s: float) -> Workload:
        """The requests arriving in [start_s, end_s)."""
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s])
        return self._take(slice(lo, hi))

    def sample_windows(self, window_s: float, keep_every: int) -> tuple[Workload, np.ndarray]:
        """Every ``keep_every``-th window of ``window_s`` seconds, closed up in time: a shorter
        workload with the same burst structure inside windows. Returns it and the kept indices."""
        window = np.floor((self.arrival_s - self.arrival_s[0]) / window_s).astype(np.int64)
        keep = np.flatnonzero(window % keep_every == 0)
        shift = (window[keep] - window[keep] // keep_every) * window_s
        sampled = self._take(keep)
        return replace(sampled, arrival_s=sampled.arrival_s - shift), keep

    def head(self, n: int) -> Workload:
        return self._take(slice(0, n))

    def _take(self, index: slice | np.ndarray) -> Workload:
        return Workload(
            self.arrival_s[index],
            self.model[index],
            self.prompt_tokens[index],
            self.output_tokens[index],
            None if self.work_s is None else self.work_s[index],
        )


def azure_trace_path(name: str) -> Path:
    """Path of the shared Azure trace ``code`` or ``conv`` (or any CSV path given as is)."""
    path = Path(name)
    if path.exists():
        return path
    candidate = (AZURE_TRACE_DIR / f"AzureLLMInferenceTrace_{name}.csv").resolve()
    if candidate.exists():
        return candidate
    raise SpecError(
        f"'{name}' is neither a CSV file nor an Azure trace name (code, conv) found in "
        f"{AZURE_TRACE_DIR.resolve()}",
        field="trace",
    )


def read_trace(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival seconds from the first request, context tokens, generated tokens)."""
    path = azure_trace_path(str(path))
    times: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(reader.fieldnames or [])
        if missing:
            raise SpecError(f"trace lacks columns {sorted(missing)}; expected "
                            "TIMESTAMP,ContextTokens,GeneratedTokens", source=str(path))
        for row in reader:
            # Python parses at most 6 fractional digits; the trace has 7.
            stamp = row["TIMESTAMP"].strip()
            if "." in stamp:
                head, frac = stamp.split(".", 1)
                stamp = f"{head}.{frac[:6]}"
            times.append(datetime.fromisoformat(stamp).timestamp())
            prompt.append(int(row["ContextTokens"]))
            output.append(max(1, int(row["GeneratedTokens"])))
    arrival = np.asarray(times, dtype=float)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order] - arrival[order][0]
    return arrival, np.asarray(prompt)[order], np.asarray(output)[order]


def model_popularity(num_models: int, skew: float) -> np.ndarray:
    """Zipf-like shares: model i gets weight 1/(i+1)**skew (skew 0 = uniform)."""
    weights = 1.0 / np.arange(1, num_models + 1) ** skew
    return weights / weights.sum()


def trace_workload(
    path: str | Path,
    num_models: int,
    rng: np.random.Generator,
    rate_scale: float = 1.0,
    popularity_skew: float = 1.0,
    cv: float | None = None,
    window_s: float = 60.0,
    max_requests: int | None = None,
) -> Workload:
    """Azure trace requests spread over ``num_models`` models.

    Arrival times are the trace's TIMESTAMPs divided by ``rate_scale`` (same burst shape, higher
    rate). With ``cv`` given, each model's arrivals are regenerated per ``window_s`` window as a
    Gamma process with that window's rate and the given coefficient of variation (AlpaServe's way
    of varying burstiness while keeping the trace's rate over time).
    """
    if rate_scale <= 0:
        raise SpecError("must be > 0", field="rate_scale")
    arrival, prompt, output = read_trace(path)
    arrival = arrival / rate_scale
    shares = model_popularity(num_models, popularity_skew)
    model = rng.choice(num_models, size=len(arrival), p=shares)
    if cv is not None:
        arrival, model, prompt, output = _refit_gamma(
            arrival, model, prompt, output, cv, window_s / rate_scale, rng)
    wl = Workload(arrival, model.astype(np.int64), prompt, output)
    return wl.head(max_requests) if max_requests else wl


def _refit_gamma(arrival, model, prompt, output, cv, window_s, rng):
    horizon = float(arrival[-1]) + 1e-9
    edges = np.arange(0.0, horizon + window_s, window_s)
    new_t: list[np.ndarray] = []
    new_m: list[np.ndarray] = []
    for m in np.unique(model):
        times = arrival[model == m]
        counts = np.histogram(times, bins=edges)[0]
        for start, count in zip(edges[:-1], counts, strict=True):
            if count == 0:
                continue
            t = _gamma_points(int(count), cv, window_s, rng) + start
            new_t.append(t)
            new_m.append(np.full(len(t), m))
    t = np.concatenate(new_t)
    m = np.concatenate(new_m)
    order = np.argsort(t, kind="stable")
    # Token counts are resampled from the trace so work per request keeps its distribution.
    pick = rng.integers(0, len(prompt), size=len(t))
    return t[order], m[order], prompt[pick], output[pick]


def _gamma_points(count: int, cv: float, window_s: float, rng: np.random.Generator) -> np.ndarray:
    """Exactly ``count`` points in a window with Gamma(cv) gaps, rescaled to fit the window."""
    shape = 1.0 / cv**2
    gaps = rng.gamma(shape, 1.0, size=count + 1)
    return (np.cumsum(gaps)[:-1] / gaps.sum()) * window_s


def gamma_arrivals(
    rate: float, cv: float, duration_s: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times in [0, duration_s) of a renewal process with Gamma inter-arrival times.

    Mean inter-arrival 1/rate, coefficient of variation ``cv`` (cv=1 is Poisson).
    """
    if rate <= 0 or cv <= 0:
        raise SpecError(f"Gamma arrivals need rate > 0 and cv > 0 (got rate={rate}, cv={cv})",
                        field="cv")
    shape = 1.0 / cv**2
    scale = 1.0 / (rate * shape)
    expected = rate * duration_s
    times: list[np.ndarray] = []
    last = 0.0
    while last < duration_s:
        n = int(expected + 6 * np.sqrt(expected) + 16)
        gaps = rng.gamma(shape, scale, size=n)
        chunk = last + np.cumsum(gaps)
        times.append(chunk)
        last = float(chunk[-1])
    out = np.concatenate(times)
    return out[out < duration_s]


def gamma_workload(
    rates: list[float],
    cv: float,
    duration_s: float,
    rng: np.random.Generator,
    prompt_tokens: int = 512,
    output_tokens: int = 16,
) -> Workload:
    """Independent Gamma arrivals per model (rate ``rates[m]``), fixed token counts."""
    times = [gamma_arrivals(r, cv, duration_s, rng) for r in rates]
    arrival = np.concatenate(times)
    model = np.concatenate([np.full(len(t), m) for m, t in enumerate(times)])
    order = np.argsort(arrival, kind="stable")
    n = len(arrival)
    return Workload(arrival[order], model[order].astype(np.int64),
                    np.full(n, prompt_tokens), np.full(n, output_tokens))


def with_work(workload: Workload, work_s: np.ndarray) -> Workload:
    """The same requests with explicit per-request service times."""
    return replace(workload, work_s=np.asarray(work_s, dtype=float))
