"""Scheduling policies: pure decisions over job views and cluster state."""

from shoal.policy.registry import POLICIES, make_policy

__all__ = ["POLICIES", "make_policy"]
