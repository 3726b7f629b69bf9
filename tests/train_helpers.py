"""Helpers of the trainer tests: the real BERT vocab, a tiny pretraining run's config and a
tiny fine-tuning run's (importable from any test folder: a `conftest` module name is shared
by every folder)."""

import json

import torch
from helpers import REPO

from vl_models.config import FinetuneConfig, TrainConfig
from vl_models.data.tokenize import bundled_bert_vocab

VOCAB = bundled_bert_vocab()


def config(data, tmp_path, model, **kw) -> TrainConfig:
    """A tiny run of `model` on the `data` fixture into tmp_path/run (4 steps, batch 4)."""
    base = dict(
        model=model,
        stores=(str(data / "feats"),),
        mixture=str(data / "mix"),
        out=str(tmp_path / "run"),
        vocab=str(VOCAB),
        steps=4,
        batch_size=4,
        lr=1e-3,
        warmup=1,
        checkpoint_every=2,
        log_every=1,
        max_regions=10,
        max_text=12,
    )
    return TrainConfig.of(**{**base, **kw})


def finetune_config(world, out, tasks=("vqa",), **kw) -> FinetuneConfig:
    """A tiny fine-tuning run of lxmert-tiny on the task datasets `world/<task>` (over the store
    `world/feats`, `tests/task_files.py`'s world) into `out` (4 steps, batch 4)."""
    base = dict(
        tasks=tuple(tasks),
        task_data=tuple(str(world / t) for t in tasks),
        stores=(str(world / "feats"),),
        out=str(out),
        model="lxmert-tiny",
        vocab=str(VOCAB),
        epochs=None,
        steps=4,
        batch_size=4,
        max_regions=8,
        max_text=12,
        lr=1e-3,
        log_every=1,
        checkpoint_every=2,
    )
    return FinetuneConfig.of(**{**base, **kw})


def assert_pretraining_logits_match(ours, hf, ids, feats, pos, mask, vmask, tol: float = 1e-4) -> None:
    """Our LxmertForPreTraining and transformers' give the same LM, matching and QA logits."""
    with torch.no_grad():
        a = ours(ids, feats, pos, attention_mask=mask, visual_attention_mask=vmask)
        b = hf(input_ids=ids, visual_feats=feats, visual_pos=pos, attention_mask=mask, visual_attention_mask=vmask)
    for x, y in (
        (a.lm_logits, b.prediction_logits),
        (a.matched_logits, b.cross_relationship_score),
        (a.answer_logits, b.question_answering_score),
    ):
        assert (x - y).abs().max() <= tol


def no_dropout_config(tmp_path) -> str:
    """lxmert-tiny with dropout off (DDP and compiled runs draw dropout masks differently)."""
    cfg = json.loads((REPO / "vl_models" / "models" / "model_configs" / "lxmert-tiny.json").read_text())
    cfg.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, name="lxmert-tiny-nodrop")
    (tmp_path / "nodrop.json").write_text(json.dumps(cfg))
    return str(tmp_path / "nodrop.json")


def pretrain_args(data, out, *extra, model: str = "lxmert-tiny") -> list:
    """The command-line form of `config(data, ..., model)`: `vltrain pretrain` flags."""
    return [
        "pretrain",
        "--model",
        model,
        "--stores",
        data / "feats",
        "--mixture",
        data / "mix",
        "--vocab",
        VOCAB,
        "--out",
        out,
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--checkpoint-every",
        "1",
        "--log-every",
        "1",
        "--max-regions",
        "10",
        "--max-text",
        "12",
        *extra,
    ]
