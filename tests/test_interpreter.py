"""The suite runs from whatever environment it was installed in (a virtualenv, uv, conda, a global
interpreter) and starts only that environment's tools: the interpreter helpers (tests/interpreter.py),
and no subprocess of a bare tool name that PATH could resolve to another environment's."""

import ast
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from interpreter import console_script, running_env, script_dirs, site_dirs

TESTS = REPO / "tests"


def _purelib(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip())


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}


def test_a_venv_made_from_a_virtualenv_sees_that_virtualenvs_packages(tmp_path):
    """The plain-install venv made from a virtualenv's interpreter. With
    --system-site-packages it saw the base interpreter's packages, not the virtualenv's; the
    .pth of `venv_seeing_this_environment` makes it see the virtualenv's, their .pth files
    included, and hides what it is told to hide."""
    outer = tmp_path / "outer"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(outer)], check=True, timeout=300)
    lib = _purelib(outer / "bin" / "python")
    (lib / "only_in_outer.py").write_text("")
    (lib / "dev_thing.py").write_text("")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "via_outer_pth.py").write_text("")  # as an editable install's .pth adds a folder
    (lib / "outer_extra.pth").write_text(f"{tmp_path / 'extra'}\n")
    make = (
        "import sys; from pathlib import Path; from interpreter import venv_seeing_this_environment as v; "
        "print(v(Path(sys.argv[1]), hide=['dev_thing'], why=' is hidden here'))"
    )
    made = subprocess.run(
        [str(outer / "bin" / "python"), "-c", make, str(tmp_path / "inner")],
        env={**_clean_env(), "PYTHONPATH": str(TESTS)},
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    inner = Path(made.stdout.strip())
    probe = (
        "import sys, importlib.util as u, only_in_outer, via_outer_pth; "
        "print(sys.prefix, u.find_spec('numpy') is None, sys.path.index(sys.argv[1]) < sys.path.index(sys.argv[2]))"
    )
    seen = subprocess.run(
        [str(inner), "-c", probe, str(_purelib(inner)), str(lib)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert seen.returncode == 0, seen.stderr
    # its own prefix; the outer's packages after its own; not the base interpreter's (numpy)
    assert seen.stdout.split() == [str(tmp_path / "inner"), "True", "True"]
    hidden = subprocess.run([str(inner), "-c", "import dev_thing"], env=_clean_env(), capture_output=True, text=True)
    assert hidden.returncode != 0 and "dev_thing is hidden here" in hidden.stderr
    # what the fixture did before: the base interpreter's packages, not the virtualenv's
    old = tmp_path / "old"
    subprocess.run(
        [str(outer / "bin" / "python"), "-m", "venv", "--without-pip", "--system-site-packages", str(old)],
        check=True,
        timeout=300,
        env=_clean_env(),
    )
    missing = subprocess.run([str(old / "bin" / "python"), "-c", "import only_in_outer"], capture_output=True)
    assert missing.returncode != 0


def test_the_site_dirs_are_this_environments():
    import numpy

    dirs = site_dirs()
    assert dirs and all(d in sys.path for d in dirs)
    assert any(Path(numpy.__file__).resolve().is_relative_to(Path(d).resolve()) for d in dirs)
    first = Path(dirs[0]).resolve()  # its own before any other (a user site comes first where enabled)
    assert first.is_relative_to(Path(sys.prefix).resolve()) or dirs[0] == site.getusersitepackages()


def _shebang_python(script: str) -> Path:
    """The interpreter a console script starts (pip's plain #! line, or its /bin/sh one for long paths)."""
    lines = Path(script).read_text(errors="replace").splitlines()
    if lines[0].startswith("#!/bin/sh"):
        return Path(re.search(r"""exec' "?([^" ]+)"?""", lines[1]).group(1))
    return Path(lines[0][2:].split()[0])


@pytest.mark.parametrize("name", ["vlprep", "vltrain"])
def test_console_scripts_start_this_interpreter(name):
    script = console_script(name)
    assert Path(script).parent.as_posix() in {Path(d).as_posix() for d in script_dirs()}
    python = _shebang_python(script)
    assert python.parent.resolve() == Path(sys.executable).parent.resolve() or python.samefile(sys.executable)


def test_running_env_finds_this_environments_tools_first(tmp_path):
    """A recipe's `vlprep` and `"${PYTHON:-python}"` are this environment's even when PATH
    lists nothing of it, or another environment's tools first."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    for name in ("vlprep", "python"):
        (decoy / name).write_text("#!/bin/sh\necho decoy\nexit 3\n")
        (decoy / name).chmod(0o755)
    env = running_env({**os.environ, "PATH": f"{decoy}{os.pathsep}/usr/bin{os.pathsep}/bin"})
    assert shutil.which("vlprep", path=env["PATH"]) == console_script("vlprep")
    recipe = '"${PYTHON:-python}" -c "import sys; print(sys.prefix)" && vlprep version'
    proc = subprocess.run(["bash", "-c", recipe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == sys.prefix and "decoy" not in proc.stdout


# Tools that a subprocess must not find on PATH: it would start another environment's (the
# global interpreter's `torchrun` runs the global interpreter, whatever the suite runs from).
# Start them as `sys.executable -m MODULE`, or a console script of this package through
# `interpreter.console_script`; shell recipes get `interpreter.running_env()`.
TOOLS = {"python", "python3", "pip", "vlprep", "vltrain", "torchrun", "ray", "pytest", "ruff", "img2dataset"}
# The calls that start a command list, and the names a command list is kept under first.
STARTERS = {"run", "Popen", "call", "check_call", "check_output", "run_measured", "execv", "execvp"}
COMMAND_NAMES = re.compile(r"^\w*(cmd|command|argv|args)\w*\s*[:=]", re.IGNORECASE)


def _bare_tools(path: Path) -> set[str]:
    """What PATH would resolve for a command in PATH's code: `shutil.which` of a tool (or of a
    name not written in the code), or a command list that starts with a tool's bare name, given
    to a call that starts it or kept in a variable."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
        if name == "which" and not any(k.arg == "path" for k in node.keywords):  # path=: a PATH of its own
            for arg in node.args[:1]:
                if not isinstance(arg, ast.Constant):
                    found.add(f"which({ast.unparse(arg)})")
                elif arg.value in TOOLS:
                    found.add(arg.value)
        commands = []
        if name in STARTERS:
            commands = node.args[:1]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and COMMAND_NAMES.search(ast.unparse(node)):
            commands = [node.value]
        elif isinstance(node, ast.Return):
            commands = [node.value]
        for command in commands:
            if isinstance(command, ast.List) and command.elts and isinstance(command.elts[0], ast.Constant):
                if command.elts[0].value in TOOLS:
                    found.add(command.elts[0].value)
    return found


def test_no_subprocess_takes_a_tool_from_path():
    roots = ("pipeline", "vl_models", "tests", "bench", "workflows")
    found = {
        (path.relative_to(REPO).as_posix(), tool)
        for root in roots
        for path in sorted((REPO / root).rglob("*.py"))
        for tool in _bare_tools(path)
    }
    assert found == set()
