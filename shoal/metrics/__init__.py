"""Metrics and reports shared by the simulator and the real backends."""
