"""CLI plumbing shared by `vlprep` and `vltrain`: the Typer app with its logging flags,
and the one mapping of named errors to a one-line message and an exit code.
Library code only calls logging.getLogger(__name__)."""

from __future__ import annotations

import functools
import logging
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from pipeline.errors import describe, exit_code

console = Console(stderr=True)


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    """Log to stderr: through rich on a terminal; as plain, unwrapped, timestamped lines
    when stderr is a file or a pipe (batch jobs: one greppable line per record)."""
    level = logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
        fmt, datefmt = "%(message)s", "[%X]"
    else:
        handler = logging.StreamHandler(sys.stderr)
        fmt, datefmt = "%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"
    logging.basicConfig(level=level, format=fmt, datefmt=datefmt, handlers=[handler], force=True)
    for noisy in ("filelock", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def cli_app(name: str, help: str, cls: Optional[type] = None) -> typer.Typer:
    """A Typer app whose callback takes -v/--verbose and -q/--quiet and sets up logging;
    `cls`: its click group class (a `typer.core.TyperGroup`), where not Typer's own."""
    app = typer.Typer(
        name=name,
        help=help,
        cls=cls,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="markdown",
    )

    @app.callback()
    def _configure(
        verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="More log output (debug)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors."),
    ) -> None:
        setup_logging(verbose, quiet)

    return app


def named_errors(fn):
    """Decorate a command: a named error (see `pipeline.errors`) becomes one line on
    stderr and its exit code; anything else is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            code = exit_code(err)
            if code is None:
                raise
            console.print(f"[red]error:[/red] {escape(describe(err))}", soft_wrap=True)  # one greppable line
            raise typer.Exit(code) from None

    return wrapper
