"""Policies by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from shoal.core.types import Policy
from shoal.spec.errors import SpecError
from shoal.spec.suggest import did_you_mean


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
    "shoal-no-restart-horizon": _shoal_ablation(restart_horizon=False),
    "shoal-no-move-over-stop": _shoal_ablation(move_over_stop=False),
    "shoal-no-prior-progress": _shoal_ablation(prior_progress=0.0),
    "shoal-no-first-growth": _shoal_ablation(first_growth=0.0),
}


def make_policy(name: str) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise SpecError(f"unknown policy '{name}'{did_you_mean(name, POLICIES)}; choose from "
                        f"{', '.join(POLICIES)}", field="policy") from None
    return factory()


def tuned_policy(name: str, knobs: Sequence[str] | Mapping[str, object] = (),
                 restart_delay: float | None = None) -> Policy:
    """The policy ``name`` as a service or replay runs it: charging ``restart_delay`` seconds
    per restart (where the policy charges restarts) and with shoal knobs changed.

    ``knobs`` are ``KEY=VALUE`` strings (checked as :class:`~shoal.policy.shoal.ShoalKnobs`)
    or already converted values; they win over ``restart_delay`` when both set it. They apply
    to the shoal policies only: a SpecError says so for any other policy.
    """
    from shoal.policy.shoal import ShoalKnobs, ShoalPolicy

    policy = make_policy(name)
    if restart_delay is not None and hasattr(policy, "restart_delay"):
        policy.restart_delay = restart_delay
    overrides = dict(knobs) if isinstance(knobs, Mapping) else ShoalKnobs.overrides(knobs)
    if overrides:
        if not isinstance(policy, ShoalPolicy):
            raise SpecError(f"knobs tune the shoal policies, not '{name}'; drop the knobs or "
                            "choose shoal", field="knob")
        policy = policy.tuned(**overrides)
    return policy


def policy_knobs(policy: Policy) -> dict[str, object]:
    """The shoal knobs ``policy`` runs with that differ from the defaults ({} for others)."""
    from shoal.policy.shoal import ShoalPolicy

    return policy.knobs.changed() if isinstance(policy, ShoalPolicy) else {}


def is_shoal(name: str) -> bool:
    """Whether ``name`` is shoal or one of its ablations (the policies knobs apply to)."""
    return name == "shoal" or name.startswith("shoal-")


def select_policies(names: str, knobs: Sequence[str] = ()) -> tuple[list[str], dict[str, object]]:
    """Comma-separated policy names and ``KEY=VALUE`` shoal knobs, checked together: every name
    known, the knobs valid, and a shoal policy among the names when knobs are given."""
    from shoal.policy.shoal import ShoalKnobs

    policies = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in policies if name not in POLICIES]
    if unknown or not policies:
        hint = did_you_mean(unknown[0], POLICIES) if len(unknown) == 1 else ""
        raise SpecError(f"unknown policy {unknown or names!r}{hint}; choose from "
                        f"{', '.join(POLICIES)}", field="policy")
    overrides = ShoalKnobs.overrides(knobs)
    if overrides and not any(is_shoal(name) for name in policies):
        raise SpecError("knobs tune the shoal policies; add one to the policies", field="knob")
    return policies, overrides
