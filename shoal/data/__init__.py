"""Builders of the evaluation data shoal ships (derived from ../shared/data, reproducibly)."""
