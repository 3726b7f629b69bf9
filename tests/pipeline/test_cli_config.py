"""`vlprep download` and `extract` take their flags from their configs: every config field
(those of its sections included) has a flag, every flag is a field, the flags the two
commands share are one declaration with one default, and what a flag says reaches the
config the run gets."""

import dataclasses
import subprocess
import sys
import typing

import pytest
import typer
from helpers import REPO
from typer.testing import CliRunner

import pipeline.cli as cli
from pipeline.detect.config import BoxCount, ExtractConfig
from pipeline.download.run import DownloadConfig

# Dataclass-typed fields that are one value given by one flag, not a section of flags.
ONE_FLAG_VALUES = {BoxCount: "--boxes takes K or MIN-MAX"}
# Fields with no flag, on purpose: (command, field) -> why. None today.
NO_FLAG: dict[tuple[str, str], str] = {}
# Flags both commands have but declare each in its own way: what they read and write differs.
OWN_DECLARATION = {
    "dataset": "download needs --dataset; extract takes --dataset or --images",
    "inputs": "the same --input, with help that says what it is for in each command",
    "out": "download writes image shards; extract a feature store",
}
COMMANDS = {"download": DownloadConfig, "extract": ExtractConfig}


def leaf_fields(cls: type) -> set[str]:
    """The config's own fields and, recursively, those of its config sections."""
    hints = typing.get_type_hints(cls)
    names = set()
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        if dataclasses.is_dataclass(kind) and kind not in ONE_FLAG_VALUES:
            names |= leaf_fields(kind)
        else:
            names.add(field.name)
    return names


def options(command: str) -> dict:
    click_command = typer.main.get_command(cli.app).commands[command]
    return {p.name: p for p in click_command.params if p.param_type_name == "option" and p.name != "help"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_config_field_has_a_flag_and_every_flag_a_field(command):
    fields = leaf_fields(COMMANDS[command])
    flags = set(options(command))
    assert sorted(fields - flags - {f for c, f in NO_FLAG if c == command}) == [], "config fields without a flag"
    assert sorted(flags - fields) == [], "flags that set no config field"


def test_the_flags_download_and_extract_share_are_one_declaration():
    download, extract = options("download"), options("extract")
    shared = set(download) & set(extract)
    assert {"threads", "shard_size", "ray_address", "max_failure_rate", "url_col", "max_side", "deadline"} <= shared
    for name in sorted(shared - set(OWN_DECLARATION)):
        a, b = download[name], extract[name]
        assert (a.opts, a.default, a.help, a.rich_help_panel) == (b.opts, b.default, b.help, b.rich_help_panel), name
    assert download["threads"].default == extract["threads"].default == 16


def test_flag_defaults_are_the_config_defaults():
    from pipeline.download.fetch import FetchConfig

    flags = options("download")
    assert flags["threads"].default == FetchConfig().threads and flags["deadline"].default == FetchConfig().deadline
    assert flags["disallowed_directives"].opts == ["--opt-out-directives"]
    assert flags["disallowed_directives"].default == ",".join(FetchConfig().disallowed_directives)
    # selection and resize flags default to the detector backend's own, resolved when the config is built
    assert ExtractConfig.__dataclass_fields__["selection"].default.boxes is None
    assert options("extract")["boxes"].default is None and options("extract")["preprocess"].default is None


def _invoke(monkeypatch, command: str, *args: str):
    """Run `vlprep COMMAND ARGS` in process with the run function replaced: the config it gets."""
    got = {}
    summary = {
        "successes": 0,
        "items_in_shards": 0,
        "success_rate": None,
        "shards_complete": 0,
        "extracted": 0,
        "images": 0,
        "shards_done": 0,
        "failures": {},
        "shards_failed": {},
        "verdict": "ok",
    }

    def run(cfg, on_progress=None):
        got["cfg"] = cfg
        return summary

    import pipeline.detect.run

    monkeypatch.setattr(cli, "run_download", run)
    monkeypatch.setattr(pipeline.detect.run, "run_extract", run)
    result = CliRunner().invoke(cli.app, [command, *map(str, args)])
    return result, got.get("cfg")


def test_what_the_flags_say_reaches_the_config(tmp_path, monkeypatch):
    urls = tmp_path / "urls.jsonl"
    urls.write_text('{"link": "http://example.com/a.jpg"}\n')
    common = [
        "--dataset",
        "url_list",
        "--input",
        urls,
        "--url-col",
        "link",
        "--caption-col",
        "",
        "--threads",
        "3",
        "--max-side",
        "64",
        "--opt-out-directives",
        "NoAI, x",
        "--allow-network",
        "10.0.0.0/8",
        "--shard-size",
        "7",
        "--retry-failed",
        "--backoff",
        "0.1",
    ]
    result, cfg = _invoke(monkeypatch, "download", *common, "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output
    assert isinstance(cfg, DownloadConfig) and cfg.dataset == "url_list" and cfg.inputs == (urls,)
    assert (cfg.reader.url_col, cfg.reader.caption_col) == ("link", None)
    assert (cfg.fetch.threads, cfg.fetch.backoff, cfg.fetch.disallowed_directives) == (3, 0.1, ("noai", "x"))
    assert cfg.fetch.allowed_networks == ("10.0.0.0/8",) and cfg.image.max_side == 64
    assert (cfg.distribute.shard_size, cfg.distribute.retry_failed) == (7, True)

    result, cfg = _invoke(
        monkeypatch,
        "extract",
        *common,
        "--out",
        tmp_path / "s",
        "--random-weights",
        "--boxes",
        "36",
        "--nms-thresh",
        "0.4",
        "--seed",
        "3",
    )
    assert result.exit_code == 0, result.output
    assert isinstance(cfg, ExtractConfig) and (cfg.reader.url_col, cfg.reader.caption_col) == ("link", None)
    assert (cfg.fetch.threads, cfg.image.max_side, cfg.distribute.shard_size) == (3, 64, 7)
    assert (str(cfg.selection.boxes), cfg.selection.nms_thresh, cfg.seed) == ("36", 0.4, 3)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--quality", "0"], "--quality must be >= 1"),
        (["--max-failure-rate", "2"], "--max-failure-rate must be between 0 and 1"),
        (["--allow-network", "nonsense"], "--allow-network 'nonsense' is not a network"),
        (["--encode-format", "gif"], "Invalid value for '--encode-format'"),
    ],
)
def test_a_bad_flag_value_is_refused_naming_the_flag(tmp_path, args, message):
    from helpers import run_cli

    urls = tmp_path / "urls.txt"
    urls.write_text("http://example.com/a.jpg\n")
    proc = run_cli("download", "--dataset", "url_list", "--input", urls, "--out", tmp_path / "o", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()  # refused before any work


def test_the_cli_loads_without_torch_or_ray():
    """The configs the flags are made from live in modules that import neither (vlprep --help stays fast)."""
    code = "import sys, pipeline.cli; print(sorted({'torch', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    "command, config, mapped",
    [
        ("import", "pipeline.formats.convert:ImportConfig", {"sources": "paths", "dest": "paths"}),  # SOURCES... DEST
        ("export", "pipeline.formats.convert:ExportConfig", {}),
        ("demo", "vl_models.demo:DemoConfig", {}),  # the plugin command
    ],
)
def test_the_other_commands_reach_every_field_of_their_config(command, config, mapped):
    """`vlprep demo` could not set its detector weights or config (fields without a flag)."""
    import importlib

    from pipeline.cli import app, load_plugins

    load_plugins()
    module, name = config.split(":")
    cls = getattr(importlib.import_module(module), name)
    params = {p.name for p in typer.main.get_command(app).commands[command].params}
    fields = {mapped.get(f.name, f.name) for f in dataclasses.fields(cls)}
    assert sorted(fields - params) == [] and sorted(params - fields) == []
