"""shoal: a demand-aware resource manager for multi-tenant deep-learning clusters."""

__version__ = "0.1.0"
