"""The batched read path of `PretrainDataset` (`__getitems__`: one `get_many_into` per batch)
gives exactly the per-record path's examples and batches."""

import pytest
import torch

from train_helpers import VOCAB

from vl_models import families
from vl_models.config import DataSettings
from vl_models.data.dataset import PretrainDataset


@pytest.mark.parametrize("model, settings", [
    ("lxmert", dict(max_regions=10)),
    ("vilbert", dict(max_regions=4, region_prob=0.5, region_overlap="zero")),  # fewer slots than some images have regions
])
def test_batched_examples_equal_the_per_record_path(data, model, settings):
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=12, **settings),
                         families.get(model), seed=5)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        indices = [7, 0, 3, 3, 11, 5]  # repeats: the same image twice in one batch
        expected = torch.utils.data.default_collate([ds[i] for i in indices])
        loader = torch.utils.data.DataLoader(ds, batch_size=len(indices), sampler=indices)  # calls __getitems__
        (got,) = list(loader)
        assert got.keys() == expected.keys()
        for key in expected:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), (epoch, key)
