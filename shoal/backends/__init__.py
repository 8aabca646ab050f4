"""Backends own time and devices: sim (virtual clock), local (real processes), ray."""
