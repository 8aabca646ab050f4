"""Policies by name."""

from __future__ import annotations

from collections.abc import Callable

from shoal.core.types import Policy


def _fifo() -> Policy:
    from shoal.policy.fifo import FifoPolicy

    return FifoPolicy()


def _tiresias() -> Policy:
    from shoal.policy.tiresias import TiresiasPolicy

    return TiresiasPolicy()


def _optimus() -> Policy:
    from shoal.policy.optimus import OptimusPolicy

    return OptimusPolicy()


def _pollux() -> Policy:
    from shoal.policy.pollux import PolluxPolicy

    return PolluxPolicy()


def _gavel() -> Policy:
    from shoal.policy.gavel import GavelPolicy

    return GavelPolicy()


def _sia() -> Policy:
    from shoal.policy.sia import SiaPolicy

    return SiaPolicy()


def _shoal() -> Policy:
    from shoal.policy.shoal import ShoalPolicy

    return ShoalPolicy()


def _shoal_ablation(**switches) -> Callable[[], Policy]:
    def factory() -> Policy:
        from shoal.policy.shoal import ShoalPolicy

        policy = ShoalPolicy(**switches)
        policy.name = "shoal-" + "-".join(f"no-{k.replace('_', '-')}" for k in switches)
        return policy

    return factory


POLICIES: dict[str, Callable[[], Policy]] = {
    "fifo": _fifo,
    "tiresias": _tiresias,
    "optimus": _optimus,
    "pollux": _pollux,
    "gavel": _gavel,
    "sia": _sia,
    "shoal": _shoal,
    # Ablations of shoal, each with one feature turned off.
    "shoal-no-heterogeneity": _shoal_ablation(heterogeneity=False),
    "shoal-no-adapt-batch": _shoal_ablation(adapt_batch=False),
    "shoal-no-restart-aware": _shoal_ablation(restart_aware=False),
    "shoal-no-remaining-work": _shoal_ablation(remaining_work=False),
    "shoal-no-on-arrival": _shoal_ablation(on_arrival=False),
    "shoal-no-on-completion": _shoal_ablation(on_completion=False),
    "shoal-no-whole-node": _shoal_ablation(whole_node=False),
}


def make_policy(name: str) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}'; choose from {', '.join(POLICIES)}") from None
    return factory()
