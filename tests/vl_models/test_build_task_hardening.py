"""`vlprep build-task` as a careless or hostile user drives it: inputs inside the output it
replaces, a second build of the same output, unreadable image maps, GQA files named without
their split, and a task folder damaged after it was written (its files' digests)."""

import json
import os
import shutil
import signal
from contextlib import contextmanager

import pytest
from helpers import run_cli, run_vltrain
from task_files import VAL_FROM, write_gqa, write_image_map, write_nlvr2, write_store, write_vqa
from train_helpers import VOCAB

from pipeline.errors import BusyError, ConfigError, DataError
from pipeline.io import output_lock
from pipeline.items.answers import read_answer_file
from pipeline.task_data import TaskData
from vl_models import transfer
from vl_models.transfer.build import build_task


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The official files of NLVR2, VQA and GQA over the task world's images, with its image map."""
    root = tmp_path_factory.mktemp("files")
    return {
        "nlvr2": write_nlvr2(root),
        "vqa": write_vqa(root),
        "gqa": write_gqa(root),
        "image_map": write_image_map(root),
    }


def _nlvr2(files, out, **kw):
    return build_task(transfer.get("nlvr2"), files["nlvr2"], out, **{"image_map": files["image_map"], **kw})


def _one_error_line(result, code: int, *wanted: str) -> str:
    """The command exited `code` with one ``error:`` line (no traceback) holding each of `wanted`."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    for text in wanted:
        assert text in lines[0], lines[0]
    return lines[0]


# --- every input is an input of the output ---------------------------------------------------


@pytest.mark.parametrize("flag", ["image_map", "answers_from", "minival"])
def test_an_input_inside_the_earlier_out_is_refused_and_kept(files, tmp_path, flag):
    out = tmp_path / "vqa"
    build_task(transfer.get("vqa"), files["vqa"], out, image_map=files["image_map"], min_count=1)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    given = {
        "image_map": files["image_map"].read_text(),
        "answers_from": json.dumps(["yes", "no", "red", "green", "blue"]),
        "minival": json.dumps([{"question_id": VAL_FROM * 10}]),
    }[flag]
    inside = out / ("inputs.json" if flag != "image_map" else "image_map.tsv")
    inside.write_text(given)
    kw = {"image_map": files["image_map"], "min_count": None if flag == "answers_from" else 1, flag: inside}
    with pytest.raises(ConfigError, match=f"--out {out} overlaps the input {inside}"):
        build_task(transfer.get("vqa"), files["vqa"], out, **kw)
    assert inside.read_text() == given  # the user's file is still there
    assert {p.name: p.read_bytes() for p in out.iterdir() if p != inside} == before  # the old dataset untouched


def test_the_command_refuses_an_image_map_inside_its_out_exit_2(files, tmp_path):
    out = tmp_path / "t"
    _nlvr2(files, out)
    mine = out / "my_map.tsv"
    shutil.copy(files["image_map"], mine)
    result = run_cli("build-task", "--task", "nlvr2", "--out", out, *files["nlvr2"], "--image-map", mine)
    _one_error_line(result, 2, f"overlaps the input {mine}")
    assert mine.read_bytes() == files["image_map"].read_bytes()


# --- one writer per output --------------------------------------------------------------------


def test_a_second_build_of_one_out_is_refused_at_once_before_reading(files, tmp_path):
    out = tmp_path / "t"
    broken = tmp_path / "broken.tsv"
    broken.write_text("no tab on this line\n")  # reading it would be a ConfigError
    with output_lock(out):  # another build-task holds the output
        with pytest.raises(BusyError, match="another process"):
            _nlvr2(files, out, image_map=broken)
        result = run_cli("build-task", "--task", "nlvr2", "--out", out, *files["nlvr2"], "--image-map", broken)
        _one_error_line(result, 75, "another process")
    assert not out.exists()


# --- unreadable inputs: one line, exit 2 --------------------------------------------------------


@pytest.mark.parametrize("kind", ["missing", "folder", "not utf-8", "pipe"])
def test_an_unreadable_image_map_is_one_error_line(files, tmp_path, kind):
    image_map = tmp_path / "map.tsv"
    if kind == "folder":
        image_map.mkdir()
    elif kind == "not utf-8":
        image_map.write_bytes("caf\u00e9-0-0-img0\timg_0\n".encode("latin-1"))
    elif kind == "pipe":
        os.mkfifo(image_map)  # reading it would block for ever
    out = tmp_path / "t"
    with _no_hang():
        result = run_cli("build-task", "--task", "nlvr2", "--out", out, *files["nlvr2"], "--image-map", image_map)
    reason = {"missing": "no such file", "folder": "a folder", "pipe": "not a regular file"}.get(kind, "UTF-8")
    _one_error_line(result, 2, str(image_map), reason)
    assert not out.exists()


def test_official_files_answer_tables_and_minival_must_be_regular_files(files, tmp_path):
    pipe = tmp_path / "pipe.json"
    os.mkfifo(pipe)
    (tmp_path / "folder.json").mkdir()
    vqa = transfer.get("vqa")
    with _no_hang():
        with pytest.raises(
            ConfigError, match=f"cannot read {pipe} \\(not a regular file\\), {tmp_path}/folder.json \\(a folder\\)"
        ):
            build_task(vqa, [*files["vqa"], pipe, tmp_path / "folder.json"], tmp_path / "t")
        with pytest.raises(ConfigError, match=f"--answers-from {pipe}: not a regular file"):
            build_task(vqa, files["vqa"], tmp_path / "t", answers_from=pipe)
        with pytest.raises(ConfigError, match=f"--minival {tmp_path}/folder.json: a folder"):
            build_task(vqa, files["vqa"], tmp_path / "t", minival=tmp_path / "folder.json")
        with pytest.raises(ConfigError, match="cannot read the answer table: not a regular file"):
            read_answer_file(pipe)  # build-mixture's answers_from: reads it through the same function
    assert not (tmp_path / "t").exists()


@contextmanager
def _no_hang(seconds: int = 10):
    """Turn a read that would block for ever (a FIFO) into a failing test."""

    def hung(*_):
        raise AssertionError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_gqa_file_named_without_its_split_says_so(files, tmp_path):
    renamed = tmp_path / "questions.json"  # was train_balanced_questions.json
    shutil.copy(files["gqa"][0], renamed)
    said = r"questions\.json: a GQA file's name starts with its split and '_' \(train, val, testdev"
    with pytest.raises(ConfigError, match=said):
        build_task(transfer.get("gqa"), [renamed], tmp_path / "t")
    assert not (tmp_path / "t").exists()


# --- a task folder damaged after it was written -------------------------------------------------


def test_the_manifest_records_each_data_file_and_open_checks_it(files, tmp_path):
    manifest = _nlvr2(files, tmp_path / "t")
    assert set(manifest["contents"]) == {"items.arrow", "answers.json"}
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["contents"] == manifest["contents"]
    assert len(TaskData.open(tmp_path / "t")) == 36
    items = tmp_path / "t" / "items.arrow"
    data = bytearray(items.read_bytes())
    at = data.index(b"the left image is red")  # a flipped byte inside a text: no reader notices it
    data[at] ^= 0x01
    items.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"items\.arrow is corrupt: sha256 mismatch .*vlprep build-task"):
        TaskData.open(tmp_path / "t")
    items.write_bytes(bytes(data[:-10]))
    with pytest.raises(DataError, match=r"items\.arrow is truncated: 8,456 bytes on disk, the manifest says 8,466"):
        TaskData.open(tmp_path / "t")


def test_finetune_on_a_damaged_task_folder_fails_before_writing(files, tmp_path):
    write_store(tmp_path / "feats")
    _nlvr2(files, tmp_path / "t")
    answers = tmp_path / "t" / "answers.json"
    answers.write_text(answers.read_text().replace("[]", "[ ]"))  # same JSON, other bytes
    result = run_vltrain(
        "finetune",
        "--task",
        "nlvr2",
        "--data",
        tmp_path / "t",
        "--stores",
        tmp_path / "feats",
        "--model",
        "lxmert-tiny",
        "--vocab",
        VOCAB,
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--out",
        tmp_path / "run",
    )
    _one_error_line(result, 3, "answers.json has changed since it was written")
    assert not (tmp_path / "run").exists()


def test_the_same_file_given_twice_is_refused(files, tmp_path):
    """Twice the same file (or a link to it) would double every row: refused by name."""
    link = tmp_path / "again.json"
    link.symlink_to(files["nlvr2"][0])
    for twice in ([files["nlvr2"][0], files["nlvr2"][0]], [files["nlvr2"][0], link]):
        with pytest.raises(ConfigError, match="is given twice"):
            build_task(transfer.get("nlvr2"), twice, tmp_path / "t")
    assert not (tmp_path / "t").exists()
