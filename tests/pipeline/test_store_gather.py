"""Batched reads (`FeatureStore.get_many_into`) are exact: a batch gathered into a buffer,
in any order and into any slots, equals `pad_regions` over `get_many`, field by field, on
both backends, for every way a shard reader hands a gather its records (Arrow: views of
the shard's map; LMDB: per record one flat view of its value per dtype)."""

import re

import numpy as np
import pytest
from helpers import make_record

import pipeline.store.index as index_module
import pipeline.store.store as store_module
from pipeline.records import OPTIONAL_ARRAYS
from pipeline.store import FeatureStore, write_records
from pipeline.store.buffer import pad_regions

BACKENDS = ["arrow", "lmdb"]
FIELDS = ("image_ids", "features", "positions", "mask", "regions", "slots_used", *OPTIONAL_ARRAYS)


def varied_records(count: int, seed: int = 3) -> list:
    """Records of 1 to 9 boxes, every fourth without object labels, every fifth without
    attribute labels or probability tables."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(count):
        bare = i % 5 == 2
        rec = make_record(rng, f"img{i:03d}", num_boxes=1 + i * 7 % 9, feature_dim=16, labels=not bare)
        if bare:
            rec.cls_prob = rec.attr_prob = None
        if i % 4 == 1:
            rec.objects_id = rec.objects_conf = None
        recs.append(rec)
    return recs


def assert_batch_equal(got, want, fields=FIELDS) -> None:
    for name in fields:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), name
        assert a is None or (np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)), name


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("prob", ["full", "topk:3"])
def test_shuffled_ids_into_given_slots_equal_pad_regions(tmp_path, backend, prob):
    """Several shards of several record batches; each image compared alone, so that a
    field one record lacks is still compared for the others."""
    recs = varied_records(23)
    write_records(
        tmp_path / "s", recs, backend=backend, shard_size=6, feature_dim=16, cls_prob=prob, attr_prob=prob, batch_rows=4
    )
    store = FeatureStore.open(tmp_path / "s", dtype="float32")
    assert len(store.manifest.shards) == 4
    rng = np.random.default_rng(0)
    ids = [recs[i].image_id for i in rng.permutation(len(recs))]
    for max_regions, img_token in ((4, True), (9, False)):  # fewer slots than some records' boxes; room for all
        buffer = store.region_buffer(len(ids) + 3, max_regions, img_token=img_token)
        slots = rng.permutation(len(ids) + 3)
        for batch in (ids[:11], ids[11:], ids[5:16]):  # the buffer reused: what a larger image left is cleared
            store.get_many_into(batch, buffer, slots=slots[: len(batch)].tolist())
            for image_id, slot in zip(batch, slots):
                got = buffer.batch(slice(slot, slot + 1))
                assert_batch_equal(got, pad_regions([store.get(image_id)], max_regions, img_token=img_token))


@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_batch_equals_pad_regions_in_stored_float16_and_for_chosen_fields(tmp_path, backend):
    recs = [r for i, r in enumerate(varied_records(18)) if i % 5 != 2 and i % 4 != 1]  # every field present
    write_records(tmp_path / "s", recs, backend=backend, shard_size=4, feature_dim=16)
    stored, as_f32 = FeatureStore.open(tmp_path / "s"), FeatureStore.open(tmp_path / "s", dtype="float32")
    ids = [recs[i].image_id for i in np.random.default_rng(1).permutation(len(recs))]
    want = pad_regions(as_f32.get_many(ids), 7)
    lxmert = ("objects_id", "objects_conf", "attrs_id", "attrs_conf")
    for fields in (None, lxmert, ("cls_prob",), ()):
        got = stored.get_many_into(ids, stored.region_buffer(len(ids), 7, dtype="float16", fields=fields)).batch()
        assert got.features.dtype == np.float16  # copied as stored, then compared in float32
        for name in FIELDS:
            a, b = getattr(got, name), getattr(want, name)
            if fields is not None and name in OPTIONAL_ARRAYS and name not in fields:
                assert a is None, name
            else:
                assert a is not None and np.array_equal(np.asarray(a).astype(np.asarray(b).dtype), b), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_colliding_hashes_probe_on_to_each_record(tmp_path, backend, monkeypatch):
    """Every id hashes alike: each lookup meets other ids' rows first (the reader says so,
    and an LMDB part leaves those rows empty) and probes on, still to the right record."""
    monkeypatch.setattr(index_module, "id_hash", lambda key: 7)
    monkeypatch.setattr(store_module, "id_hash", lambda key: 7)
    recs = varied_records(9)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=4, feature_dim=16)
    store = FeatureStore.open(tmp_path / "s", dtype="float32")
    ids = [r.image_id for r in recs[::-1]]
    got = store.get_many_into(ids, store.region_buffer(len(ids), 9)).batch()
    stored = {rec.image_id: rec for rec in store}  # read in storage order (`get` hashes as the index should)
    assert_batch_equal(got, pad_regions([stored[i] for i in ids], 9))
    with pytest.raises(KeyError, match=re.escape(f"'absent' is not in the feature store {tmp_path / 's'}")):
        store.get_many_into([ids[0], "absent"], store.region_buffer(2, 9))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("max_regions", [5, 3])
def test_batches_of_one_shard_and_of_many_equal_single_reads(tmp_path, dtype, max_regions):
    """Equal-size records (the fixed-36 case) read in batches that lie in one Arrow shard (in
    storage order, reversed) or across shards (shuffled; two from each of two shards), from
    shards of several record batches, into buffers that hold all of a record's regions or its
    first few, in the stored float16 and converted to float32: every field equals
    `pad_regions` over single reads; an absent id among present ones is named."""
    rng = np.random.default_rng(4)
    recs = [make_record(rng, f"img{i:03d}", num_boxes=5, feature_dim=16) for i in range(20)]
    write_records(tmp_path / "s", recs, shard_size=10, feature_dim=16, batch_rows=3)
    stored, as_f32 = FeatureStore.open(tmp_path / "s"), FeatureStore.open(tmp_path / "s", dtype="float32")
    ids = [r.image_id for r in recs]
    for batch in (ids[:10], ids[12:20][::-1], [ids[i] for i in rng.permutation(20)], ids[3:5] + ids[11:13]):
        buffer = stored.region_buffer(len(batch), max_regions, dtype=dtype)
        got = stored.get_many_into(batch, buffer).batch()
        want = pad_regions(as_f32.get_many(batch), max_regions)
        for name in FIELDS:
            a, b = getattr(got, name), getattr(want, name)
            assert a is not None and np.array_equal(np.asarray(a).astype(np.asarray(b).dtype), b), name
    with pytest.raises(KeyError, match=re.escape(f"'img999' is not in the feature store {tmp_path / 's'}")):
        stored.get_many_into([ids[0], "img999", ids[1]], stored.region_buffer(3, 5))
