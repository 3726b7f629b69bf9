"""Every command explains itself; the installed console scripts start and list their commands."""

import subprocess

import pytest
from helpers import make_records, run_cli, run_vltrain
from interpreter import console_script

from pipeline.store import write_records

VLPREP = [
    "download",
    "datasets",
    "inspect",
    "verify",
    "import",
    "export",
    "formats",
    "version",
    "demo",
]  # demo: a plugin command (entry point group vlprep.commands)


def _run(*args):
    return subprocess.run(
        [console_script(args[0]), *args[1:]],  # this environment's, not the first on PATH
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "160", "PATH": __import__("os").environ["PATH"]},
    )


def test_vlprep_help_lists_commands():
    proc = _run("vlprep", "--help")
    assert proc.returncode == 0
    for command in VLPREP:
        assert command in proc.stdout


@pytest.mark.parametrize("command", VLPREP)
def test_each_vlprep_command_has_help(command):
    proc = run_cli(command, "--help")
    assert proc.returncode == 0 and "Usage" in proc.stdout and len(proc.stdout) > 200


def _commands():
    import typer

    from pipeline.cli import app as vlprep
    from pipeline.cli import load_plugins
    from vl_models.cli import app as vltrain

    load_plugins()  # the commands that other packages attach, as `vlprep` does when it starts

    return [
        (cli, app, name, command)
        for cli, app in (("vlprep", vlprep), ("vltrain", vltrain))
        for name, command in typer.main.get_command(app).commands.items()
    ]


@pytest.mark.parametrize("cli, app, name, command", _commands(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_explains_itself_and_each_option(cli, app, name, command):
    """Every registered command of both CLIs (none can be left out of a list): a docstring, a
    help text for every option, and --help showing every option's flag."""
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"}, terminal_width=250)
    assert result.exit_code == 0, result.output
    assert command.help and len(command.help.strip()) > 15, f"{cli} {name}: no docstring"
    options = [p for p in command.params if p.param_type_name == "option"]
    assert [p.name for p in options if not (p.help or "").strip()] == [], f"{cli} {name}: options without help"
    assert [p.opts[0] for p in options if p.opts[0] not in result.output] == [], f"{cli} {name}: flags not shown"


def test_vlprep_formats_lists_every_format():
    proc = run_cli("formats")
    for name in ("lxmert-tsv", "butd-tsv", "vilbert-lmdb", "mmf-npy"):
        assert name in proc.stdout


def test_vltrain_preview_batch(tmp_path):
    write_records(tmp_path / "s", make_records(5, seed=2, feature_dim=16), feature_dim=16)
    assert _run("vltrain", "--help").returncode == 0
    proc = run_vltrain("preview-batch", tmp_path / "s", "--batch-size", "3", "--max-regions", "10", "--img-token")
    assert proc.returncode == 0, proc.stderr
    assert "(3, 11, 16)" in proc.stdout and "(3, 11, 5)" in proc.stdout and "real slots per image" in proc.stdout
    proc = run_vltrain("preview-batch", tmp_path)
    assert proc.returncode == 3 and "not a feature store" in proc.stderr
