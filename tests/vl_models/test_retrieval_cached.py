"""Retrieval through each caption's and each image's single-modality states computed once
(`vl_models.transfer.evaluate.pair_scores`), per family, where users meet it: `vltrain evaluate
--zero-shot` and `vltrain predict`'s rankings. Both score through `pair_scores` (captions sorted
by length, each batch and each image padded to what it uses), and its scores equal full pair
forwards of the same pairs to 1e-5 (`retrieval_helpers.full_pair_scores`). `vltrain evaluate`
with a fine-tuned head: `test_transfer.py`."""

import pytest
from retrieval_helpers import assert_scores_as_full_forwards, spy_on_pair_scores
from train_helpers import finetune_config

from vl_models import load_predictor
from vl_models.config import EvaluateConfig
from vl_models.predict import StoreImage
from vl_models.predict import predictor as predict_module
from vl_models.transfer import evaluate as ev
from vl_models.transfer.finetune import run_finetune

FAMILIES = ("lxmert-tiny", "vilbert-tiny")


@pytest.fixture(scope="module", params=FAMILIES)
def run(request, world, tmp_path_factory):
    """A one-step fine-tuning run on Flickr30k of each family (the pretraining pair head)."""
    out = tmp_path_factory.mktemp(request.param) / "ft"
    run_finetune(finetune_config(world, out, ["flickr30k"], model=request.param, steps=1, warmup=1))
    return out


def assert_as_full_forwards(seen: dict) -> None:
    assert seen["view"].cfg.padding == "batch"
    assert_scores_as_full_forwards(seen)


def test_zero_shot_evaluation_scores_as_full_forwards(world, run, tmp_path, monkeypatch):
    seen = spy_on_pair_scores(monkeypatch, ev)
    result = ev.evaluate_checkpoint(
        EvaluateConfig("flickr30k", str(run), world / "flickr30k", "test", out=tmp_path / "z", zero_shot=True, limit=3)
    )
    assert result["examples"] == 15 and seen["scores"].shape == (15, 3)
    assert_as_full_forwards(seen)


def test_predict_rankings_score_as_full_forwards(world, run, monkeypatch):
    """A caption ranking images and an image ranking captions of several lengths, in caption
    batches of 2 (several batches, each padded to its own longest)."""
    seen = spy_on_pair_scores(monkeypatch, predict_module)
    p = load_predictor(run, batch_size=2)
    keys = ["img_24", "img_25", "img_26", "img_27"]
    ranking = p.rank("a red picture", [StoreImage(k) for k in keys])
    assert seen["scores"].shape == (1, 4) and seen["images"] == keys
    assert sorted(score for _, score in ranking) == sorted(seen["scores"][0].tolist())
    assert_as_full_forwards(seen)
    captions = ["red", "a red picture", "something blue everywhere", "all green", "the colour red in a picture"]
    ranking = p.rank_captions(StoreImage("img_25"), captions)
    assert seen["scores"].shape == (5, 1) and dict(ranking) == dict(zip(captions, seen["scores"][:, 0].tolist()))
    lengths = {int(seen["view"].text(seen["view"].value("text", i))["attention_mask"].sum()) for i in range(5)}
    assert len(lengths) > 2  # captions of several lengths: batches padded differently
    assert_as_full_forwards(seen)
