"""The input files of item builders (`vlprep build-task`, `vlprep build-mixture`): refused
before they are read unless each is a regular file. A folder would fail with a raw
IsADirectoryError, and a FIFO would block the read for ever."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pipeline.errors import ConfigError


def file_problem(path: Path) -> Optional[str]:
    """Why `path` cannot be read as an input file (``no such file``, ``a folder``, ``not a
    regular file``: a pipe, a device, a socket); None when it is a regular file (or a link
    to one)."""
    path = Path(path)
    if path.is_file():
        return None
    if not path.exists():
        return "no such file"
    return "a folder" if path.is_dir() else "not a regular file"


def check_input_file(path: Path, what: str) -> Path:
    """`path`, when it is a regular file; otherwise a ConfigError: ``WHAT PATH: REASON``."""
    problem = file_problem(path)
    if problem:
        raise ConfigError(f"{what} {path}: {problem}")
    return Path(path)
