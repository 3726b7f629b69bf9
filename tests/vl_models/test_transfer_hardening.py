"""`vltrain finetune` / `evaluate` / `export` as a careless or hostile user runs them:
every input checked before the first write, the output rules of every other command, one
`error:` line and the documented exit code instead of a traceback."""

import json
import os
import shutil
import stat

import pytest
import torch
from helpers import run_vltrain
from train_helpers import VOCAB, config, finetune_config

from pipeline.errors import EXIT_CONFIG, EXIT_DATA, CheckpointError, ConfigError
from pipeline.io import OUTPUT_MARKER
from vl_models.config import EvaluateConfig, FinetuneConfig
from vl_models.models.weights import load_exported, read_state_dict
from vl_models.train import checkpoint
from vl_models.train.trainer import run
from vl_models.transfer.evaluate import evaluate_checkpoint
from vl_models.transfer.finetune import run_finetune


def settings(world, out, **kw) -> FinetuneConfig:
    return finetune_config(world, out, **{"steps": 2, "eval_items": 4, **kw})


@pytest.fixture(scope="module")
def finetuned(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "ft"
    run_finetune(settings(world, out))
    return out


def one_error_line(proc, code: int, *words: str) -> None:
    """Exit `code`, one `error:` line naming each of `words`, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, proc.stderr
    text = " ".join(proc.stderr.split())  # rich may wrap the line
    for word in words:
        assert word in text, (word, proc.stderr)


def evaluate(*args, **kw):
    return run_vltrain("evaluate", "--task", "vqa", "--split", "val", *map(str, args), **kw)


# --- evaluate --out: the output rules of every command, before any work -----------------------


def test_evaluate_out_is_never_a_users_folder_a_link_or_a_file(world, finetuned, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.json").write_text('{"my": "numbers"}')
    with pytest.raises(ConfigError, match="holds files not written by vltrain evaluate"):
        evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", out=mine))
    assert (mine / "metrics.json").read_text() == '{"my": "numbers"}' and len(list(mine.iterdir())) == 1
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    with pytest.raises(ConfigError, match="symbolic link"):
        evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", out=tmp_path / "link"))
    assert not list((tmp_path / "empty").iterdir())
    (tmp_path / "file").write_text("x")
    proc = evaluate("--checkpoint", finetuned, "--data", world / "vqa", "--out", tmp_path / "file")
    one_error_line(proc, EXIT_CONFIG, "exists and is not a folder")
    with pytest.raises(ConfigError, match="overlaps the input"):
        evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", out=world / "vqa" / "eval"))


def test_evaluate_replaces_its_own_output_and_one_of_an_earlier_version(world, finetuned, tmp_path):
    out = tmp_path / "e"
    first = evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", out=out))
    assert sorted(p.name for p in out.iterdir()) == [OUTPUT_MARKER, "metrics.json", "vqa_results.json"]
    assert first["files"] == [str(out / "vqa_results.json"), str(out / "metrics.json")]
    evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", out=out, limit=3))
    assert json.loads((out / "metrics.json").read_text())["rows"] == 3
    (out / OUTPUT_MARKER).unlink()  # as a vltrain before the marker left it
    evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", out=out, limit=2))
    assert json.loads((out / "metrics.json").read_text())["rows"] == 2
    default = evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned), world / "vqa", "val", limit=1))
    assert default["files"][-1] == str(finetuned / "eval" / "vqa-val" / "metrics.json")


# --- evaluate: one error line for every bad option ---------------------------------------------


def test_evaluate_refuses_bad_options_in_one_line(world, finetuned, tmp_path):
    common = ("--data", world / "vqa", "--out", tmp_path / "e")
    one_error_line(evaluate("--checkpoint", finetuned, "--step", "latest2", *common), EXIT_CONFIG, "--step 'latest2'")
    one_error_line(evaluate("--checkpoint", finetuned, "--batch-size", "0", *common), EXIT_CONFIG, "--batch-size 0")
    one_error_line(evaluate("--checkpoint", finetuned, "--limit", "-5", *common), EXIT_CONFIG, "--limit -5")
    one_error_line(
        evaluate("--checkpoint", tmp_path / "nope", *common), EXIT_CONFIG, f"{tmp_path / 'nope'} does not exist"
    )
    assert not (tmp_path / "e").exists()


def test_a_latest_pointer_of_garbage_or_outside_the_run_is_named(world, finetuned, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finetuned, run)
    latest = run / "checkpoints" / "latest"
    latest.write_bytes(b"\xff\xfe step \x80")
    proc = evaluate("--checkpoint", run, "--data", world / "vqa", "--out", tmp_path / "e")
    one_error_line(proc, EXIT_DATA, "not a checkpoint's name (not UTF-8 text)", "step_0000002.pt")
    elsewhere = tmp_path / "other" / "checkpoints"
    shutil.copytree(run / "checkpoints", elsewhere)
    for name in (f"../../other/checkpoints/{checkpoint.file_name(2)}", str(elsewhere / checkpoint.file_name(2))):
        latest.write_text(name)
        with pytest.raises(CheckpointError, match="no checkpoint file name of this run") as err:
            checkpoint.pointed(run)
        assert "no earlier checkpoint" not in str(err.value) and "step_0000002.pt" in str(err.value)


# --- finetune: every input checked before the first write --------------------------------------


def test_a_val_split_the_data_lacks_is_refused_before_any_write(world, tmp_path):
    for flags in (dict(val_split="vall"), dict(task_val_split={"vqa": "minvall"})):
        with pytest.raises(ConfigError, match="has no split 'm?i?n?vall'.*its splits: .*minval") as err:
            run_finetune(settings(world, tmp_path / "ft", **flags))
        assert ("--task-val-split vqa=minvall" if "task_val_split" in flags else "--val-split vall") in str(err.value)
        assert not (tmp_path / "ft" / "config.json").exists()


def test_corrupt_task_data_leaves_no_run_behind(world, tmp_path):
    data = tmp_path / "vqa"
    shutil.copytree(world / "vqa", data)
    items = bytearray((data / "items.arrow").read_bytes())
    items[len(items) // 2] ^= 0xFF
    (data / "items.arrow").write_bytes(bytes(items))
    proc = run_vltrain(
        "finetune", "--task", "vqa", "--data", data, "--stores", world / "feats", "--model", "lxmert-tiny",
        "--vocab", VOCAB, "--steps", "1", "--batch-size", "4", "--out", tmp_path / "ft",
    )  # fmt: skip
    one_error_line(proc, EXIT_DATA, "items.arrow")
    assert not (tmp_path / "ft").exists()


def _keys_only(path):
    torch.save({"not.a.model.weight": torch.zeros(2)}, path)


def _hostile(path):
    import datetime

    torch.save({"x": datetime.datetime(2020, 1, 1)}, path)


@pytest.mark.parametrize(
    "make, words",
    [
        (None, ["does not exist"]),
        (lambda p: p.write_bytes(b"garbage" * 20), ["cannot read as a torch checkpoint"]),
        (_hostile, ["datetime", "not loaded"]),
        (_keys_only, ["does not match"]),
    ],
)
def test_a_bad_init_leaves_no_run_behind_and_the_corrected_command_runs(world, tmp_path, make, words):
    init = tmp_path / "init.pt"
    if make:
        make(init)
    out = tmp_path / "ft"
    with pytest.raises(ConfigError) as err:
        run_finetune(settings(world, out, init=str(init), steps=1))
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "weights_only" not in str(err.value) and "safe_globals" not in str(err.value)
    assert not (out / "config.json").exists()
    run_finetune(settings(world, out, steps=1))  # the corrected command is not refused
    assert checkpoint.pointed(out) is not None


def test_a_corrupt_init_checkpoint_gives_advice_that_applies(world, finetuned, tmp_path):
    init = tmp_path / "init"
    shutil.copytree(finetuned, init)
    path = checkpoint.pointed(init)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch") as err:
        run_finetune(settings(world, tmp_path / "ft", init=str(init), model=None))
    assert "--overwrite" not in str(err.value) and "give another --init" in str(err.value)
    assert not (tmp_path / "ft").exists() or not (tmp_path / "ft" / "config.json").exists()


# --- run folders name their inputs for any working folder --------------------------------------


def test_a_run_records_absolute_input_paths_and_evaluates_from_anywhere(world, tmp_path, monkeypatch):
    monkeypatch.chdir(world)
    out = tmp_path / "ft"
    run_finetune(settings(world, out, task_data=("vqa",), stores=("feats",), val_split="val"))
    saved = json.loads((out / "config.json").read_text())["train"]
    assert saved["stores"] == [str(world / "feats")] and saved["task_data"] == [str(world / "vqa")]
    assert saved["vocab"] == str(VOCAB)
    proc = evaluate("--checkpoint", out, "--data", world / "vqa", "--limit", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # a run of an earlier version recorded the paths as given: named, and --stores overrides them
    state = checkpoint.load(checkpoint.pointed(out))
    state["run"]["train"]["stores"] = ["feats"]
    old = tmp_path / "old"
    checkpoint.save(old, state["step"], {k: v for k, v in state.items() if k not in ("step", "rng")})
    proc = evaluate("--checkpoint", old, "--data", world / "vqa", "--out", tmp_path / "e", "--limit", "1", cwd=tmp_path)
    one_error_line(proc, EXIT_CONFIG, "feats is not there", "--stores")
    proc = evaluate(
        "--checkpoint", old, "--data", world / "vqa", "--out", tmp_path / "e", "--limit", "1", "--stores",
        world / "feats", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_pretraining_run_records_absolute_input_paths(data, tmp_path, monkeypatch):
    monkeypatch.chdir(data)
    run(config(data, tmp_path, "lxmert-tiny", steps=1, stores=("feats",), mixture="mix"))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert (saved["stores"], saved["mixture"]) == ([str(data / "feats")], str(data / "mix"))


def test_resume_auto_of_a_run_that_recorded_relative_paths_continues(world, tmp_path, monkeypatch):
    monkeypatch.chdir(world)
    out = tmp_path / "ft"
    run_finetune(settings(world, out, checkpoint_every=1, stop_at=1))
    config = json.loads((out / "config.json").read_text())
    config["train"]["stores"] = ["feats"]  # as an earlier version recorded `--shards feats`
    (out / "config.json").write_text(json.dumps(config))
    state = checkpoint.load(checkpoint.pointed(out))
    state["run"]["train"]["stores"] = ["feats"]
    checkpoint.save(out, state["step"], {k: v for k, v in state.items() if k not in ("step", "rng")})
    run_finetune(settings(world, out, stores=("feats",), checkpoint_every=1, resume="auto"))
    assert checkpoint.step_of(checkpoint.pointed(out)) == 2


# --- export -------------------------------------------------------------------------------------


def export(*args):
    return run_vltrain("export", "--to", "hf", *map(str, args))


def test_export_refuses_a_symlinked_out(data, tmp_path):
    run(config(data, tmp_path, "lxmert-tiny", steps=1))
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    one_error_line(export(tmp_path / "run", tmp_path / "link"), EXIT_CONFIG, "symbolic link")
    assert not list((tmp_path / "empty").iterdir())
    assert export(tmp_path / "run", tmp_path / "hf").returncode == 0
    (tmp_path / "hf-link").symlink_to(tmp_path / "hf")  # a link to an export is no way to replace it
    one_error_line(export(tmp_path / "run", tmp_path / "hf-link", "--overwrite"), EXIT_CONFIG, "symbolic link")


def test_export_of_a_fine_tuning_run_is_its_backbone_with_the_usual_file_modes(finetuned, tmp_path):
    proc = export(finetuned, tmp_path / "hf")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "task heads (vqa) are not exported" in " ".join(proc.stdout.split())
    model = checkpoint.load(checkpoint.pointed(finetuned))["model"]
    got = load_exported(tmp_path / "hf").state_dict()
    assert all(torch.equal(got[k[len("backbone.") :]], v) for k, v in model.items() if k.startswith("backbone."))
    record = json.loads((tmp_path / "hf" / "config.json").read_text())["vltrain"]
    assert record["heads_not_exported"] == ["vqa"]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir() if p.is_file()}
    mask = os.umask(0)
    os.umask(mask)
    assert set(modes.values()) == {0o666 & ~mask}, modes
    assert read_state_dict(tmp_path / "hf")  # still a readable model.safetensors


def test_a_text_length_beyond_the_position_table_is_refused_before_any_write(world, data, tmp_path):
    """--max-text / --task-max-text over the model's position table would fail at the first
    long text, after the run folder was written: refused first (lxmert-tiny holds 64)."""
    with pytest.raises(ConfigError, match="--max-text 100: lxmert-tiny has 64 text positions"):
        run_finetune(settings(world, tmp_path / "a", max_text=100))
    with pytest.raises(ConfigError, match="--task-max-text vqa=80: lxmert-tiny has 64"):
        run_finetune(settings(world, tmp_path / "b", task_max_text={"vqa": 80}))
    with pytest.raises(ConfigError, match="--max-text 90: lxmert-tiny has 64 text positions"):
        run(config(data, tmp_path, "lxmert-tiny", out=str(tmp_path / "c"), max_text=90))
    assert not any((tmp_path / n).exists() for n in "abc")


def test_a_recipe_names_the_tasks_before_the_options_are_checked(world, tmp_path):
    """`finetune --recipe lxmert-vqa` without --task: the recipe's task is read first (it
    stopped with click's "Missing option '--task'"); without a recipe --task is still asked for."""
    proc = run_vltrain("finetune", "--recipe", "lxmert-vqa", "--data", world / "missing", "--stores", world / "feats",
                       "--out", tmp_path / "r")  # fmt: skip
    assert "Missing option" not in proc.stderr and "missing is not a task dataset" in " ".join(proc.stderr.split())
    proc = run_vltrain("finetune", "--data", world / "vqa", "--stores", world / "feats", "--out", tmp_path / "s")
    one_error_line(proc, 2, "--task: name at least one task")
