"""The compiled batched read (`pipeline.store.native.gather_rows`, used by
`FeatureStore.get_many_into` on Arrow stores) fills a buffer byte for byte as the Python
gather does, padding, cleared slots and bookkeeping included; its id hash is the index's;
and it hands every batch it cannot take (absent or colliding ids, top-k tables, bad slots)
to the Python gather, which names what is wrong."""

import re

import numpy as np
import pytest
from helpers import make_record
from test_store_gather import varied_records

import pipeline.store.index as index_module
import pipeline.store.store as store_module
from pipeline.store import FeatureStore, write_records
from pipeline.store.index import id_hash
from pipeline.store.native import _id_hash


def python_gather(monkeypatch):
    """Make `get_many_into` take the Python gather (the reference) until undone."""
    monkeypatch.setattr(store_module.FeatureStore, "_gather_native", lambda *args: False)


def buffer_state(buffer) -> dict:
    """Every array of the buffer (padding too) and its bookkeeping."""
    arrays = {name: view.copy() for name, (view, _, _) in buffer._flat.items()}
    books = (buffer.image_ids, buffer.heights, buffer.widths, buffer.counts)
    return {
        "arrays": arrays,
        "books": [list(b) for b in books],
        "missing": {k: set(v) for k, v in buffer.missing.items()},
    }


def assert_same_state(got: dict, want: dict) -> None:
    assert got["books"] == want["books"] and got["missing"] == want["missing"]
    for name, array in want["arrays"].items():
        assert got["arrays"][name].dtype == array.dtype
        assert got["arrays"][name].tobytes() == array.tobytes(), name


def fill(store, batches, make_buffer, slots_of) -> list[dict]:
    """The buffer's state after each batch, one buffer reused (what a larger image left is cleared)."""
    buffer, states = make_buffer(), []
    for batch in batches:
        store.get_many_into(batch, buffer, slots_of(batch))
        states.append(buffer_state(buffer))
    return states


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("img_token", [False, True])
def test_compiled_gather_equals_the_python_gather_byte_for_byte(tmp_path, monkeypatch, dtype, img_token):
    """Records of 1-9 boxes, some lacking labels or probability tables, in 4 shards; batches
    into a reused buffer with 4 slots (fewer than some records' boxes) at shuffled slots, in
    the stored float16 and converted to float32."""
    recs = varied_records(23)
    write_records(tmp_path / "s", recs, shard_size=6, feature_dim=16, batch_rows=4)
    rng = np.random.default_rng(5)
    ids = [recs[i].image_id for i in rng.permutation(len(recs))]
    batches = [ids[:11], ids[11:], ids[5:16], ids[20:]]
    slots = rng.permutation(14)

    def run():
        store = FeatureStore.open(tmp_path / "s")  # fresh: its shards open as the batches reach them
        make = lambda: store.region_buffer(14, 4, dtype=dtype, img_token=img_token)  # noqa: E731
        return fill(store, batches, make, lambda batch: slots[: len(batch)].tolist())

    compiled = run()
    python_gather(monkeypatch)
    for got, want in zip(compiled, run()):
        assert_same_state(got, want)


def test_float32_store_into_a_float16_buffer_rounds_as_numpy(tmp_path, monkeypatch):
    rng = np.random.default_rng(6)
    recs = [make_record(rng, f"img{i}", num_boxes=3 + i % 4, feature_dim=16) for i in range(12)]
    for rec in recs:
        rec.features = (rec.features * 1e3 + 1e-4).astype(np.float32)  # values float16 must round
    write_records(tmp_path / "s", recs, shard_size=5, feature_dim=16, dtype="float32")
    ids = [r.image_id for r in recs[::-1]]

    def run():
        store = FeatureStore.open(tmp_path / "s")
        return fill(store, [ids], lambda: store.region_buffer(12, 6, dtype="float16"), lambda batch: None)

    compiled = run()
    python_gather(monkeypatch)
    assert_same_state(compiled[0], run()[0])
    assert compiled[0]["arrays"]["features"].dtype == np.float16


def test_the_compiled_id_hash_is_the_index_hash():
    ids = ["img0", "a", "COCO_val2014_000000000042", "ü-ß-東京-🙂", "x" * 300, "id with spaces\t"]
    ids += [f"{n:012d}" for n in np.random.default_rng(0).integers(0, 10**12, 200)]
    for image_id in ids:
        key = image_id.encode("utf-8")
        assert int(_id_hash(np.frombuffer(key, np.uint8), 0, len(key))) == id_hash(key), image_id


def test_batches_the_compiled_gather_cannot_take_go_to_the_python_gather(tmp_path, monkeypatch):
    """Top-k tables (expanded in Python), an absent id (named), slots beyond the buffer
    (IndexError), a non-string id (named): the Python gather takes them, nothing is written
    twice or left half done."""
    recs = varied_records(9)
    write_records(tmp_path / "t", recs, shard_size=4, feature_dim=16, cls_prob="topk:3", attr_prob="topk:3")
    write_records(tmp_path / "s", recs, shard_size=4, feature_dim=16)
    topk = FeatureStore.open(tmp_path / "t")
    ids = [r.image_id for r in recs]
    buffer = topk.region_buffer(9, 9)
    assert topk._gathers == {} and topk.get_many_into(ids, buffer) is buffer
    assert topk._gathers[tuple(buffer.optional)].native_fields(buffer) is None
    store = FeatureStore.open(tmp_path / "s")
    with pytest.raises(KeyError, match=re.escape(f"'absent' is not in the feature store {tmp_path / 's'}")):
        store.get_many_into([ids[0], "absent"], store.region_buffer(2, 9))
    with pytest.raises(IndexError):
        store.get_many_into(ids[:2], store.region_buffer(2, 9), slots=[0, 2])
    with pytest.raises(KeyError, match="image ids are strings, got 7"):
        store.get_many_into([ids[0], 7], store.region_buffer(2, 9))


def test_colliding_hashes_are_left_to_the_python_gather(tmp_path, monkeypatch):
    """An index whose every id hashes alike: the compiled probe finds no entry of the true
    hash and hands the batch over, whose Python probing reaches every record."""
    monkeypatch.setattr(index_module, "id_hash", lambda key: 7)
    monkeypatch.setattr(store_module, "id_hash", lambda key: 7)
    recs = varied_records(9)
    write_records(tmp_path / "s", recs, shard_size=4, feature_dim=16)
    store = FeatureStore.open(tmp_path / "s")
    ids = [r.image_id for r in recs[::-1]]
    got = buffer_state(store.get_many_into(ids, store.region_buffer(9, 9)))
    python_gather(monkeypatch)
    fresh = FeatureStore.open(tmp_path / "s")
    assert_same_state(got, buffer_state(fresh.get_many_into(ids, fresh.region_buffer(9, 9))))
