"""The console the CLI prints tables on."""

from __future__ import annotations

from rich.console import Console

# Piped output (a file, a CI log) has no terminal width; rich would then squeeze tables into
# 80 columns and cut cells short. This width fits every table the CLI prints.
PIPED_WIDTH = 160


def output_console(stderr: bool = False) -> Console:
    """A console of the terminal's width, or :data:`PIPED_WIDTH` when output is piped."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=PIPED_WIDTH)
    return console
