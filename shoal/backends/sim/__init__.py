"""Trace-driven simulator backend."""
