import json
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from helpers import REPO, assert_same_record, make_record, make_records

from pipeline.errors import ConfigError, InvalidRecordError, StoreError
from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore, FeatureStoreWriter, verify_store, write_records
from pipeline.store.index import INDEX_FILE, IdIndex

BACKENDS = ["arrow", "lmdb"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_float32_is_bit_exact(tmp_path, backend):
    recs = make_records(23, seed=1)
    store = write_records(tmp_path / "s", recs, backend=backend, shard_size=5, dtype="float32", feature_dim=32, batch_rows=2)
    assert len(store) == 23 and len(store.manifest.shards) == 5
    assert list(store.ids()) == [r.image_id for r in recs]  # storage order = write order
    for rec in recs:
        assert rec.image_id in store
        assert_same_record(rec, store.get(rec.image_id), exact=True)
    for rec, got in zip(recs, store):
        assert_same_record(rec, got, exact=True)
    assert [r.image_id for r in store.get_many([recs[4].image_id, recs[0].image_id])] == [recs[4].image_id, recs[0].image_id]
    assert "missing" not in store and 42 not in store
    with pytest.raises(KeyError, match="missing"):
        store.get("missing")
    got = store.get(recs[0].image_id)
    assert not got.features.flags.writeable  # zero-copy views into the map


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_float16_within_precision_and_float32_on_request(tmp_path, backend):
    recs = make_records(12, seed=2, feature_dim=2048, cls_dim=1601, attr_dim=401)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=4)
    store = FeatureStore.open(tmp_path / "s")
    assert store.manifest.dtypes()["features"] == "float16"
    for rec in recs:
        got = store.get(rec.image_id)
        assert got.features.dtype == np.float16 and got.cls_prob.dtype == np.float16
        assert_same_record(rec, got, exact=False)
        np.testing.assert_array_equal(got.boxes, rec.boxes)  # boxes always float32
        np.testing.assert_array_equal(got.features, rec.features.astype(np.float16))
    as32 = FeatureStore.open(tmp_path / "s", dtype="float32").get(recs[3].image_id)
    assert as32.features.dtype == np.float32 and as32.cls_prob.dtype == np.float32
    np.testing.assert_array_equal(as32.features, recs[3].features.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
def test_probability_storage_topk_and_none(tmp_path, backend):
    recs = make_records(6, seed=3)
    store = write_records(tmp_path / "s", recs, backend=backend, dtype="float32", feature_dim=32,
                          cls_prob="topk:3", attr_prob="none")
    assert store.manifest.to_json()["layout"]["cls_prob"] == "topk:3"
    for rec in recs:
        got = store.get(rec.image_id)
        assert got.attr_prob is None and got.cls_prob.shape == rec.cls_prob.shape
        top = np.argsort(-rec.cls_prob, axis=1)[:, :3]
        expected = np.zeros_like(rec.cls_prob)
        np.put_along_axis(expected, top, np.take_along_axis(rec.cls_prob, top, 1), 1)
        np.testing.assert_array_equal(got.cls_prob, expected)
        np.testing.assert_array_equal(got.objects_id, rec.objects_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_optional_fields_absent_per_record(tmp_path, backend):
    rng = np.random.default_rng(5)
    recs = [make_record(rng, "bare", cls_dim=None, attr_dim=None, labels=False), make_record(rng, "full")]
    store = write_records(tmp_path / "s", recs, backend=backend, dtype="float32", feature_dim=32)
    bare, full = store.get("bare"), store.get("full")
    assert bare.objects_id is None and bare.cls_prob is None and bare.attr_prob is None
    assert_same_record(recs[1], full)
    assert store.manifest.layout.cls_dim == 11


def test_writer_refuses_bad_records_and_names_them(tmp_path, rng):
    rec = make_record(rng, "bad", feature_dim=32)
    bad = RegionFeatures(**{**rec.__dict__, "features": np.full((rec.num_boxes, 32), np.nan, np.float32)})
    with FeatureStoreWriter(tmp_path / "s", feature_dim=32) as writer:
        with pytest.raises(InvalidRecordError, match="'bad'.*features.*NaN"):
            writer.write(bad)
        writer.write(rec)
        with pytest.raises(InvalidRecordError, match="columns, store expects 11"):
            writer.write(make_record(rng, "other", feature_dim=32, cls_dim=12))
    assert list(FeatureStore.open(tmp_path / "s").ids()) == ["bad"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_appends_new_shards_and_skips_present_ids(tmp_path, backend):
    recs = make_records(20, seed=4)
    kwargs = dict(backend=backend, shard_size=6, dtype="float32", feature_dim=32)
    write_records(tmp_path / "s", recs[:10], **kwargs)
    with FeatureStoreWriter(tmp_path / "s", **kwargs) as writer:
        accepted = [writer.write(r) for r in recs]  # all 20 again
        assert writer.write(recs[12]) is False  # written in this session
    assert accepted == [False] * 10 + [True] * 10
    assert writer.skipped_duplicates == 11 and writer.written == 10
    store = FeatureStore.open(tmp_path / "s")
    assert list(store.ids()) == [r.image_id for r in recs]
    assert [s.name for s in store.manifest.shards] == [f"{i:05d}.{backend}" for i in range(4)]
    assert len(store.manifest.runs) == 2
    assert verify_store(tmp_path / "s").ok


def test_resume_refuses_a_different_layout_or_detector(tmp_path):
    recs = make_records(3, seed=6)
    write_records(tmp_path / "s", recs, feature_dim=32, provenance={"detector": "vg-frcnn-r101", "weights_sha256": "aa"})
    with pytest.raises(ConfigError, match="dtype: store has float16, requested float32"):
        FeatureStoreWriter(tmp_path / "s", feature_dim=32, dtype="float32").open()
    with pytest.raises(ConfigError, match="backend"):
        FeatureStoreWriter(tmp_path / "s", feature_dim=32, backend="lmdb").open()
    with pytest.raises(ConfigError, match="weights_sha256: store has aa, requested bb"):
        FeatureStoreWriter(tmp_path / "s", feature_dim=32, provenance={"weights_sha256": "bb"}).open()
    with pytest.raises(ConfigError, match="already holds"):
        FeatureStoreWriter(tmp_path / "s", feature_dim=32, resume=False).open()
    with pytest.raises(ConfigError, match="topk"):
        FeatureStoreWriter(tmp_path / "t", cls_prob="topk").open()


def test_missing_or_bad_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="not a feature store"):
        FeatureStore.open(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(StoreError, match="unreadable manifest"):
        FeatureStore.open(tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stale_index_is_rebuilt_in_memory(tmp_path, backend, caplog):
    recs = make_records(9, seed=7)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=4, feature_dim=32)
    (tmp_path / "s" / INDEX_FILE).unlink()
    store = FeatureStore.open(tmp_path / "s")
    assert_same_record(recs[8], store.get(recs[8].image_id), exact=False)
    assert "stale" in caplog.text
    assert any("index.arrow is missing" in w for w in verify_store(tmp_path / "s").warnings)


def test_index_handles_hash_collisions_by_checking_ids():
    ids = [[f"id{i}" for i in range(50)], [f"x{i}" for i in range(30)]]
    index = IdIndex.build(ids, ["a", "b"])
    assert len(index) == 80
    for shard, names in enumerate(ids):
        for row, name in enumerate(names):
            assert (shard, row) in list(index.candidates(name.encode()))
    assert list(index.candidates(b"absent")) == []
    # Force every id into one probe chain: lookups must still find each one.
    crowded = IdIndex(index._hashes, index._shards, index._rows, index.covers)
    crowded._mask = len(index._hashes) - 1
    assert all(any(True for _ in crowded.candidates(n.encode())) for n in ids[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_store_pickles_by_path_and_reads_in_dataloader_workers(tmp_path, backend):
    recs = make_records(16, seed=8)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=5, feature_dim=32)
    store = FeatureStore.open(tmp_path / "s")
    store.get(recs[0].image_id)  # open handles in the parent before the fork
    assert len(pickle.dumps(store)) < 500

    class DS(torch.utils.data.Dataset):
        def __len__(self):
            return len(recs)

        def __getitem__(self, i):
            rec = store.get(recs[i].image_id)
            return torch.from_numpy(rec.features.astype(np.float32)).sum(), os.getpid()

    loader = torch.utils.data.DataLoader(DS(), batch_size=4, num_workers=2)
    sums, pids = zip(*[(s, p) for batch_s, batch_p in loader for s, p in zip(batch_s, batch_p)])
    expected = [float(r.features.astype(np.float16).astype(np.float32).sum()) for r in recs]
    np.testing.assert_allclose([float(s) for s in sums], expected, rtol=1e-5)
    assert len(set(int(p) for p in pids)) == 2 and os.getpid() not in pids


WRITER_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from helpers import make_records
from pipeline.store import FeatureStoreWriter
recs = make_records(400, seed=9)
with FeatureStoreWriter({path!r}, backend={backend!r}, shard_size=20, feature_dim=32, batch_rows=5) as w:
    for r in recs:
        w.write(r)
        time.sleep(0.004)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkilled_writer_leaves_a_readable_store_that_resumes_exactly(tmp_path, backend):
    path = tmp_path / "s"
    script = WRITER_SCRIPT.format(tests=str(REPO / "tests"), path=str(path), backend=backend)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    deadline = time.time() + 60
    try:
        while time.time() < deadline:
            manifest = path / "manifest.json"
            tmp = list((path / "shards").glob(".tmp-*")) if (path / "shards").exists() else []
            if manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 3 and tmp:
                break
            time.sleep(0.01)
        else:
            pytest.fail("writer made no progress")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    killed = FeatureStore.open(path)
    committed = len(killed)
    assert committed >= 60 and committed % 20 == 0 and committed < 400
    recs = make_records(400, seed=9)
    assert list(killed.ids()) == [r.image_id for r in recs[:committed]]
    killed.close()

    subprocess.run([sys.executable, "-c", script.replace("time.sleep(0.004)", "pass")], cwd=REPO, check=True, timeout=120)
    store = FeatureStore.open(path)
    assert list(store.ids()) == [r.image_id for r in recs]
    for rec in recs[:: 37]:
        assert_same_record(rec, store.get(rec.image_id), exact=False)
    report = verify_store(path)
    assert report.ok and report.records_checked == 400 and not report.warnings


def test_lmdb_map_grows_on_demand(tmp_path, monkeypatch):
    from pipeline.store import lmdb_shard

    monkeypatch.setattr(lmdb_shard, "INITIAL_MAP_SIZE", 1 << 16)  # 64 KiB: forces several doublings
    recs = make_records(30, seed=12, feature_dim=256)
    store = write_records(tmp_path / "s", recs, backend="lmdb", shard_size=30, feature_dim=256, batch_rows=30)
    assert store.manifest.shards[0].bytes > 2 * lmdb_shard.INITIAL_MAP_SIZE  # needed two doublings
    for rec in recs:
        assert_same_record(rec, store.get(rec.image_id), exact=False)


def test_verify_checks_each_record_even_when_checksums_agree(tmp_path):
    """A store whose bytes match its manifest but hold a bad record (e.g. written by a
    buggy producer) fails verification naming the shard and row."""
    import lmdb

    from pipeline.io import sha256_file
    from pipeline.store.lmdb_shard import HEADER, row_key

    recs = make_records(4, seed=13, feature_dim=32, cls_dim=None, attr_dim=None)
    write_records(tmp_path / "s", recs, backend="lmdb", dtype="float32", feature_dim=32)
    shard = tmp_path / "s" / "shards" / "00000.lmdb"
    env = lmdb.open(str(shard), subdir=True)
    with env.begin(write=True) as txn:
        value = bytearray(txn.get(row_key(2)))
        pos = HEADER.size + ((len(recs[2].image_id) + 7) & ~7) + recs[2].num_boxes * 16  # first feature value
        value[pos : pos + 4] = np.array([np.nan], np.float32).tobytes()
        txn.put(row_key(2), bytes(value))
    env.close()
    (shard / "lock.mdb").unlink()
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["shards"][0]["sha256"] = sha256_file(shard / "data.mdb")
    manifest["shards"][0]["bytes"] = sum(p.stat().st_size for p in shard.iterdir())
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    report = verify_store(tmp_path / "s")
    assert not report.ok
    assert report.problems == [f"shard 00000.lmdb row 2: image {recs[2].image_id!r}: field 'features': contains NaN or infinite values"]
