"""Named errors: one exit code each on both CLIs; the write lock that turns a second
writer away at once."""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pipeline.cli import app as vlprep
from pipeline.errors import (
    EXIT_BUSY,
    EXIT_CONFIG,
    EXIT_DATA,
    EXIT_DIVERGED,
    EXIT_IO,
    BusyError,
    CheckpointError,
    ConfigError,
    DataError,
    DivergedError,
    StoreError,
    describe,
    exit_code,
)
from pipeline.io import LOCK_FILE, exclusive_lock
from vl_models.cli import app as vltrain


@pytest.mark.parametrize(
    "err, code",
    [
        (ConfigError("x"), EXIT_CONFIG),
        (StoreError("x"), EXIT_DATA),
        (CheckpointError("x"), EXIT_DATA),
        (DivergedError("x"), EXIT_DIVERGED),
        (BusyError("x"), EXIT_BUSY),
        (OSError(errno.ENOSPC, "No space left on device", "shards/00003.arrow"), EXIT_IO),
        (OSError(errno.ENOENT, "No such file"), None),
        (KeyError("a bug"), None),
    ],
)
def test_exit_codes(err, code):
    assert exit_code(err) == code


def test_disk_full_names_the_file():
    line = describe(OSError(errno.ENOSPC, "No space left on device", "/data/feats/shards/00003.arrow"))
    assert line.startswith("disk full writing /data/feats/shards/00003.arrow")


def test_not_a_store_is_a_data_error_on_both_clis(tmp_path):
    """A folder without a manifest: one line naming it, exit 3 (it was 1 on vlprep and a
    traceback-free 1 on vltrain before the mapping was shared)."""
    result = CliRunner().invoke(vlprep, ["inspect", str(tmp_path)])
    assert result.exit_code == EXIT_DATA, result.output
    assert "is not a feature store" in result.output
    result = CliRunner().invoke(vltrain, ["preview-batch", str(tmp_path)])
    assert result.exit_code == EXIT_DATA, result.output
    assert "is not a feature store" in result.output


def test_markup_in_messages_is_printed_verbatim(tmp_path):
    folder = tmp_path / "[red]x[red]"
    folder.mkdir()
    result = CliRunner().invoke(vlprep, ["inspect", str(folder)])
    assert result.exit_code == EXIT_DATA
    assert "[red]x[red]" in result.output


def test_lock_turns_a_second_writer_away_at_once(tmp_path):
    with exclusive_lock(tmp_path, "feature store"):
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from pipeline.io import exclusive_lock\nwith exclusive_lock({str(tmp_path)!r}): pass",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode != 0
        assert "BusyError" in child.stderr and "is writing this output" in child.stderr
        with pytest.raises(BusyError, match="another process"):  # a second open file in this process, too
            with exclusive_lock(tmp_path):
                pass
    with exclusive_lock(tmp_path):  # released on exit
        pass
    assert (tmp_path / LOCK_FILE).exists()


def test_lock_of_a_killed_holder_is_released(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time\nfrom pipeline.io import exclusive_lock\n"
            f"with exclusive_lock({str(tmp_path)!r}):\n    print('held', flush=True)\n    time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(BusyError, match=f"pid {holder.pid}"):
        with exclusive_lock(tmp_path):
            pass
    holder.kill()
    holder.wait()
    with exclusive_lock(tmp_path):
        pass


def test_logs_to_a_file_or_pipe_are_plain_unwrapped_lines():
    """Batch jobs (stderr redirected): one timestamped line per record, however long (rich
    wrapped them at 80 columns, splitting progress lines)."""
    code = (
        "import logging\nfrom pipeline.log import setup_logging\nsetup_logging()\n"
        "logging.getLogger('x').info('step ' + 'a' * 200)"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"},
    )
    lines = child.stderr.splitlines()
    assert len(lines) == 1, child.stderr
    assert lines[0].endswith("INFO x: step " + "a" * 200)


def test_a_plain_value_error_is_a_bug_and_keeps_its_traceback():
    """Only named errors become one line and an exit code: a ValueError from deep inside
    (ArrowInvalid, JSONDecodeError, ...) used to become a file-less one-liner with exit 1."""
    import typer

    from pipeline.log import named_errors

    @named_errors
    def bug():
        raise ValueError("invalid literal for int() with base 10: 'x'")

    with pytest.raises(ValueError, match="invalid literal"):
        bug()

    @named_errors
    def named():
        raise ConfigError("--x must be >= 1")

    with pytest.raises(typer.Exit) as caught:
        named()
    assert caught.value.exit_code == EXIT_CONFIG


def test_damaged_files_we_wrote_and_unreadable_sources_are_named(tmp_path):
    from pipeline.image_shards import done_shards, iter_images

    (tmp_path / "00000.parquet").write_bytes(b"PAR1")
    (tmp_path / "00000_stats.json").write_text("{truncated")
    with pytest.raises(DataError, match=r"00000_stats.json: unreadable shard stats"):
        done_shards(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    (images / "00000.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ConfigError, match=f"image source {images}: cannot be read"):
        list(iter_images(images))
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match="a_file exists and is not a folder"):
        with exclusive_lock(tmp_path / "a_file", "feature store"):
            pass


# Exceptions the packages define that are not named errors: each is caught where it is
# raised and becomes data (a sample's or a row's reason), never reaching a command's caller.
CAUGHT_INSIDE = {
    "pipeline.images.ImageError": "an image's decode failure: the download/extract sample's reason",
    "pipeline.download.fetch.FetchError": "a URL's fetch failure: the download sample's reason",
    "pipeline.formats.base.RowError": "a source row's bad value: the import's skipped row",
    "pipeline.sources.vcr._Bad": "a VCR line's malformed field: the row's Malformed reason",
    "pipeline.store.arrow_shard._Damaged": "a damaged shard file: re-raised as StoreError naming it",
    # vlprep serve's request errors: each a message on the page (HTTP 400 / 413), never a traceback
    "vl_models.serve.app.BodyTooLarge": "an upload over the size cap: the ask page's message (413)",
    "vl_models.serve.ask.AskError": "a query a run cannot answer: the ask page's message",
    "vl_models.serve.gallery.QueryError": "a bad page query or form: the page's message",
    "vl_models.serve.images.UploadError": "an upload that is no image: the ask page's message",
}


def test_every_error_a_command_can_raise_is_named():
    """Walk every module of both packages: each exception class they define is a named error
    (one `error:` line and its exit code on both CLIs), or one caught where it is raised."""
    import importlib
    import inspect

    from helpers import REPO

    from pipeline.errors import VlprepError

    defined = {}
    for package in ("pipeline", "vl_models"):
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            module = importlib.import_module(name)
            for obj in vars(module).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == name:
                    defined[f"{name}.{obj.__qualname__}"] = obj
    assert "pipeline.errors.UnsafePickleError" in defined and "pipeline.download.fetch.FetchError" in defined
    unnamed = sorted(k for k, cls in defined.items() if not issubclass(cls, VlprepError))
    assert unnamed == sorted(CAUGHT_INSIDE), "name it (a VlprepError) or catch it where it is raised"
    for name, cls in defined.items():
        if issubclass(cls, VlprepError):
            assert exit_code(cls.__new__(cls)) == cls.exit_code is not None, name
