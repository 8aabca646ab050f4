"""Serving on the shared cluster: request-level simulator, placement, autoscaling, real server."""
