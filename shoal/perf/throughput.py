"""The Pollux throughput model of data-parallel training, and its online fit.

Time of one optimizer step of a job with ``r`` replicas over ``n`` nodes, micro-batch ``m`` per
replica and ``s`` extra gradient-accumulation steps:

    T_grad = alpha_c + beta_c * m                               (forward + backward)
    T_sync = alpha_r + beta_r * max(r - 2, 0)      one node, r > 1
           = alpha_n + beta_n * max(r - 2, 0)      n > 1 nodes
    T_iter = s * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)

``gamma`` in [1, 10] models how much gradient synchronization overlaps the backward pass.
The parameters are fitted to the step times a job has actually observed, minimizing the RMS
log error of compute and step time with small regularizers toward optimistic scaling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import scipy.optimize
from numpy.typing import ArrayLike

_TINY = 1e-8
_PINNED_BELOW = 1e3 * _TINY  # a warm-start value this small was a pinned term
# L-BFGS-B stops when one iteration lowers the objective by less than ftol (absolute here, as
# the objective is below 1). At 1e-7 a fit could stop on a plateau with step times 8% off,
# where the point it stopped at depended on the CPU and the numpy/scipy build; at 1e-10 it
# reaches the optimum (tests/sim/test_perf.py: 189 iterations there instead of 68; shoal on
# Pollux workload 1 took 15.2 CPU-seconds to simulate instead of 11.7).
_FTOL = 1e-10


@dataclass(frozen=True, slots=True)
class PerfParams:
    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def as_tuple(self) -> tuple[float, ...]:
        # Spelled out: dataclasses.astuple deep-copies and is slow on hot paths.
        return (self.alpha_c, self.beta_c, self.alpha_n, self.beta_n, self.alpha_r, self.beta_r,
                self.gamma)

    def as_array(self) -> np.ndarray:
        return np.array(self.as_tuple(), dtype=float)


def borrow_scaling(own: PerfParams, explored: PerfParams, local_bsz: float) -> PerfParams:
    """A device type a job has run on one replica only, scaled like a type it has run larger on.

    Sia's bootstrapping: the explored type's parameters, with its compute terms scaled so that
    one replica at ``local_bsz`` takes the compute time measured on this type. One replica says
    nothing about this type's communication, so the explored type's network terms stand in.
    """
    ratio = (own.alpha_c + own.beta_c * local_bsz) / (explored.alpha_c
                                                      + explored.beta_c * local_bsz)
    return PerfParams(explored.alpha_c * ratio, explored.beta_c * ratio, explored.alpha_n,
                      explored.beta_n, explored.alpha_r, explored.beta_r, explored.gamma)


def projected_params(device_type: str, profiled: Mapping[str, int],
                     fit: Callable[[str], PerfParams | None],
                     local_bsz: Callable[[str], float]) -> PerfParams | None:
    """A job's throughput parameters on ``device_type``: its own fit (``fit(type)``), except
    where it has run one replica of the type only (``profiled``: the most replicas it ran per
    type) and more of another; then :func:`borrow_scaling` from the type it ran most on, at
    ``local_bsz(device_type)``. None where it has not run on the type."""
    own = fit(device_type)
    if own is None or profiled.get(device_type, 0) > 1:
        return own
    explored = max(profiled, key=lambda d: profiled[d])
    if explored == device_type or profiled[explored] <= 1:
        return own
    other = fit(explored)
    return own if other is None else borrow_scaling(own, other, local_bsz(device_type))


def predict_grad_time(params: PerfParams, atomic_bsz: ArrayLike) -> np.ndarray:
    """Forward and backward time of one micro-batch."""
    return params.alpha_c + params.beta_c * np.asarray(atomic_bsz, dtype=float)


def predict_sync_time(params: PerfParams, num_nodes: ArrayLike, num_replicas: ArrayLike):
    """All-reduce time, bottlenecked by the slowest link the replicas span."""
    nodes = np.asarray(num_nodes)
    replicas = np.asarray(num_replicas)
    inter = nodes > 1
    intra = replicas > 1
    alpha = np.where(inter, params.alpha_n, np.where(intra, params.alpha_r, _TINY))
    beta = np.where(inter, params.beta_n, np.where(intra, params.beta_r, _TINY))
    return alpha + beta * np.maximum(replicas - 2, _TINY)


def predict_step_time(
    params: PerfParams,
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> np.ndarray:
    """Seconds per optimizer step, including ``accum_steps`` extra micro-batches."""
    grad = predict_grad_time(params, atomic_bsz)
    sync = predict_sync_time(params, num_nodes, num_replicas)
    g = params.gamma
    optim = (grad**g + sync**g) ** (1.0 / g)
    return np.asarray(accum_steps) * grad + optim


def _objective(theta, bsz, log_grad_obs, log_step_obs, inter, intra, single, retro):
    # Hot path of every refit: plain float arithmetic on the parameters, few array ops.
    ac, bc, an, bn, ar, br, g = (float(v) for v in theta)
    grad = ac + bc * bsz
    sync = inter * (an + bn * retro) + intra * (ar + br * retro) + single * (_TINY + _TINY * retro)
    log_grad = np.log(grad)
    log_sync = np.log(sync)
    grad_g = np.exp(g * log_grad)
    sync_g = np.exp(g * log_sync)
    total = grad_g + sync_g
    log_total = np.log(total)
    d1 = log_grad - log_grad_obs
    d2 = log_total / g - log_step_obs
    count = len(bsz)
    err1 = math.sqrt(d1.dot(d1) / count)
    err2 = math.sqrt(d2.dot(d2) / count)
    value = err1 + err2 + 1e-3 * (g - 1) ** 2 + 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)

    w1 = d1 / (count * max(err1, 1e-12))
    w2 = d2 / (count * max(err2, 1e-12))
    d_grad = w1 / grad + w2 * (grad_g / grad) / total
    d_sync = w2 * (sync_g / sync) / total
    d_g = w2.dot(-log_total / g**2 + (grad_g * log_grad + sync_g * log_sync) / (g * total))
    d_sync_inter = d_sync * inter
    d_sync_intra = d_sync * intra
    jac = np.array(
        [
            d_grad.sum(),
            d_grad.dot(bsz),
            d_sync_inter.sum() - 2e-2 * bn**2 / an**3,
            d_sync_inter.dot(retro) + 2e-2 * bn / an**2,
            d_sync_intra.sum() - 2e-2 * br**2 / ar**3,
            d_sync_intra.dot(retro) + 2e-2 * br / ar**2,
            d_g + 2e-3 * (g - 1),
        ]
    )
    return value, jac


def fit_perf_params(
    num_nodes: ArrayLike,
    num_replicas: ArrayLike,
    atomic_bsz: ArrayLike,
    grad_time: ArrayLike,
    step_time: ArrayLike,
    warm_start: PerfParams | None = None,
) -> PerfParams:
    """Fit :class:`PerfParams` to observed (compute, step) times of the given configurations.

    Parameters that the observations cannot identify are pinned, as Pollux does: the constant
    compute term when one micro-batch size was seen, the inter-node terms without multi-node
    runs, the intra-node terms without single-node multi-replica runs, and the retrogression
    terms without runs of more than two replicas, and the inter-node retrogression while the
    runs across nodes have all had the same replica count (the slope needs two counts; pinned,
    the sync time measured there holds for larger sizes, as a ring all-reduce's bandwidth term
    does). Without multi-node runs the inter-node terms are then set to at least 1.1x the
    intra-node ones (a network crossing is never faster).

    ``warm_start`` (the previous fit of the same job) starts the search there instead of at
    the generic initial point: refits after one more observation then take a few iterations.

    The search runs on the micro-batch in units of its largest observed value. In samples, the
    per-sample term of a large-batch model (a recommender at 16384 samples per step) is four
    orders of magnitude below the constant term, and L-BFGS-B stops far from the optimum: one
    observation at 16384 was fitted 65% slow.
    """
    nodes = np.asarray(num_nodes, dtype=float)
    replicas = np.asarray(num_replicas, dtype=float)
    bsz = np.asarray(atomic_bsz, dtype=float)
    grad_obs = np.asarray(grad_time, dtype=float)
    step_obs = np.asarray(step_time, dtype=float)

    init = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [_TINY, _TINY] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]

    def pin(index: int, value: float) -> None:
        init[index] = lower[index] = upper[index] = value

    if len(np.unique(bsz)) == 1:
        pin(0, float(np.mean(grad_obs)) / 2)
    if not np.any(nodes > 1):
        pin(2, _TINY)
        pin(3, _TINY)
    if not np.any((nodes == 1) & (replicas > 1)):
        pin(4, _TINY)
        pin(5, _TINY)
    if not np.any(replicas > 2):
        pin(3, _TINY)
        pin(5, _TINY)
    if len(np.unique(replicas[nodes > 1])) == 1:
        # One replica count across nodes fits any split of its sync time between the constant
        # and the per-replica term; L-BFGS-B, whose steep direction is the slope, put most of
        # it there, and extrapolated steeply growing sync time to larger sizes.
        pin(3, _TINY)

    scale = float(bsz.max())
    if warm_start is not None:
        warm = warm_start.as_array().copy()
        warm[1] *= scale
        # A term the previous fit had pinned near zero (no observation of it then) starts from
        # the generic point: from ~1e-8 the bn/an regularizer's gradient is so steep that the
        # search stalls there, and the first multi-node run would be fitted as free of network.
        init = [
            i if v <= _PINNED_BELOW and lo < hi else float(np.clip(v, lo, hi))
            for v, i, lo, hi in zip(warm, init, lower, upper, strict=True)
        ]
    inter = (nodes > 1).astype(float)
    intra = ((nodes <= 1) & (replicas > 1)).astype(float)
    single = 1.0 - inter - intra
    retro = np.maximum(replicas - 2, _TINY)
    args = (bsz / scale, np.log(grad_obs), np.log(step_obs), inter, intra, single, retro)
    result = scipy.optimize.minimize(
        _objective,
        np.array(init),
        args=args,
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(lower, upper, strict=True)),
        options={"ftol": _FTOL},
    )
    theta = result.x.copy()
    theta[1] /= scale
    if not np.any(nodes > 1):
        theta[2] = max(theta[2], theta[4] * 1.1)
        theta[3] = max(theta[3], theta[5] * 1.1)
    return PerfParams(*map(float, theta))
