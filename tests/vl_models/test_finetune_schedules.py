"""Fine-tuning schedules as the references run them: the published recipes (`vltrain finetune
--recipe`, airsplay/lxmert's run scripts, vilbert-multi-task's vilbert_tasks.yml and its
multi-task loop), 12-in-1's per-task settings (loss scale, batch size, text length, splits),
its faster ``vil_*`` heads and NLVR2 loss, and the 12-in-1 splits of GQA."""

import json

import pytest
import torch
from helpers import run_vltrain
from train_helpers import VOCAB, finetune_config

from pipeline.errors import ConfigError
from pipeline.task_data import TaskData
from vl_models import transfer
from vl_models.config import FinetuneConfig
from vl_models.train import checkpoint
from vl_models.train.recipes import FINETUNE_RECIPE_DIR, load_recipe
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.task import Row

# The published numbers, written out here independently of the recipe files:
# airsplay/lxmert README's fine-tuning table and run/{vqa,gqa,nlvr2}_finetune.bash, src/tasks/*.py;
# vilbert-multi-task vilbert_tasks.yml (TASK1, 5, 6, 8, 10, 12, 15) and train_tasks.py.
LX = {"epochs": 4, "batch_size": 32, "optimizer": "bertadam", "warmup": 0.1, "clip": 5.0, "max_text": 20}
MT = {"optimizer": "adamw-uncorrected", "warmup": 0.1, "weight_decay": 0.01, "clip": 0, "max_regions": 100}
PUBLISHED = {
    "lxmert-vqa": {**LX, "task": "vqa", "lr": 5e-5, "train_split": "train,nominival", "val_split": "minival"},
    "lxmert-gqa": {**LX, "task": "gqa", "lr": 1e-5, "train_split": "train,val", "val_split": "testdev"},
    "lxmert-nlvr2": {**LX, "task": "nlvr2", "lr": 5e-5, "nlvr2_loss": "ce"},
    "vilbert-vqa": {**MT, "task": "vqa", "epochs": 20, "batch_size": 128, "lr": 4e-5, "head_lr": 1e-4, "max_text": 23},
    "vilbert-gqa": {**MT, "task": "gqa", "epochs": 20, "batch_size": 128, "lr": 4e-5, "head_lr": 1e-4, "max_text": 26},
    "vilbert-nlvr2": {**MT, "task": "nlvr2", "epochs": 20, "batch_size": 64, "lr": 2e-5, "nlvr2_loss": "bce"},
    "vilbert-refcoco+": {**MT, "task": "refcoco+", "epochs": 20, "batch_size": 256, "lr": 2e-5, "max_text": 20},
    "vilbert-flickr30k": {**MT, "task": "flickr30k", "epochs": 20, "batch_size": 128, "lr": 2e-5, "max_text": 30},
    "vilbert-vcr-q2a": {**MT, "task": "vcr-q2a", "epochs": 10, "batch_size": 64, "lr": 2e-5, "max_text": 60},
    "vilbert-vcr-qa2r": {**MT, "task": "vcr-qa2r", "epochs": 10, "batch_size": 64, "lr": 2e-5, "max_text": 80},
    "vilbert-12in1": {
        **MT,
        "epochs": 20,
        "lr": 2e-5,
        "task_sampling": "cycle",
        "task_lr": {"vqa": 4e-5, "gqa": 4e-5, "refcoco+": 2e-5, "nlvr2": 2e-5, "flickr30k": 2e-5},
        "task_batch": {"vqa": 128, "gqa": 128, "refcoco+": 256, "nlvr2": 64, "flickr30k": 128},
        "task_max_text": {"vqa": 23, "gqa": 26, "refcoco+": 20, "nlvr2": 40, "flickr30k": 30},
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_finetune_recipes_hold_the_published_numbers_each_cited(name):
    path, values = load_recipe(name, FINETUNE_RECIPE_DIR)
    for key, expected in PUBLISHED[name].items():
        got = values[key]
        assert (got if not isinstance(got, dict) else {k: got[k] for k in expected}) == expected, key
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            assert any(f"[{tag}" in line for tag in ("code", "bash", "yml", "readme")), f"uncited: {line}"
    assert sorted(p.stem for p in FINETUNE_RECIPE_DIR.glob("*.yaml")) == sorted(PUBLISHED)


def _flags(world, out, *tasks):
    return [
        "finetune",
        *(x for t in tasks for x in ("--task", t)),
        *(x for t in tasks for x in ("--data", str(world / t))),
        "--stores",
        str(world / "feats"),
        "--model",
        "vilbert-tiny",
        "--vocab",
        str(VOCAB),
        "--out",
        str(out),
        "--max-regions",
        "8",
        "--log-every",
        "1",
    ]


def test_12in1_recipe_runs_the_multi_task_schedule(world, tmp_path):
    """`--recipe vilbert-12in1` on two of its tasks: their entries of the per-task values
    (the other tasks' dropped), command-line flags over the recipe's, one batch of each task
    per round at its own size, the ``vil_*`` heads' parameter groups at 1e-4."""
    out = tmp_path / "run"
    args = _flags(world, out, "vqa", "nlvr2")
    proc = run_vltrain(
        *args, "--recipe", "vilbert-12in1", "--steps", "4", "--task-batch", "vqa=4", "--task-batch", "nlvr2=2"
    )
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((out / "config.json").read_text())["train"]
    transfer_cfg, optim = saved["transfer"], saved["optim"]
    assert transfer_cfg["task_lr"] == {"vqa": 4e-5, "nlvr2": 2e-5} and transfer_cfg["task_sampling"] == "cycle"
    assert transfer_cfg["task_batch"] == {"vqa": 4, "nlvr2": 2}  # the flags replace the recipe's
    assert transfer_cfg["task_max_text"] == {"vqa": 23, "nlvr2": 40}
    assert transfer_cfg["task_val_split"] == {"vqa": "minval", "nlvr2": "dev"}
    assert transfer_cfg["head_lr"] == 1e-4 and transfer_cfg["nlvr2_loss"] == "bce"
    assert (optim["lr"], optim["optimizer"], optim["clip"], optim["steps"]) == (2e-5, "adamw-uncorrected", 0, 4)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [("loss_vqa" in r, "loss_nlvr2" in r) for r in rows if "loss_vqa" in r or "loss_nlvr2" in r]
    assert trained == [(True, False), (False, True)] * 2
    state = checkpoint.load(checkpoint.pointed(out, checkpoint.LATEST))
    groups = state["optimizer"]["param_groups"]
    assert sorted({g["lr_scale"] for g in groups}) == [1.0, 5.0]  # 1e-4 / 2e-5
    assert state["sampler"]["batch_size"] == [4, 2]


def test_recipe_per_task_values_must_name_a_task_of_the_run(world, tmp_path):
    proc = run_vltrain(*_flags(world, tmp_path / "r", "vqa"), "--task-lr", "gqa=1e-4", "--steps", "1")
    assert proc.returncode == 2 and "--task-lr: gqa is no --task of this run (vqa)" in proc.stderr


def _one_step(world, out, **kw) -> dict:
    """The vqa head's output weights after one plain SGD step (no warmup, no decay)."""
    plain_sgd = dict(steps=1, lr=0.1, optimizer="sgd", warmup=0, weight_decay=0.0, clip=0, checkpoint_every=1)
    run_finetune(finetune_config(world, out, **{**plain_sgd, **kw}))
    return checkpoint.load(checkpoint.pointed(out, checkpoint.LATEST))["model"]


def test_task_lr_scales_the_loss_and_head_lr_the_vil_heads(world, tmp_path):
    """12-in-1's per-task lr is a loss scale (its task lr / the optimizer's); --head-lr runs the
    ``vil_*`` heads' parameters faster. With SGD's first step both are exact multiples."""
    init = _one_step(world, tmp_path / "init", lr=0.0)
    plain = _one_step(world, tmp_path / "plain")
    scaled = _one_step(world, tmp_path / "scaled", task_lr={"vqa": 0.3})
    fast_head = _one_step(world, tmp_path / "head", head_lr=0.5)
    key, body = "heads.vqa.logit_fc.3.weight", "backbone.lxmert.pooler.dense.weight"
    step = plain[key] - init[key]
    assert step.abs().max() > 0
    torch.testing.assert_close(scaled[key] - init[key], 3 * step)
    torch.testing.assert_close(scaled[body] - init[body], 3 * (plain[body] - init[body]))
    torch.testing.assert_close(fast_head[key] - init[key], 5 * step)
    torch.testing.assert_close(fast_head[body], plain[body])  # the backbone at --lr


def test_hard_negatives_need_a_retrieval_task(world, tmp_path):
    with pytest.raises(ConfigError, match="retrieval"):
        run_finetune(
            FinetuneConfig.of(
                tasks=("vqa",),
                task_data=(str(world / "vqa"),),
                stores=(str(world / "feats"),),
                out=str(tmp_path / "x"),
                model="lxmert-tiny",
                vocab=str(VOCAB),
                hard_negatives=str(tmp_path / "hard_negative.pkl"),
            )
        )


def test_nlvr2_loss_defaults_to_the_familys_own(world, tmp_path):
    """ViLBERT's NLVR2 head trains with 12-in-1's BCE, LXMERT's with cross-entropy; --nlvr2-loss wins."""
    from vl_models import families
    from vl_models.transfer.heads import build_transfer_model

    data = [TaskData.open(world / "nlvr2")]
    task = [transfer.get("nlvr2")]
    for name, expected in (("vilbert", "bce"), ("lxmert", "ce")):
        family = families.get(name)
        mcfg = families.load_config(f"{name}-tiny")
        model = build_transfer_model(family, mcfg, task, data, pair_loss=family.pair_loss)
        assert model.heads["nlvr2"].loss_kind == expected


def test_gqa_minval_is_12in1s_last_3000_by_question_id():
    """vilbert/datasets/gqa_dataset.py: train + val sorted by question id, the last 3,000."""
    import random

    ids = list(range(10, 3010)) + list(range(5000, 5005))
    random.Random(0).shuffle(ids)
    rows = [Row(uid=f"{q:08d}", split="train" if q % 2 else "val", images=("x",), text="?") for q in ids]
    rows.append(Row(uid="99999999", split="testdev", images=("x",), text="?"))
    minval = transfer.get("gqa").named_splits(rows)["minval"]
    assert sorted(int(rows[i].uid) for i in minval) == list(range(15, 3010)) + list(range(5000, 5005))
