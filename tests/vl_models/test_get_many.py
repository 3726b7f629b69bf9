"""The batched read path of `PretrainDataset` (`__getitems__`: one `get_many_into` per batch,
then `collate`) gives exactly the per-record path's examples and batches."""

import numpy as np
import pytest
import torch
from train_helpers import VOCAB

from pipeline.store import FeatureStore, write_records
from pipeline.store.buffer import pad_regions
from vl_models import families
from vl_models.config import DataSettings
from vl_models.data.dataset import PretrainDataset, collate


@pytest.mark.parametrize(
    "model, settings",
    [
        ("lxmert", dict(max_regions=10)),
        (
            "vilbert",
            dict(max_regions=4, region_prob=0.5, region_overlap="zero"),
        ),  # fewer slots than some images have regions
    ],
)
def test_batched_examples_equal_the_per_record_path(data, model, settings):
    ds = PretrainDataset(
        data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=12, **settings), families.get(model), seed=5
    )
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        indices = [7, 0, 3, 3, 11, 5]  # repeats: the same image twice in one batch
        expected = torch.utils.data.default_collate([ds[i] for i in indices])
        loader = torch.utils.data.DataLoader(ds, batch_size=len(indices), sampler=indices)  # calls __getitems__
        (got,) = list(loader)
        assert got.keys() == expected.keys()
        for key in expected:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), (epoch, key)


@pytest.mark.parametrize("model, workers", [("lxmert", 0), ("vilbert", 1)])
def test_collate_takes_the_batch_arrays_as_they_are(data, model, workers):
    """`collate` of `__getitems__`'s examples equals the default collate of the per-record
    examples; the region arrays are the batch arrays themselves (no copy), also from a
    worker (shared memory)."""
    ds = PretrainDataset(
        data / "mix", [data / "feats"], VOCAB, DataSettings(max_text=12, max_regions=6), families.get(model), seed=3
    )
    indices = [4, 1, 9, 1]
    expected = torch.utils.data.default_collate([ds[i] for i in indices])
    examples = ds.__getitems__(indices)
    direct = collate(examples)
    assert direct["visual_feats"].data_ptr() == examples[0]["visual_feats"].ctypes.data  # the same memory
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=len(indices),
        sampler=indices,
        collate_fn=collate,
        num_workers=workers,
        timeout=60 if workers else 0,
    )
    for got in (direct, next(iter(loader))):
        assert got.keys() == expected.keys()
        for key in expected:
            assert got[key].dtype == expected[key].dtype and torch.equal(got[key], expected[key]), key


@pytest.mark.parametrize("fields", [("objects_id", "objects_conf", "attrs_id", "attrs_conf"), ("cls_prob",)])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_stored_dtype_gather_of_some_fields_equals_pad_regions(data, tmp_path, fields, dtype):
    """A gather in the stored dtype with only some fields equals `pad_regions` over the
    records (float32) once converted; the fields left out are None."""
    store = FeatureStore.open(data / "feats")
    ids = list(store.ids())[:5]
    if dtype == "float16":
        store = write_records(tmp_path / "f16", [store.get(i) for i in ids], feature_dim=16, dtype="float16")
    buffer = store.region_buffer(len(ids), 4, fields=fields, dtype=store.layout.dtype, img_token=True)
    got = store.get_many_into(ids, buffer).batch(img_feature=False)
    want = pad_regions([store.get(i) for i in ids], 4, img_token=True)
    assert got.features.dtype == store.layout.np_dtype
    np.testing.assert_array_equal(got.features[:, 1:].astype(np.float32), want.features[:, 1:])
    for name in ("positions", "mask", "regions", "slots_used"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    for name in ("objects_id", "objects_conf", "attrs_id", "attrs_conf", "cls_prob", "attr_prob"):
        if name in fields:
            np.testing.assert_array_equal(
                np.asarray(getattr(got, name), getattr(want, name).dtype), getattr(want, name)
            )
        else:
            assert getattr(got, name) is None
