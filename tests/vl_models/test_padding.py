"""Dynamic padding (`vl_models.data.padding`): a batch cut to the text length and region slots
its examples use gives each example the outputs and the batch the losses of the fully padded
batch."""

import numpy as np
import pytest
import torch
from train_helpers import VOCAB, config, no_dropout_config

from vl_models import families
from vl_models.config import DataSettings, TaskConfig
from vl_models.data.dataset import PretrainDataset
from vl_models.data.padding import REGION_SLOTS, padded, trim_padding, used_length
from vl_models.tasks.pretrain import pretrain_losses


def test_text_and_region_tensors_are_cut_on_their_own_axes():
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0]])  # a hole: cut after the last set position
    vmask = torch.zeros(2, 3, 8, dtype=torch.long)  # (B, C, N): candidates of a transfer example
    vmask[0, 1, :5] = 1
    vmask[1, 0, :2] = 1
    batch = {
        "input_ids": torch.arange(12).reshape(2, 6),
        "attention_mask": mask,
        "lm_labels": torch.full((2, 6), -1),
        "visual_mask": vmask,
        "visual_feats": torch.randn(2, 3, 8, 16),
        "boxes": torch.randn(2, 8, 4),  # (B, N, 4): slots before the box axis
        "region_iou": torch.rand(2, 8),
        "label": torch.tensor([0, 1]),
    }
    out = trim_padding(batch)
    assert used_length(mask) == 4 and out["input_ids"].shape == (2, 4) and out["lm_labels"].shape == (2, 4)
    assert out["visual_mask"].shape == (2, 3, 5) and out["visual_feats"].shape == (2, 3, 5, 16)
    assert out["boxes"].shape == (2, 5, 4) and out["region_iou"].shape == (2, 5)
    assert torch.equal(out["visual_feats"], batch["visual_feats"][:, :, :5]) and out["visual_feats"].is_contiguous()
    assert out["label"] is batch["label"] and out[REGION_SLOTS].tolist() == [8, 8]
    assert padded(batch, "max") is batch
    assert trim_padding({"label": batch["label"]}) == {"label": batch["label"]}
    assert used_length(torch.zeros(2, 5)) == 1  # nothing set: one position, not an empty tensor


def _batch(data, family, settings, indices):
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, settings, family, seed=2)
    return PretrainDataset.collate(ds.__getitems__(indices))


@pytest.mark.parametrize("model", ["lxmert-tiny", "vilbert-tiny"])
def test_pretraining_outputs_and_losses_are_those_of_the_padded_batch(data, model):
    """Texts padded to 36 tokens and images to 20 slots (the fixture's have 5-11 regions): the
    cut batch gives every example the same pair logit, answer logits (LXMERT), and masked-token
    and masked-region predictions, and the batch the same losses, within 1e-5."""
    from vl_models.transfer.runs import model_of

    family, mcfg = model_of(model, None, str(data / "feats"), 10)
    torch.manual_seed(0)
    net = family.build(mcfg).eval()
    full = _batch(data, family, DataSettings(max_text=36, max_regions=20), list(range(8)))
    cut = trim_padding(full)
    assert cut["input_ids"].shape[1] < 20 and cut["visual_mask"].shape[1] <= 12 + family.img_token
    with torch.no_grad():
        a, b = family.forward(net, full), family.forward(net, cut)
        for name in ("lm_logits", family.pair_output, "feat_pred", "region_logits", "answer_logits"):
            if not hasattr(a, name):
                continue
            x, y = getattr(a, name), getattr(b, name)
            assert x.shape == y.shape and (x - y).abs().max() < 1e-5, name
        _, losses_full, _ = pretrain_losses(family, net, full, TaskConfig(), epoch=10**6)
        _, losses_cut, _ = pretrain_losses(family, net, cut, TaskConfig(), epoch=10**6)
    assert losses_full.keys() == losses_cut.keys()
    for task in losses_full:
        assert abs(float(losses_full[task]) - float(losses_cut[task])) < 1e-5, task


@pytest.mark.parametrize("padding", ["batch", "max"])
def test_pretraining_evaluation_scores_the_same_either_way(data, padding):
    """`evaluate` (pretraining metrics, QA score and zero-shot retrieval) pads as the data
    settings say, with the same scores."""
    from vl_models.eval.evaluate import evaluate
    from vl_models.transfer.runs import model_of

    family, mcfg = model_of("lxmert-tiny", None, str(data / "feats"), 10)
    torch.manual_seed(0)
    net = family.build(mcfg).eval()
    scores = {}
    for mode in ("max", padding):
        settings = DataSettings(max_text=36, max_regions=20, padding=mode)
        ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, settings, family, split="val", seed=2)
        scores[mode] = evaluate(family, net, ds, batch_size=3)
    assert scores["max"].keys() == scores[padding].keys()
    for k, v in scores["max"].items():
        assert np.isclose(v, scores[padding][k], atol=1e-5), k


def test_a_dropout_free_training_run_is_the_same_with_either_padding(data, tmp_path):
    """Four optimizer steps of lxmert-tiny without dropout (whose draws depend on the tensors'
    shapes): every logged loss of the cut batches equals the fully padded run's within 1e-5."""
    import json

    from vl_models.train.trainer import run

    logged = {}
    for padding in ("max", "batch"):
        out = tmp_path / padding
        run(config(data, tmp_path, no_dropout_config(tmp_path), out=str(out), max_text=36, padding=padding))
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        logged[padding] = [{k: v for k, v in r.items() if k.startswith("loss_")} for r in rows if "loss_mlm" in r]
    assert len(logged["max"]) == 4 and logged["max"][0].keys() == logged["batch"][0].keys()
    for a, b in zip(logged["max"], logged["batch"]):
        for k in a:
            assert abs(a[k] - b[k]) < 1e-5, (k, a[k], b[k])


def test_pretraining_items_are_grouped_by_the_text_they_have_that_epoch(data):
    """A pair negative swaps an item's text for another image's: `text_lengths(epoch)` gives the
    length of the text each item has in that epoch (the draw `__getitem__` makes), so length
    grouping sorts by what the batch will hold."""
    ds = PretrainDataset(
        data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=36), families.get("lxmert"), seed=4
    )
    own = ds.mixture.text_words()[ds.rows]
    swapped = 0
    for epoch in (0, 1):
        lengths = ds.text_lengths(epoch)
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            example = ds[i]
            row, matched = ds._pair_text(i, np.random.default_rng([4, epoch, i]))
            text = ds.mixture.text(row)
            assert int(example["matched"]) == matched and lengths[i] == len(text.split())
            assert int(example["attention_mask"].sum()) == int(ds.tokenizer.encode(text, 36).mask.sum())
            swapped += int(lengths[i] != own[i])
    assert swapped > 0  # captions (8 words) and questions (4 words) swapped for each other
