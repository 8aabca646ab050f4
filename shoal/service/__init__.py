"""The scheduler service: the core driving the local backend, a job store and an HTTP API."""
