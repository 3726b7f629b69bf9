"""pipeline.io: replacing only what we wrote, output locks,
leftovers of killed writers."""

import json
import os
from pathlib import Path

import pytest
from helpers import make_records, run_cli

from pipeline.errors import BusyError, ConfigError
from pipeline.io import OUTPUT_MARKER, check_output, commit_path, output_lock, replacing_output, tmp_path_for


def tree(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def user_folder(path: Path) -> Path:
    (path / "photos").mkdir(parents=True)
    (path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8 my cat")
    (path / "notes.txt").write_text("mine")
    return path


# ----------------------------------------------------------------------------- commit_path


def test_commit_path_never_deletes_a_directory(tmp_path):
    final = user_folder(tmp_path / "final")
    tmp = tmp_path_for(final)
    tmp.mkdir()
    (tmp / "new.txt").write_text("new")
    with pytest.raises(FileExistsError, match="final"):
        commit_path(tmp, final)
    assert (final / "photos" / "cat.jpg").exists() and (tmp / "new.txt").exists()
    (tmp_path / "free").mkdir()
    (tmp_path / "free").rmdir()
    commit_path(tmp, tmp_path / "free")  # a directory to a free name: still the atomic rename
    assert (tmp_path / "free" / "new.txt").read_text() == "new" and not tmp.exists()


def test_lmdb_and_arrow_stores_still_commit_and_resume_their_shards(tmp_path):
    from pipeline.store import FeatureStore, write_records

    for backend in ("lmdb", "arrow"):
        recs = make_records(7, seed=1, feature_dim=8)
        write_records(tmp_path / backend, recs[:4], backend=backend, shard_size=2, feature_dim=8)
        write_records(tmp_path / backend, recs, backend=backend, shard_size=2, feature_dim=8, resume=True)
        store = FeatureStore.open(tmp_path / backend)
        assert len(store) == 7 and [s.name for s in store.manifest.shards][-1].startswith("00003")
        assert not list((tmp_path / backend / "shards").glob(".tmp-*"))


# ----------------------------------------------------------------------------- check_output


def test_check_output_refuses_what_must_not_be_replaced(tmp_path, monkeypatch):
    sub = tmp_path / "work" / "sub"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    inputs = (tmp_path / "data" / "spec.yaml", tmp_path / "store")
    inputs[0].parent.mkdir()
    inputs[0].write_text("x")
    inputs[1].mkdir()
    user_folder(tmp_path / "mine")
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    (tmp_path / "file").write_text("f")
    cases = {
        ".": "current folder",
        "..": "current folder",
        str(sub): "current folder",
        str(tmp_path / "work"): "current folder",
        "/": "current folder",
        str(tmp_path / "data"): "spec.yaml",
        str(tmp_path / "store"): "store",
        str(tmp_path / "store" / "inside"): "store",
        str(tmp_path / "link"): "symbolic link",
        str(tmp_path / "mine"): r"not written by vlprep test.*notes\.txt, photos",
        str(tmp_path / "file"): "not a folder",
    }
    for out, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            check_output(Path(out), "test", inputs=inputs, what="vlprep test")
    check_output(tmp_path / "new", "test", inputs=inputs)
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", "test", inputs=inputs)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / OUTPUT_MARKER).write_text(json.dumps({"kind": "test"}))
    (tmp_path / "ours" / "data.bin").write_text("old")
    check_output(tmp_path / "ours", "test", inputs=inputs)
    with pytest.raises(ConfigError, match="not written by"):
        check_output(tmp_path / "ours", "other kind")
    check_output(tmp_path / "file", "test", folder=False)  # a file output may replace a file


# ----------------------------------------------------------------------------- replacing_output


def test_replacing_output_swaps_in_a_marked_folder_and_cleans_up_on_failure(tmp_path):
    out = tmp_path / "out"
    with replacing_output(out, "test") as tmp:
        tmp.mkdir()
        (tmp / "a.txt").write_text("first")
    assert json.loads((out / OUTPUT_MARKER).read_text())["kind"] == "test"
    with pytest.raises(RuntimeError, match="boom"):
        with replacing_output(out, "test") as tmp:
            tmp.mkdir()
            (tmp / "a.txt").write_text("second")
            raise RuntimeError("boom")
    assert (out / "a.txt").read_text() == "first"  # the earlier output is untouched
    with replacing_output(out, "test") as tmp:
        tmp.mkdir()
        (tmp / "b.txt").write_text("third")
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != out.name) == [".out.vlprep.lock"]


def test_replacing_output_removes_dead_writers_leftovers_and_restores_an_aside_copy(tmp_path):
    out = tmp_path / "out"
    dead = tmp_path / ".tmp-out.999999999"  # a build killed while writing
    dead.mkdir()
    (dead / "half.arrow").write_text("half")
    aside = tmp_path / ".tmp-out.999999998.old"  # a build killed between its two renames: only the old copy is left
    aside.mkdir()
    (aside / OUTPUT_MARKER).write_text(json.dumps({"kind": "test"}))
    (aside / "a.txt").write_text("old")
    (tmp_path / ".tmp-out.5.123").mkdir()  # another output's temporary folder ("out.5"): not ours to remove
    (tmp_path / ".tmp-outside.123").mkdir()
    with pytest.raises(RuntimeError):
        with replacing_output(out, "test"):
            assert (out / "a.txt").read_text() == "old"  # restored before the build starts
            raise RuntimeError("fail on purpose")
    assert (out / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")) == [
        ".tmp-out.5.123",
        ".tmp-outside.123",
    ]


def test_output_lock_refuses_a_second_writer_of_the_same_output(tmp_path):
    with output_lock(tmp_path / "out", "mixture"):
        with pytest.raises(BusyError, match=rf"{tmp_path / 'out'}.*pid {os.getpid()}"):
            with output_lock(tmp_path / "out", "mixture"):
                pass
        with output_lock(tmp_path / "other", "mixture"):  # another output beside it is independent
            pass
    with output_lock(tmp_path / "out", "mixture"):  # released
        pass


# ----------------------------------------------------------------------------- audit: export --overwrite


@pytest.fixture
def store(tmp_path):
    from pipeline.store import write_records

    write_records(tmp_path / "store", make_records(3, seed=2, feature_dim=8), feature_dim=8)
    return tmp_path / "store"


def test_export_overwrite_refuses_a_folder_that_is_not_an_export(tmp_path, store):
    from pipeline.formats.convert import ExportConfig

    mine = user_folder(tmp_path / "home")
    before = tree(mine)
    proc = run_cli("export", "--to", "mmf-npy", "--overwrite", store, mine)
    assert proc.returncode == 2 and "not written by vlprep export --to mmf-npy" in proc.stderr, proc.stderr
    assert tree(mine) == before
    for dest in (store, store / "shards", tmp_path):
        with pytest.raises(ConfigError):
            ExportConfig("mmf-npy", store, dest, overwrite=True)
    manifest = (store / "manifest.json").read_bytes()
    with pytest.raises(ConfigError, match="store"):
        ExportConfig("lxmert-tsv", store, store / "manifest.json", overwrite=True)
    assert (store / "manifest.json").read_bytes() == manifest


def test_export_overwrite_replaces_an_earlier_export(tmp_path, store):
    from pipeline.formats.convert import ExportConfig, run_export

    run_export(ExportConfig("mmf-npy", store, tmp_path / "out"))
    (tmp_path / "out" / "stale_info.npy").write_text("from an older export")
    with pytest.raises(ConfigError, match="--overwrite"):
        ExportConfig("mmf-npy", store, tmp_path / "out")
    assert run_export(ExportConfig("mmf-npy", store, tmp_path / "out", overwrite=True)) == 3
    assert not (tmp_path / "out" / "stale_info.npy").exists() and len(list((tmp_path / "out").glob("*_info.npy"))) == 3
    run_export(ExportConfig("lxmert-tsv", store, tmp_path / "f.tsv"))
    run_export(ExportConfig("lxmert-tsv", store, tmp_path / "f.tsv", overwrite=True))  # a file replaces a file
    assert len((tmp_path / "f.tsv").read_text().splitlines()) == 3
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


# ----------------------------------------------------------------------------- audit: make-shapes --out


def test_make_shapes_never_deletes_a_users_images_folder(tmp_path):
    from pipeline.synthetic import write_world

    mine = tmp_path / "project"
    (mine / "images").mkdir(parents=True)  # only names a shapes world also uses
    (mine / "images" / "holiday.jpg").write_bytes(b"\xff\xd8 beach")
    (mine / "annotations").mkdir()
    (mine / "annotations" / "labels.json").write_text("{}")
    before = tree(mine)
    with pytest.raises(ConfigError, match=r"project.*not written by vlprep make-shapes.*annotations, images"):
        write_world(mine, 2, 0)
    assert tree(mine) == before


def test_make_shapes_replaces_an_earlier_world_even_one_without_the_marker(tmp_path):
    from pipeline.synthetic import write_world

    write_world(tmp_path / "w", 2, 0)
    first = tree(tmp_path / "w")
    (tmp_path / "w" / OUTPUT_MARKER).unlink()  # a world written before the marker existed
    (tmp_path / "w" / "images" / "extra.jpg").write_bytes(b"x")
    write_world(tmp_path / "w", 2, 0)
    assert tree(tmp_path / "w") == first


def test_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    """A write past the file-size limit (as a full disk): the old content stays, the
    temporary file is removed, and the error names the file being written."""
    import subprocess
    import sys

    target = tmp_path / "metrics.json"
    target.write_text("old")
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            f"""
import resource, signal
from pathlib import Path
from pipeline.io import atomic_write_bytes
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    atomic_write_bytes(Path({str(target)!r}), b"x" * 5000)
except OSError as err:
    print(err.errno, err.filename)
""",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    number, name = child.stdout.split()
    assert int(number) == 27 and name == str(target)  # EFBIG, the final name
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_stale_temporary_files_are_only_ours(tmp_path):
    """A writer adopting a folder (download --out, a store, a run) removes leftovers of
    killed writers by our naming only: a user's `.tmp-notes/` used to be rmtree'd."""
    from pipeline.io import remove_stale_tmp

    (tmp_path / ".tmp-notes").mkdir()
    (tmp_path / ".tmp-notes" / "todo.txt").write_text("mine")
    (tmp_path / ".tmp-draft.txt").write_text("mine too")
    ours = [tmp_path / ".tmp-00003.parquet.4242", tmp_path / ".tmp-mix.17.old", tmp_path / ".tmp-00001.lmdb.99"]
    ours[0].write_bytes(b"x")
    ours[1].mkdir()
    ours[2].mkdir()
    assert remove_stale_tmp(tmp_path) == sorted(ours)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-draft.txt", ".tmp-notes"]
    assert (tmp_path / ".tmp-notes" / "todo.txt").read_text() == "mine"


def test_a_file_output_is_never_a_device_a_pipe_or_a_socket(tmp_path):
    """An atomic write renames over its target: onto /dev/null (as root) or a FIFO it would
    replace the node with a regular file. Outputs are regular files or new names."""
    import os
    import socket

    from pipeline.io import check_output

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    try:
        for node in (fifo, sock, Path("/dev/null")):
            with pytest.raises(ConfigError, match="is not a regular file"):
                check_output(node, "predictions", flag="--out", folder=False)
    finally:
        server.close()
    check_output(tmp_path / "new.jsonl", "predictions", flag="--out", folder=False)
    (tmp_path / "old.jsonl").write_text("x")
    check_output(tmp_path / "old.jsonl", "predictions", flag="--out", folder=False)
