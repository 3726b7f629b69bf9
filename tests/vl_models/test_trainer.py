import json

import pytest
import torch
from helpers import run_vltrain
from train_helpers import VOCAB, config, no_dropout_config, pretrain_args

from pipeline.errors import ConfigError
from vl_models import families
from vl_models.train.trainer import run


@pytest.mark.parametrize("model", ["lxmert-tiny", "vilbert-tiny"])
def test_pretraining_runs_and_writes_a_run_folder(data, tmp_path, model):
    last = run(config(data, tmp_path, model))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "lr" in r]  # training rows (validation rows carry eval_* keys)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and last["step"] == 4
    keys = (
        {"loss_mlm", "loss_alignment", "loss_region"}
        if model == "vilbert-tiny"
        else {"loss_mlm", "loss_matching", "loss_obj", "loss_attr", "loss_feat", "loss_qa"}
    )
    assert keys <= set(rows[-1]) and all(torch.isfinite(torch.tensor(r[k])) for r in rows for k in keys)
    assert rows[-1]["peak_rss_mb"] > 50 and 0 <= rows[-1]["data_wait_fraction"] < 1 and rows[-1]["samples_per_s"] > 0
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_0000004.pt"
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())
    assert cfg["kind"] == model.split("-")[0] and cfg["train"]["optim"]["steps"] == 4


def test_resume_continues_bit_exactly(data, tmp_path):
    straight = tmp_path / "a"
    run(config(data, straight, "lxmert-tiny", steps=6, checkpoint_every=3))
    split = tmp_path / "b"
    run(config(data, split, "lxmert-tiny", steps=6, checkpoint_every=3, stop_at=3))
    run(config(data, split, "lxmert-tiny", steps=6, checkpoint_every=3, resume="yes"))
    a = torch.load(straight / "run" / "checkpoints" / "step_0000006.pt", weights_only=True)["model"]
    b = torch.load(split / "run" / "checkpoints" / "step_0000006.pt", weights_only=True)["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_init_from_a_checkpoint(data, tmp_path):
    """--init: a later run starts from an earlier run's weights (lr 0: stays there)."""
    run(config(data, tmp_path / "first", "lxmert-tiny", steps=2))
    first = tmp_path / "first" / "run" / "checkpoints" / "step_0000002.pt"
    run(config(data, tmp_path / "second", "lxmert-tiny", steps=1, lr=0.0, init=str(first)))
    a = torch.load(first, weights_only=True)["model"]
    b = torch.load(tmp_path / "second" / "run" / "checkpoints" / "step_0000001.pt", weights_only=True)["model"]
    for key in a:
        assert torch.equal(a[key], b[key]), key
    with pytest.raises(ConfigError, match="does not match"):
        run(config(data, tmp_path / "third", "vilbert-tiny", steps=1, init=str(first)))


def test_compiled_backbone_trains_like_eager(data, tmp_path):
    """`--compile`: same losses as eager (to float tolerance), same checkpoint keys."""
    model = no_dropout_config(tmp_path)
    # Batches of 2 padded to the maximum: the validation's batches and retrieval queries are all
    # of that shape too, so the compiled backbone is compiled once for training and once for
    # evaluation (a batch of another size, or one cut to its own longest text and region count,
    # recompiles it for dynamic shapes: a minute more on one CPU thread).
    shapes = dict(steps=2, batch_size=2, padding="max")
    eager = run(config(data, tmp_path / "eager", model, **shapes))
    compiled = run(config(data, tmp_path / "compiled", model, compile=True, **shapes))
    for key in ("loss_mlm", "loss_matching", "loss_obj", "loss_feat"):
        assert compiled[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-4), key
    a = torch.load(tmp_path / "eager" / "run" / "checkpoints" / "step_0000002.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "compiled" / "run" / "checkpoints" / "step_0000002.pt", weights_only=True)["model"]
    assert a.keys() == b.keys()


def test_cli_pretrain(data, tmp_path):
    proc = run_vltrain(*pretrain_args(data, tmp_path / "run", model="vilbert-tiny"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: step 4" in proc.stdout


def test_validation_metrics_and_plot(data, tmp_path):
    run(config(data, tmp_path, "vilbert-tiny", steps=4, eval_every=2))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_mlm_acc" in r or "eval_retrieval_R@1" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert {"eval_alignment_acc", "eval_retrieval_R@1", "eval_retrieval_R@5"} <= set(evals[-1])
    assert 0.0 <= evals[-1]["eval_retrieval_R@1"] <= 1.0 and evals[-1]["eval_retrieval_R@5"] == 1.0  # 2 images
    proc = run_vltrain("plot", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    from PIL import Image

    assert Image.open(tmp_path / "run" / "curves.png").size[0] > 1000


def test_evaluation_samples_every_source_of_the_split(data, tmp_path):
    """The val split lists its captions before its questions; a capped evaluation still scores QA."""
    from vl_models.config import DataSettings
    from vl_models.data.dataset import PretrainDataset
    from vl_models.eval.evaluate import evaluate
    from vl_models.train.trainer import build_model

    cfg = config(data, tmp_path, "lxmert-tiny")
    family, _, model = build_model(cfg, len(json.loads((data / "mix" / "answers.json").read_text())["answers"]))
    val = PretrainDataset(
        data / "mix",
        [data / "feats"],
        VOCAB,
        DataSettings(max_text=12, max_regions=10, mismatch_prob=0.0),
        family,
        split="val",
    )
    kinds = list(val.mixture.kinds[val.rows])
    assert kinds.index("question") >= 3, kinds  # the first three items are captions
    scores = evaluate(family, model, val, max_items=3)
    assert 0.0 <= scores["eval_qa_score"] <= 1.0 and "eval_matching_acc" in scores


def test_a_task_counts_from_its_start_step(data, tmp_path):
    from vl_models.train.trainer import build_model

    cfg = config(
        data, tmp_path, "vilbert-tiny", steps=4, checkpoint_every=1, weight_decay=0.0, from_step={"alignment": 3}
    )
    run(cfg)
    torch.manual_seed(cfg.run.seed)
    _, _, fresh = build_model(cfg, len(json.loads((data / "mix" / "answers.json").read_text())["answers"]))
    head = "cls.bi_seq_relationship.weight"  # used by the alignment loss alone
    saved = {
        s: torch.load(tmp_path / "run" / "checkpoints" / f"step_{s:07d}.pt", weights_only=True)["model"][head]
        for s in (3, 4)
    }
    assert torch.equal(saved[3], fresh.state_dict()[head])  # steps 0-2: weight 0, so no update
    assert not torch.equal(saved[4], saved[3])  # step 3 on: it trains


def test_task_names_and_cli_pairs_are_checked():
    import typer

    from vl_models.config import TaskConfig
    from vl_models.flags import _pairs

    assert TaskConfig(weights={"mlm": 2.0}, from_step={"alignment": 5}).weights_at(4) == {"mlm": 2.0, "alignment": 0.0}
    assert (
        TaskConfig(from_step={"alignment": 5}).weights_at(5) == {} == TaskConfig(from_step={"qa": 9}).weights_at(None)
    )
    with pytest.raises(ConfigError, match="vilbert has no task.*matching"):
        TaskConfig(from_step={"matching": 5}).check(families.get("vilbert"))
    TaskConfig(weights={"matching": 3.0}, from_step={"matching": 5}).check(families.get("lxmert"))
    assert _pairs("--task-from", int)(["alignment=1000", "mlm = 2"]) == {"alignment": 1000, "mlm": 2}
    for bad in (["alignment"], ["alignment=x"], ["=3"], ["mlm=1", "mlm=2"]):
        with pytest.raises(typer.BadParameter, match="expected TASK=INT"):
            _pairs("--task-from", int)(bad)
    for bad in (
        TaskConfig(weights={"mlm": float("nan")}),
        TaskConfig(weights={"mlm": -1.0}),
        TaskConfig(from_step={"mlm": -5}),
    ):
        with pytest.raises(ConfigError, match="finite and >= 0"):
            bad.check(families.get("vilbert"))


def test_resume_refuses_a_run_of_another_model(data, tmp_path):
    run(config(data, tmp_path, "vilbert-tiny", steps=2))
    with pytest.raises(ConfigError, match="holds a run of model 'vilbert-tiny', not 'vilbert-small'"):
        run(config(data, tmp_path, "vilbert-small", steps=4, resume="yes"))
