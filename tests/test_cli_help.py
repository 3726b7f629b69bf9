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


def _config_commands():
    from vl_models import flags

    groups = {
        "pretrain": flags.PRETRAIN_FLAGS,
        "finetune": flags.FINETUNE_FLAGS,
        "evaluate": flags.EVALUATE_FLAGS,
        "preview-batch": flags.PREVIEW_FLAGS,
    }
    return [(name, group) for name, command in groups.items() for group in command]


def _panels(text: str) -> dict[str, list[list[str]]]:
    """The option rows of each panel of a rendered --help: panel title -> blocks, each block
    the text rows of one option (its first row and the rows its help wraps onto)."""
    panels: dict[str, list[list[str]]] = {}
    rows = None
    for line in text.splitlines():
        if line.startswith("╭─"):
            rows = panels.setdefault(line.strip("╭─╮ ").strip(), [])
        elif line.startswith("╰"):
            rows = None
        elif rows is not None and line.startswith("│"):
            content = line[1:].rstrip().rstrip("│").rstrip()
            if len(content) - len(content.lstrip()) <= 5:  # an option's first row; deeper: its help wrapped
                rows.append([content])
            else:
                rows[-1].append(content)
    return panels


def _expected_default(group, name: str):
    """What --help shows as the flag's default: None where it shows none (required, optional,
    repeatable, or a flag with no --no- form that is off)."""
    import dataclasses

    from pipeline.cli_flags import FIELD_DEFAULT, _default

    flag = group.flag(name)
    fields = {f.name: f for f in dataclasses.fields(group.cls)}
    value = _default(fields[name]) if group.defaults is None else getattr(group.defaults, name)
    if flag.default is not FIELD_DEFAULT:
        value = flag.default
    if value in (None, ...) or flag.many or isinstance(value, (tuple, dict)):
        return None
    if flag.parse is not None and value != flag.default:
        return flag.show(value)
    if isinstance(value, bool):
        return None if flag.name else ("" if value else "no-") + name.replace("_", "-")
    return str(value)


@pytest.mark.parametrize("command, group", _config_commands(), ids=lambda v: v if isinstance(v, str) else v.panel)
def test_config_made_commands_show_each_field_with_its_default_and_help(command, group):
    """`vltrain pretrain`, `finetune`, `evaluate` and `preview-batch` take their flags from
    their configs' fields: --help shows every field's flag (an argument's name) in its group's
    panel, with the help text and default the flag table declares."""
    from typer.testing import CliRunner

    from vl_models.cli import app

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"}, terminal_width=250)
    assert result.exit_code == 0, result.output
    panels = _panels(result.output)
    for name in group.flags:
        flag = group.flag(name)
        shown = name if flag.argument else flag.name or "--" + name.replace("_", "-")
        blocks = [
            " ".join(" ".join(block).split())
            for block in panels["Arguments" if flag.argument else group.panel]
            if block[0].lstrip(" *").split()[0] == shown
        ]
        assert len(blocks) == 1, (command, group.panel, shown)
        assert " ".join(flag.help.replace("`", "").split()) in blocks[0], (command, shown, blocks[0])
        default = _expected_default(group, name)
        if default is None:
            assert "[default:" not in blocks[0], (command, shown, blocks[0])
        else:
            assert f"[default: {default}]" in blocks[0], (command, shown, default, blocks[0])


def test_former_spellings_of_renamed_flags_are_taken_with_one_line_each(tmp_path):
    """--shards, --given-shards, --weight (and a recipe's weight key) and predict's --task-data
    still work, read as --stores, --given-stores, --loss-weight and --data, each said once on
    stderr; a command without the new flag and values after -- are left as they are."""
    from vl_models.flags import RENAMED, command_args

    assert RENAMED == {
        "--shards": "--stores",
        "--given-shards": "--given-stores",
        "--weight": "--loss-weight",
        "--task-data": "--data",
    }
    proc = run_vltrain("predict", "--task-data", f"vqa={tmp_path}", "--help")
    assert proc.returncode == 0 and "--task-data is deprecated: use --data" in proc.stderr, proc.stderr
    proc = run_vltrain("evaluate", "--shards", tmp_path / "a", "--shards", tmp_path / "b", "--help")
    assert proc.returncode == 0 and proc.stderr.count("--shards is deprecated: use --stores") == 1, proc.stderr
    proc = run_vltrain("finetune", "--given-shards", tmp_path, "--help")
    assert proc.returncode == 0 and "--given-shards is deprecated: use --given-stores" in proc.stderr, proc.stderr
    proc = run_vltrain("preview-batch", "--shards", tmp_path)  # no --stores there: the flag stays unknown
    assert proc.returncode == 2 and "deprecated" not in proc.stderr and "No such option: --shards" in proc.stderr
    assert command_args({"--stores", "--resume"}, ["--shards=x", "--resume", "--", "--shards"]) == [
        "--stores=x",
        "--resume",
        "yes",
        "--",
        "--shards",
    ]
