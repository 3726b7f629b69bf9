"""The running interpreter's environment, whatever made it (a virtualenv, uv, conda, a global
interpreter): the folders of its console scripts and site-packages, a subprocess environment
that finds its tools before any other on PATH, and a fresh virtualenv that sees its packages.
Standard library only: a test runs it from an interpreter that has nothing else."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Optional


def script_dirs() -> list[str]:
    """The folders of the running environment's console scripts (`vlprep`, `vltrain`), its own
    first: its install scheme's (a virtualenv's or conda environment's bin/), the interpreter's
    own folder, and the user scheme's when user site-packages are on. Not a base interpreter's:
    its `torchrun` or `ray` would start that interpreter (run them as `python -m`)."""
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    if site.ENABLE_USER_SITE:
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def console_script(name: str) -> str:
    """The running environment's console script NAME, never one of another environment that
    PATH happens to list first."""
    for folder in script_dirs():
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise AssertionError(f"no {name} console script in {script_dirs()} (pip install -e . in this environment)")


def running_env(env: Optional[dict] = None, **extra: str) -> dict:
    """ENV (default os.environ) for a subprocess that runs a shell recipe (`vlprep ...`,
    `"${PYTHON:-python}" -m ...`): PATH starts with this environment's script folders and
    PYTHON names this interpreter, so the recipe runs this environment's tools whatever PATH
    the suite was started with (a virtualenv's python run without activating it)."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.pathsep.join([*script_dirs(), *filter(None, [env.get("PATH")])])
    return {**env, "PYTHON": sys.executable, **extra}


def site_dirs() -> list[str]:
    """The running environment's site-packages folders, in the order it searches them: its own,
    the user's when enabled, a base interpreter's when a virtualenv sees them
    (--system-site-packages)."""
    known = set(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        known.add(site.getusersitepackages())
    known = {os.path.normcase(os.path.abspath(p)) for p in known}
    return [p for p in dict.fromkeys(sys.path) if p and os.path.normcase(os.path.abspath(p)) in known]


def hide_modules_line(names: Iterable[str], why: str) -> str:
    """A .pth line that makes importing the top-level modules NAMES a ModuleNotFoundError (saying
    WHY), as if they were not installed."""
    names = tuple(sorted(set(names)))
    return (
        "import sys; sys.meta_path.insert(0, type('Hidden', (), {'find_spec': staticmethod(lambda name, path=None, "
        f"target=None: (_ for _ in ()).throw(ModuleNotFoundError(name + {why!r}, name=name)) "
        f"if name.split('.')[0] in {names!r} else None)}})())\n"
    )


def venv_seeing_this_environment(path: Path, hide: Iterable[str] = (), why: str = " is hidden") -> Path:
    """A new virtualenv at PATH (no pip, no system site-packages of its own) whose interpreter
    sees the running environment's site-packages after its own (`site_dirs`, their .pth files
    processed, as --system-site-packages would for a global interpreter) and cannot import the
    top-level modules HIDE. Returns its python. Its `python -m pip` is the running environment's
    pip, installing into the new virtualenv."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=300)
    python = Path(path) / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    lines = [hide_modules_line(hide, why)] if hide else []  # first: nothing below imports a hidden module
    lines.append(f"import site; list(map(site.addsitedir, {site_dirs()!r}))\n")  # (a .pth line: no nested scope)
    (Path(purelib) / "running_environment.pth").write_text("".join(lines))
    return python
