"""Store metadata at scale, by simulation: a manifest of 100,000 shards opens
fast, the id index is built streamed in bounded memory, `verify --sample` checks a seeded
subset; and batched reads (`get_many_into`) equal the per-record path."""

import sys
import time

import numpy as np
import pytest
from helpers import REPO, make_records, run_cli

from pipeline.store import FeatureStore, Manifest, verify_store, write_records
from pipeline.store.buffer import pad_regions
from pipeline.store.store import build_index
from pipeline.store.verify import sample_positions

sys.path.insert(0, str(REPO / "bench"))
from store_scale import image_id, in_fresh_process, write_tiny_store  # noqa: E402  (the bench's simulated store)


def test_a_manifest_of_100000_shards_opens_without_touching_them(tmp_path):
    write_tiny_store(tmp_path / "s", [10] * 100_000, files=False)  # no shard file exists
    start = time.perf_counter()
    store = FeatureStore.open(tmp_path / "s")
    seconds = time.perf_counter() - start
    assert len(store) == 1_000_000 and len(store.manifest.shards) == 100_000
    assert seconds < 3, seconds  # ~0.3-0.7 s on the 2-core box; generous for a loaded CI machine


def test_the_id_index_is_streamed_in_bounded_memory(tmp_path):
    ids, shards = 1_000_000, 50
    write_tiny_store(tmp_path / "s", [ids // shards] * shards)
    measured = in_fresh_process("index", tmp_path / "s", 1000)  # build_index in a fresh process: its peak RSS
    assert measured["entries"] == ids and measured["table_mb"] == 32  # 2M slots of (hash, shard, row)
    # A list of the 1M ids alone (what the index was built from before) is ~75 MiB.
    assert measured["peak_rss_mb"] - measured["rss_before_mb"] < 32 + 24, measured
    index = build_index(tmp_path / "s", Manifest.read(tmp_path / "s"))
    per = ids // shards
    for i in np.random.default_rng(0).integers(0, ids, 200).tolist():
        assert (i // per, i % per) in index.candidates(image_id(i).encode())
    assert index.candidates(b"COCO_train2014_absent") == []


def _poison_features(store_path, shard: str, row: int) -> None:
    """Write a float16 NaN into the first feature of `row` of an Arrow shard (same size)."""
    import pyarrow as pa

    path = store_path / "shards" / shard
    with pa.memory_map(str(path)) as source:
        base = source.read_buffer(1).address
        batches = pa.ipc.open_file(source)
        start = 0
        for b in range(batches.num_record_batches):
            batch = batches.get_batch(b)
            if row < start + batch.num_rows:
                column = batch.column("features")
                offset = column.values.buffers()[1].address - base + 2 * column.offsets[row - start].as_py()
                break
            start += batch.num_rows
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.float16(np.nan).tobytes())


def test_verify_sample_finds_a_bad_record_only_when_it_draws_it(tmp_path):
    recs = make_records(40, seed=3, feature_dim=16)
    write_records(tmp_path / "s", recs, shard_size=10, feature_dim=16)
    bad = 27  # shard 00002.arrow, row 7
    _poison_features(tmp_path / "s", "00002.arrow", 7)
    seeds = {bad in sample_positions(40, 5, seed): seed for seed in range(100)}
    drawn, missed = seeds[True], seeds[False]

    outside = run_cli("verify", tmp_path / "s", "--sample", "5", "--seed", missed, timeout=120)
    assert outside.returncode == 0, outside.stdout
    assert "checked: 5 of 5 sampled records (seed" in outside.stdout and "all 4 shards" in outside.stdout
    inside = run_cli("verify", tmp_path / "s", "--sample", "0.125", "--seed", drawn, timeout=120)  # 0.125 x 40 = 5
    assert inside.returncode == 1 and "shard 00002.arrow row 7" in inside.stdout and "NaN" in inside.stdout
    full = verify_store(tmp_path / "s")
    assert not full.ok and any("00002.arrow" in p and "sha256" in p for p in full.problems)


@pytest.mark.parametrize("backend, position, img_token", [("arrow", "5d", True), ("lmdb", "4d", False)])
def test_get_many_into_equals_pad_regions_over_get_many(tmp_path, backend, position, img_token):
    recs = make_records(12, seed=8, feature_dim=16)
    recs[4].objects_id = recs[4].objects_conf = None  # a record without object labels
    write_records(tmp_path / "s", recs, backend=backend, shard_size=5, feature_dim=16)
    store = FeatureStore.open(tmp_path / "s", dtype="float32")
    buffer = store.region_buffer(4, 6, position=position, img_token=img_token)
    for ids in (
        [r.image_id for r in recs[:4]],
        [r.image_id for r in recs[5:9]],
        [recs[4].image_id] + [r.image_id for r in recs[9:]],
    ):
        got = store.get_many_into(ids, buffer).batch()  # reused: padding of the previous batch cleared
        want = pad_regions(store.get_many(ids), 6, position=position, img_token=img_token)
        for name in (
            "image_ids",
            "features",
            "positions",
            "mask",
            "regions",
            "slots_used",
            "objects_id",
            "objects_conf",
            "attrs_id",
            "attrs_conf",
            "cls_prob",
            "attr_prob",
        ):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None), name
            assert a is None or (np.asarray(a).dtype == np.asarray(b).dtype and np.array_equal(a, b)), name
    with pytest.raises(KeyError, match="absent"):
        store.get_many_into(["absent"], buffer)
