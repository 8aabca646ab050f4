"""Discrete-event, request-level simulator of model serving."""
