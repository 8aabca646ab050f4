"""shoal's policy: fairness-weighted goodput over device types, exact by MILP.

What is optimized. For every active job j and every configuration c (device type, nodes,
replicas; whole nodes across nodes, powers of two within one), with binary x[j, c]:

    minimize  sum_j w_j [ sum_c x[j, c] (rho[j, c] s[j, c])^p + s0^p (1 - sum_c x[j, c]) ]

* ``s[j, c]`` is j's goodput (throughput x statistical efficiency at the best batch size for c)
  over its goodput at its smallest configuration, per device type from the job's own models;
* ``rho[j, c]`` is the restart factor max(T - N S, 0) / (T + S) when a running job would move
  (1 to stay; 1 for a job that is not running), so a move must pay for its checkpoint-restore;
  with ``restart_horizon`` it is at most H / (H + S) too, H the job's estimated remaining time
  on c: Pollux's rule weighs a restart against the job's past, this against its future, so
  a job about to finish is not moved for a small gain (T is age, N restarts, S the charge);
  with ``move_over_stop``, a move's ``rho s`` is at least 1.01 times the no-allocation
  speedup, since stopping a running job costs it the same restart when it resumes: a job
  that must give up its devices then moves to free ones rather than waiting a round for them;
* ``p`` sets the fairness of the mean being maximized (for p > 0 the costs are negated, so the
  sum of ``w s^p`` is maximized; p = 1 is total goodput, p -> 0 proportional fairness, p < 0
  fairer still); no devices count as a speedup of ``idle_speedup`` < 1, so any allocation
  beats none (with p = -0.5 and 1.1^-2 this is Sia's penalty lambda = 1.1);
* ``w_j = weight_j * r_j * (1 + Q_j / H)``: ``Q_j`` is time spent waiting without devices and
  ``H`` one device-hour. The waiting term grows without bound, so no job starves: a waiting
  job's weight eventually exceeds any running job's.
* ``r_j`` turns remaining work into priority. ``R_j`` estimates j's remaining device-seconds
  from progress and attained service (least attained service while nothing is known): the
  extrapolation A (1 - P) / P, A attained device-seconds and P progress, shrunk toward the
  median extrapolation of the jobs with P >= ``prior_progress`` (kappa) as
  (P R + kappa R0) / (P + kappa). A job a second into training has A mostly start-up time
  and P near zero, so its extrapolation can be 100x its true size; it would rank last, be
  stopped and wait. The prior counts as kappa of progress, so by P = kappa the job's own
  extrapolation has half the say.
  With ``weighting="rank"`` (default), r_j follows heSRPT (Berg, Vesilo and Harchol-Balter,
  2020): for jobs whose speedup on n devices is n^sigma, all present, the allocation that
  minimizes mean JCT gives the k-th largest of M remaining jobs the share
  (k/M)^c - ((k-1)/M)^c with c = 1/(1 - sigma): jobs finish in SRPT order, yet every job
  keeps some devices, because strict priority wastes the long jobs' efficient first devices.
  For s = n^sigma this objective's continuous optimum gives job j a share proportional to
  w_j^(1/(1 - p sigma)), so r_j = share_j^(1 - p sigma) makes that optimum heSRPT's; the
  MILP then corrects it with each job's measured goodput curves, device types and restart
  costs. With ``weighting="power"``, r_j = (1 + R_j / H)^(-alpha): ``alpha`` trades fairness
  (0) against average JCT.

Candidate sizes. A job may grow to ``growth`` times the largest size it has measured (Pollux
bounds its model's extrapolation this way, at 2x) across nodes, and to any size within one
node at once (``whole_node``): inside a node, communication is fast and the model's
extrapolation is safe, while across nodes (yolov3's slow inter-node all-reduce) it is not.
A job that has not yet run on more than one node grows across nodes by at most
``first_growth`` (3) instead: its model has then never seen inter-node communication, and
its first multi-node sizes run slowest against their prediction.

Two scheduling choices go with the objective. The restart factor charges a move of job j
``restart_charge`` (4) times what one restart costs j, as its backend measured it
(``JobView.restart_seconds``: the local and Ray backends time each run from the decision, from
the old replicas' checkpoint when they trained on meanwhile, or from a crash retry's start, to
the first step; the simulator reports its modelled 30 s, so a move there is charged 120 s), or
``restart_delay`` (120 s) while j has measured none. Charging more than the restart itself
damps reallocations when jobs swap ranks. A preemption is not charged by default: the
no-allocation utility of a running job is the same as a waiting job's (``charge_preemption``
multiplies it by the job's restart factor too, since a preempted job pays the restart when it
resumes; docs/comparisons.md measures why it stays off). And the policy asks to decide when a job
arrives, not only at the next round (``on_arrival``), since one decision takes milliseconds.

Subject to: at most one configuration per job, per type the replicas and the whole nodes of
multi-node configurations within the type's devices and nodes, jobs' replica bounds, rigid
jobs only at their size, non-preemptible running jobs pinned. With these shapes any feasible
choice can be packed onto nodes (see :mod:`shoal.policy.configs`), so the MILP's optimum is
the optimum of the scheduling problem as stated; HiGHS solves it exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, get_args, get_origin, get_type_hints

import numpy as np
from pydantic import TypeAdapter, ValidationError

from shoal.core.types import ClusterState, Decision, Grant, JobView
from shoal.policy.configs import ConfigTable, Row, place_configs, solve_rows
from shoal.policy.goodput_matrix import (
    candidates,
    goodput_rows,
    max_replicas,
    replica_bound,
    restart_factor,
    restart_factors,
)
from shoal.spec.errors import SpecError
from shoal.spec.suggest import did_you_mean

DEVICE_HOUR = 3600.0
_LEAST_PREEMPTION_FACTOR = 0.01  # charge_preemption: a restart factor of 0 counts as this
# move_over_stop: a move is valued at this times the no-allocation speedup at least; the margin
# is well above the MILP's relative gap (1e-6), so the solver does not treat it as a tie.
_MOVE_OVER_STOP = 1.01


@dataclass(frozen=True)
class ShoalKnobs:
    p: float = -0.5
    idle_speedup: float = 1.1**-2  # utility of no devices, as a speedup below the smallest
    alpha: float = 0.5  # 0: fairness only; 1: strongly shortest-remaining-first
    # "rank": remaining-work weights from heSRPT's optimal shares by rank (see _rank_weights)
    # with an assumed speedup exponent ``sigma``; "power": (1 + R/H)^-alpha.
    weighting: Literal["rank", "power"] = "rank"
    sigma: float = 0.5
    # A move is charged ``restart_charge`` times what one restart costs the job, as its backend
    # measured it (JobView.restart_seconds), or ``restart_delay`` seconds while that is unknown.
    restart_charge: float = 4.0
    restart_delay: float = 120.0
    growth: float = 4.0  # how far beyond its largest measured size a job may be grown
    # At most this instead of ``growth`` for a job whose sizes so far all fit on one node (its
    # first multi-node sizes are predicted without any inter-node measurement); 0: ``growth``.
    first_growth: float = 3.0
    # Any single-node size (up to a whole node of a type) without measuring smaller ones first;
    # ``growth`` then limits only sizes across nodes.
    whole_node: bool = True
    heterogeneity: bool = True
    adapt_batch: bool = True
    restart_aware: bool = True
    # A running job's no-allocation utility pays its restart factor, like a move does.
    charge_preemption: bool = False
    # A move's charge is also weighed against the job's estimated remaining time on the new
    # configuration, so that a job near its end is not moved for a small gain.
    restart_horizon: bool = True
    # A running job's move is never valued below stopping it: a stopped job pays the same
    # restart when it resumes, a round or more later, so moving it at once is the better of
    # the two.
    move_over_stop: bool = True
    remaining_work: bool = True
    # The progress that the prior of the remaining-work estimate counts for (0: no prior).
    prior_progress: float = 0.02
    # Decide as soon as a job arrives (a decision takes milliseconds), not only every round.
    on_arrival: bool = True
    # Decide as soon as a job finishes, so its devices go to other jobs at once.
    on_completion: bool = True
    # Speedups relative to a job's smallest configuration (Sia) or to its best configuration
    # within an equal share of the cluster (Pollux); see the module docstring.
    baseline: Literal["smallest", "fair"] = "smallest"

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise SpecError(f"must be one of {', '.join(allowed)}, got "
                                f"{getattr(self, name)!r}", field=name)
        if not 0.0 <= self.sigma < 1.0:
            raise SpecError(f"the assumed speedup exponent must be in [0, 1), got {self.sigma}",
                            field="sigma")
        if not 0.0 < self.idle_speedup < 1.0:
            raise SpecError(f"must be in (0, 1), got {self.idle_speedup}", field="idle_speedup")
        if self.p == 0.0:
            raise SpecError("must not be 0 (use a small value for proportional fairness)",
                            field="p")
        if self.restart_delay < 0 or self.growth < 1:
            raise SpecError("restart_delay must be >= 0 and growth >= 1", field="restart_delay"
                            if self.restart_delay < 0 else "growth")
        if self.first_growth != 0 and self.first_growth < 1:
            raise SpecError(f"must be 0 (off) or >= 1, got {self.first_growth}",
                            field="first_growth")
        if self.restart_charge < 0:
            raise SpecError(f"must be >= 0, got {self.restart_charge}", field="restart_charge")
        if not 0.0 <= self.prior_progress < 1.0:
            raise SpecError(f"must be in [0, 1), got {self.prior_progress}",
                            field="prior_progress")

    @classmethod
    def overrides(cls, pairs: Sequence[str]) -> dict[str, object]:
        """``KEY=VALUE`` strings as knob overrides, converted and checked as ShoalKnobs."""
        defaults = cls().__dict__
        raw: dict[str, str] = {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in defaults:
                hint = did_you_mean(key, defaults) if sep else ""
                raise SpecError(f"'{pair}' is not KEY=VALUE with KEY one of "
                                f"{', '.join(defaults)}{hint}", field="knob")
            raw[key] = value.strip()
        try:
            knobs = TypeAdapter(cls).validate_python({**defaults, **raw})
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or ", ".join(raw)
            raise SpecError(f"knob {where}: {error['msg']}", field="knob") from None
        return {key: getattr(knobs, key) for key in raw}

    def changed(self) -> dict[str, object]:
        """The knobs that differ from their defaults (what a run must repeat to be replayed)."""
        defaults = type(self)()
        return {key: value for key, value in self.__dict__.items()
                if value != getattr(defaults, key)}


# The allowed values of the knobs typed as a Literal, checked on construction too (a plain
# dataclass does not enforce its annotations).
_CHOICES = {name: get_args(hint) for name, hint in get_type_hints(ShoalKnobs).items()
            if get_origin(hint) is Literal}


class ShoalPolicy:
    name = "shoal"

    def __init__(self, knobs: ShoalKnobs | None = None, **overrides):
        knobs = knobs or ShoalKnobs()
        if overrides:
            knobs = ShoalKnobs(**{**knobs.__dict__, **overrides})
        self.knobs = knobs
        self.adapts_batch_size = knobs.adapt_batch
        self.decides_on_arrival = knobs.on_arrival
        self.decides_on_completion = knobs.on_completion
        self._waiting_since: dict[str, float] = {}
        self.last_status = ""

    @property
    def restart_delay(self) -> float:
        """Seconds one restart is charged (the ``restart_delay`` knob); settable like the other
        policies' attribute, so a service's ``--restart-delay`` applies here too."""
        return self.knobs.restart_delay

    @restart_delay.setter
    def restart_delay(self, seconds: float) -> None:
        self.knobs = replace(self.knobs, restart_delay=float(seconds))

    def tuned(self, **overrides: object) -> ShoalPolicy:
        """This policy (same name) with some knobs changed."""
        policy = ShoalPolicy(self.knobs, **overrides)
        policy.name = self.name
        return policy

    def move_charge(self, job: JobView) -> float:
        """Seconds a move of ``job`` is charged: ``restart_charge`` times its own measured
        restart cost, or the ``restart_delay`` knob while the job has not measured one."""
        k = self.knobs
        if job.restart_seconds is None:
            return k.restart_delay
        return k.restart_charge * job.restart_seconds

    @staticmethod
    def _extrapolated(job: JobView) -> float:
        progress = job.hints.progress
        attained = job.attained_service
        return attained * (1 - progress) / progress if progress > 0 else attained

    def _remaining_work(self, jobs: Sequence[JobView]) -> dict[str, float]:
        """Each job's estimated remaining device-seconds for this decision: its extrapolation
        shrunk toward the median extrapolation of the jobs past ``prior_progress`` (see the
        module docstring)."""
        own = {job.name: self._extrapolated(job) for job in jobs}
        kappa = self.knobs.prior_progress
        known = [own[job.name] for job in jobs if job.hints.progress >= kappa] if kappa > 0 else []
        if not known:
            return own
        prior = float(np.median(known))
        return {job.name: own[job.name] if job.hints.progress <= 0 else
                (job.hints.progress * own[job.name] + kappa * prior) / (job.hints.progress + kappa)
                for job in jobs}

    def _rank_weights(self, jobs: Sequence[JobView],
                      remaining: dict[str, float]) -> dict[str, float]:
        """heSRPT (Berg et al. 2020): with speedup n^sigma and no arrivals, the mean-JCT optimal
        share of the k-th largest of M remaining jobs is (k/M)^c - ((k-1)/M)^c, c = 1/(1-sigma).
        The weight that makes this objective's optimum give that share is share^(1 - p sigma)."""
        k = self.knobs
        order = sorted(jobs, key=lambda job: remaining[job.name], reverse=True)
        m, c = len(order), 1.0 / (1.0 - k.sigma)
        out = {}
        for _, tied in itertools.groupby(order, key=lambda job: remaining[job.name]):
            group = [job.name for job in tied]  # equal remaining work: equal shares
            first = len(out)
            share = (((first + len(group)) / m) ** c - (first / m) ** c) / len(group)
            out.update(dict.fromkeys(group, share ** (1.0 - k.p * k.sigma)))
        return out

    def _weight(self, job: JobView, now: float, rank_weight: float | None,
                remaining: float) -> float:
        k = self.knobs
        weight = job.spec.weight
        if k.remaining_work:
            if rank_weight is not None:
                weight *= rank_weight
            else:
                weight *= (1 + remaining / DEVICE_HOUR) ** (-k.alpha)
        if job.allocation is None:
            since = self._waiting_since.setdefault(job.name, now)
            weight *= 1 + (now - since) / DEVICE_HOUR
        else:
            self._waiting_since.pop(job.name, None)
        return weight

    def decide(self, jobs: Sequence[JobView], cluster: ClusterState, now: float) -> Decision:
        if not jobs:
            return {}
        k = self.knobs
        table = ConfigTable.of(cluster)
        rows: list[Row] = []
        idle = np.zeros(len(jobs))
        forced: dict[int, int] = {}
        capacity = cluster.capacity()
        sign = 1.0 if k.p < 0 else -1.0
        fair = max(capacity // len(jobs), 1)
        node_size = {t: cluster.largest_node(t) for t in cluster.device_types}
        indices = [candidates(job, table, max_replicas(job, capacity, self._growth(job, node_size)),
                              replica_bound(job, capacity) if k.whole_node else None)
                   for job in jobs]
        goodputs = goodput_rows(jobs, table, indices, fixed_batch=not k.adapt_batch)
        remaining = self._remaining_work(jobs)
        ranked = self._rank_weights(jobs, remaining) if k.weighting == "rank" else {}
        for j, job in enumerate(jobs):
            weight = self._weight(job, now, ranked.get(job.name), remaining[job.name])
            stopped = k.idle_speedup  # the speedup that no devices count as
            idle[j] = sign * weight * stopped**k.p
            index, goodput = indices[j], goodputs[j]
            if not k.heterogeneity and job.hints.goodput:
                goodput = self._type_blind(goodput, table, index)
            index, goodput = index[goodput > 0], goodput[goodput > 0]
            if not len(index):
                rows.append(Row(index, goodput))
                continue
            current = table.index_of(job.allocation)
            base = goodput.min()
            if k.baseline == "fair":
                at_most_fair = table.replicas[index] <= fair
                if at_most_fair.any():
                    base = goodput[at_most_fair].max()
                stopped = k.idle_speedup * goodput.min() / base
            charge = self.move_charge(job)
            if k.restart_aware and k.charge_preemption and job.allocation is not None:
                # The no-allocation speedup times the restart factor, as for a move; floored,
                # since waiting must stay a finite choice (a move with factor 0 is dropped).
                stopped *= max(restart_factor(job, charge), _LEAST_PREEMPTION_FACTOR)
            idle[j] = sign * weight * stopped**k.p
            speedup = goodput / base
            if k.restart_aware:
                factors = restart_factors(job, index, current, charge)
                if k.restart_horizon:
                    factors = np.minimum(factors, self._horizon_factors(
                        job, index, goodput, current, charge, remaining[job.name]))
                speedup = speedup * factors
                if k.move_over_stop and job.allocation is not None:
                    moving = factors < 1.0
                    speedup[moving] = np.maximum(speedup[moving], stopped * _MOVE_OVER_STOP)
            with np.errstate(divide="ignore"):
                rows.append(Row(index, sign * weight * speedup**k.p))
            if not job.spec.preemptible and current is not None:
                forced[j] = current
        solution = solve_rows(rows, idle, table, forced)
        self.last_status = solution.status
        chosen = {jobs[j].name: table.configs[c]
                  for j, c in enumerate(solution.choice) if c is not None}
        current_allocs = {j.name: j.allocation for j in jobs if j.allocation is not None}
        placed = place_configs(chosen, current_allocs, cluster)
        fixed = {j.name: j.spec.batch_size for j in jobs}
        return {
            name: Grant(a.num_replicas, a.device_type, a.nodes,
                        None if k.adapt_batch else fixed[name])
            for name, a in placed.items()
        }

    def _growth(self, job: JobView, node_size: dict[str, int]) -> float:
        """``growth``, capped by ``first_growth`` while every size the job has run at fits on
        one node of its type (``node_size``: the largest node of each type)."""
        k = self.knobs
        across = any(replicas > node_size.get(dtype, replicas)
                     for dtype, replicas in job.hints.max_profiled_replicas.items())
        return k.growth if across or not k.first_growth else min(k.growth, k.first_growth)

    def _horizon_factors(self, job: JobView, index: np.ndarray, goodput: np.ndarray,
                         current: int | None, charge: float, remaining: float) -> np.ndarray:
        """Per candidate, H / (H + charge): H the job's remaining time there (its remaining
        work over the candidate's goodput), 1 to stay. A running job that has not reported
        progress gets 1 everywhere (its remaining work is unknown)."""
        factors = np.ones(len(index))
        here = np.nonzero(index == current)[0] if current is not None else []
        if job.allocation is None or not len(here) or job.hints.progress <= 0:
            return factors
        # Remaining device-seconds over the current devices, in seconds at the current goodput.
        work = remaining / job.allocation.num_replicas * goodput[here[0]]
        horizon = work / goodput
        factors = horizon / (horizon + charge)
        factors[here] = 1.0
        return factors

    @staticmethod
    def _type_blind(goodput: np.ndarray, table: ConfigTable, index: np.ndarray) -> np.ndarray:
        """Goodput as if every type performed like the best-known one at the same shape."""
        by_shape: dict[tuple[int, int], float] = {}
        shapes = list(zip(table.nodes[index].tolist(), table.replicas[index].tolist(),
                          strict=True))
        for g, key in zip(goodput, shapes, strict=True):
            by_shape[key] = max(by_shape.get(key, 0.0), g)
        return np.array([by_shape[key] for key in shapes])
