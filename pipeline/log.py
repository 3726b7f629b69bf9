"""Logging setup, done once by the CLIs (library code only calls logging.getLogger)."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.logging import RichHandler

console = Console(stderr=True)


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
        force=True,
    )
    for noisy in ("filelock", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
