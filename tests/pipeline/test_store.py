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
from helpers import REPO, assert_same_record, make_record, make_records, run_cli

from pipeline.errors import BusyError, ConfigError, InvalidRecordError, StoreError
from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore, FeatureStoreWriter, verify_store, write_records
from pipeline.store.buffer import pad_regions
from pipeline.store.index import INDEX_FILE, IdIndex

BACKENDS = ["arrow", "lmdb"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_float32_is_bit_exact(tmp_path, backend):
    recs = make_records(23, seed=1)
    store = write_records(
        tmp_path / "s", recs, backend=backend, shard_size=5, dtype="float32", feature_dim=32, batch_rows=2
    )
    assert len(store) == 23 and len(store.manifest.shards) == 5
    assert list(store.ids()) == [r.image_id for r in recs]  # storage order = write order
    for rec in recs:
        assert rec.image_id in store
        assert_same_record(rec, store.get(rec.image_id), exact=True)
    for rec, got in zip(recs, store):
        assert_same_record(rec, got, exact=True)
    assert [r.image_id for r in store.get_many([recs[4].image_id, recs[0].image_id])] == [
        recs[4].image_id,
        recs[0].image_id,
    ]
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
    store = write_records(
        tmp_path / "s", recs, backend=backend, dtype="float32", feature_dim=32, cls_prob="topk:3", attr_prob="none"
    )
    assert store.manifest.to_json()["layout"]["cls_prob"] == "topk:3"
    for rec in recs:
        got = store.get(rec.image_id)
        assert got.attr_prob is None and got.cls_prob.shape == rec.cls_prob.shape
        top = np.argsort(-rec.cls_prob, axis=1)[:, :3]
        expected = np.zeros_like(rec.cls_prob)
        np.put_along_axis(expected, top, np.take_along_axis(rec.cls_prob, top, 1), 1)
        np.testing.assert_array_equal(got.cls_prob, expected)
        np.testing.assert_array_equal(got.objects_id, rec.objects_id)
    ids = [r.image_id for r in recs[::-1]]  # a batched gather expands the top-k tables as `get` does
    got, want = store.get_many_into(ids, store.region_buffer(6, 8)).batch(), pad_regions(store.get_many(ids), 8)
    for name in ("features", "positions", "mask", "objects_id", "cls_prob", "attr_prob"):
        assert (getattr(got, name) is None) == (getattr(want, name) is None), name
        assert getattr(got, name) is None or np.array_equal(getattr(got, name), getattr(want, name)), name


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
    write_records(
        tmp_path / "s", recs, feature_dim=32, provenance={"detector": "vg-frcnn-r101", "weights_sha256": "aa"}
    )
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
    index = IdIndex.build(([i.encode() for i in shard] for shard in ids), 80, "digest")
    assert len(index) == 80
    for shard, names in enumerate(ids):
        for row, name in enumerate(names):
            assert (shard, row) in list(index.candidates(name.encode()))
    assert list(index.candidates(b"absent")) == []
    # Force every id into one probe chain: lookups must still find each one.
    crowded = IdIndex(index._hashes, index._shards, index._rows, index.binding)
    crowded._mask = len(index._hashes) - 1
    assert all(any(True for _ in crowded.candidates(n.encode())) for n in ids[0])


def test_batched_find_probes_on_past_collisions_and_long_chains():
    """`IdIndex.find` (the batched lookup): the first entry of a hash from the home slot,
    the next one from the slot after it (a true collision: another id of the same hash),
    -1 once an empty slot comes first; a chain longer than one probe window, wrapping
    round the table's end, is followed to its end."""
    hashes, shards, rows = np.zeros(16, np.uint64), np.zeros(16, np.uint32), np.zeros(16, np.uint32)
    hashes[5:8] = [5, 5, 21]  # two ids of hash 5, then hash 21 pushed on from its home slot 5
    shards[5:8], rows[5:8] = [0, 1, 0], [0, 3, 9]
    index = IdIndex(hashes, shards, rows, "digest")
    assert index.find(np.array([5, 21, 37, 9], np.uint64)).tolist() == [5, 7, -1, -1]  # 37, 9: never stored
    assert index.find(np.array([5, 5, 21], np.uint64), np.array([6, 7, 8])).tolist() == [6, -1, -1]
    assert index.entries(np.array([6, 7])) == ([1, 0], [3, 9])
    chain = np.zeros(16, np.uint64)  # 15 ids of home slot 4 fill slots 4..15, then 0..2; slot 3 stays empty
    chain[(4 + np.arange(15)) % 16] = 4 + 16 * np.arange(15)
    full = IdIndex(chain, shards, rows, "digest")
    assert full.find(np.array([4 + 16 * 14, 4 + 16 * 9, 4 + 16 * 15, 3], np.uint64)).tolist() == [2, 13, -1, -1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_read_of_an_index_pointing_at_other_ids_is_a_store_error(tmp_path, backend):
    recs = make_records(6, seed=4, feature_dim=8)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=3, feature_dim=8)
    index = IdIndex.read(tmp_path / "s")
    rows = np.choose(np.minimum(index._rows, 2), [1, 0, index._rows])  # rows 0 and 1 swapped
    IdIndex(index._hashes, index._shards, rows, index.binding).write(tmp_path / "s")
    store = FeatureStore.open(tmp_path / "s")
    buffer = store.region_buffer(2, 4)
    with pytest.raises(StoreError, match="index.arrow puts image .* is corrupt"):
        store.get_many_into([recs[0].image_id, recs[4].image_id], buffer)


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

    subprocess.run(
        [sys.executable, "-c", script.replace("time.sleep(0.004)", "pass")], cwd=REPO, check=True, timeout=120
    )
    store = FeatureStore.open(path)
    assert list(store.ids()) == [r.image_id for r in recs]
    for rec in recs[::37]:
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
    assert report.problems == [
        f"shard 00000.lmdb row 2: image {recs[2].image_id!r}: field 'features': contains NaN or infinite values"
    ]


# -- one writer at a time -----------------------------------

HOLDING_WRITER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers import make_records
from pipeline.store import FeatureStoreWriter
ready, go = Path({ready!r}), Path({go!r})
with FeatureStoreWriter({path!r}, backend={backend!r}, shard_size=20, feature_dim=32, batch_rows=5) as w:
    for i, rec in enumerate(make_records(60, seed=21)):
        w.write(rec)
        if i == 44:  # two shards committed, five records in the third's temporary file
            ready.touch()
            while not go.exists():
                time.sleep(0.01)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_second_writer_is_refused_at_once_and_the_store_stays_intact(tmp_path, backend):
    from legacy_files import write_lxmert_tsv

    path, ready, go = tmp_path / "s", tmp_path / "ready", tmp_path / "go"
    script = HOLDING_WRITER.format(
        tests=str(REPO / "tests"), path=str(path), backend=backend, ready=str(ready), go=str(go)
    )
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.time() + 60
        while not ready.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert ready.exists(), "the first writer made no progress"
        live = list((path / "shards").glob(".tmp-*"))
        assert len(live) == 1

        with pytest.raises(BusyError, match=rf"another process \(pid {proc.pid}\) is writing this feature store"):
            FeatureStoreWriter(path, backend=backend, shard_size=20, feature_dim=32).open()
        src = tmp_path / "more.tsv"
        write_lxmert_tsv(src, make_records(3, seed=22))
        cli = run_cli("import", "--from", "lxmert-tsv", "--backend", backend, "--feature-dim", "32", src, path)
        assert cli.returncode == 75 and "another process" in cli.stderr and len(cli.stderr.strip().splitlines()) == 1
        assert live[0].exists()  # the live temporary shard was left alone
    finally:
        go.touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0

    recs = make_records(60, seed=21)
    report = verify_store(path)
    assert report.ok and report.records_checked == 60 and not report.warnings, report
    assert (path / ".vlprep.lock").exists()  # neither a problem nor a warning for verify
    with FeatureStoreWriter(path, backend=backend, shard_size=20, feature_dim=32) as writer:  # a rerun works
        assert not any(writer.write(r) for r in recs)
    assert list(FeatureStore.open(path).ids()) == [r.image_id for r in recs]


def test_a_failing_writer_discards_its_unfinished_shard_and_releases_the_lock(tmp_path):
    path = tmp_path / "s"
    recs = make_records(12, seed=23)
    with pytest.raises(RuntimeError, match="producer failed"):
        with FeatureStoreWriter(path, shard_size=5, feature_dim=32, batch_rows=1) as writer:
            for rec in recs[:7]:
                writer.write(rec)
            raise RuntimeError("producer failed")
    assert list(FeatureStore.open(path).ids()) == [r.image_id for r in recs[:5]]  # the committed shard stays
    assert not list(path.rglob(".tmp-*"))
    with FeatureStoreWriter(path, shard_size=5, feature_dim=32) as writer:  # the lock was released
        for rec in recs:
            writer.write(rec)
    assert list(FeatureStore.open(path).ids()) == [r.image_id for r in recs]
    assert verify_store(path).ok


# -- truncated shards, checksums, bit flips -------------------

READER_SCRIPT = """
import sys
from pipeline.errors import StoreError
from pipeline.store import FeatureStore
for action in ("iterate", "get", "record_at"):
    try:
        store = FeatureStore.open(sys.argv[1])
        if action == "iterate":
            sum(1 for _ in store)
        elif action == "get":
            store.get(sys.argv[2])
        else:
            store.record_at(len(store) - 1)
        print(action, "read without error")
    except StoreError as err:
        print(action, "StoreError:", err)
"""


def _data_file(store, shard: str):
    path = store / "shards" / shard
    return path / "data.mdb" if path.is_dir() else path


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_truncated_shard_is_a_store_error_naming_it_not_sigbus(tmp_path, backend):
    recs = make_records(30, seed=24, feature_dim=256)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=15, feature_dim=256)
    shard = f"00001.{backend}"
    data = _data_file(tmp_path / "s", shard)
    os.truncate(data, data.stat().st_size // 2)
    proc = subprocess.run(
        [sys.executable, "-c", READER_SCRIPT, tmp_path / "s", recs[-1].image_id],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr)  # not -7 (SIGBUS)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3 and all("StoreError:" in line and shard in line and "truncated" in line for line in lines), (
        lines
    )
    cli = run_cli("inspect", tmp_path / "s")
    assert cli.returncode == 3 and shard in cli.stderr and "truncated" in cli.stderr


def _flip(path, offset: int, mask: int = 0x80) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ mask]))


def _arrow_buffer_offset(path, column: str, buffer: int) -> int:
    """File offset of one buffer of the first record batch's column."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        base = source.read_buffer(1).address
        source.seek(0)
        batch = pa.ipc.open_file(source).get_batch(0)
        return batch.column(column).buffers()[buffer].address - base


def _lmdb_value_offsets(path, image_id: str) -> list[int]:
    """File offsets of every copy of a record's value header in data.mdb."""
    from pipeline.store.lmdb_shard import HEADER

    data = path.read_bytes()
    needle = HEADER.pack(b"VLRF", 1, 0, 0, 0, 0, 0, 0, 0, len(image_id.encode()), 0)[:6]  # magic + version
    found = []
    start = data.find(image_id.encode())
    while start != -1:
        header = start - HEADER.size
        assert data[header : header + 6] == needle
        found.append(header)
        start = data.find(image_id.encode(), start + 1)
    assert found
    return found


def _read_all_ways(store, image_id: str, position: int) -> list[str]:
    """The exception type each read path raises (or 'ok')."""
    outcomes = []
    for read in (
        lambda: store.get(image_id),
        lambda: store[image_id],
        lambda: list(store),
        lambda: store.record_at(position),
        lambda: list(store.ids()),
    ):
        try:
            read()
            outcomes.append("ok")
        except Exception as err:  # noqa: BLE001 - the point is which type
            outcomes.append(type(err).__name__)
    return outcomes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("region", ["image id", "structure", "count"])
def test_bit_flips_that_reach_a_reader_are_store_errors(tmp_path, backend, region):
    recs = make_records(6, seed=25)
    recs[2] = make_record(np.random.default_rng(0), recs[2].image_id, num_boxes=5)  # odd N: flipping bit 0 shrinks it
    write_records(tmp_path / "s", recs, backend=backend, shard_size=6, feature_dim=32)
    data = _data_file(tmp_path / "s", f"00000.{backend}")
    target = recs[2]
    if backend == "arrow":
        if region == "image id":
            offset = _arrow_buffer_offset(data, "image_id", 2) + len("".join(r.image_id for r in recs[:2]))
        elif region == "structure":  # the list offset where row 2's features start
            offset = _arrow_buffer_offset(data, "features", 1) + 4 * 2 + 3
        else:  # the sign bit of row 2's num_boxes
            offset = _arrow_buffer_offset(data, "num_boxes", 1) + 4 * 2 + 3
        _flip(data, offset)
    else:
        from pipeline.store.lmdb_shard import HEADER

        offset, mask = {"image id": (HEADER.size, 0x80), "structure": (8, 0x01), "count": (8 + 3, 0x80)}[region]
        for header in _lmdb_value_offsets(data, target.image_id):
            _flip(data, header + offset, mask)  # num_boxes 5 -> 4, or + 2**31
    outcomes = _read_all_ways(FeatureStore.open(tmp_path / "s"), target.image_id, 2)
    assert outcomes == ["StoreError"] * 5, outcomes
    with pytest.raises(StoreError, match=f"00000.{backend}"):
        FeatureStore.open(tmp_path / "s").get(target.image_id)


@pytest.mark.parametrize("backend", BACKENDS)
def test_checksums_are_verified_once_per_shard_on_first_use_when_asked(tmp_path, backend, monkeypatch):
    recs = make_records(12, seed=26)
    write_records(tmp_path / "s", recs, backend=backend, shard_size=6, feature_dim=32, dtype="float32")
    data = _data_file(tmp_path / "s", f"00001.{backend}")
    if backend == "arrow":
        offset = _arrow_buffer_offset(data, "features", 3) + 16  # a feature value of shard 1
    else:
        from pipeline.store.lmdb_shard import HEADER

        offset = _lmdb_value_offsets(data, recs[8].image_id)[0] + HEADER.size + 16 + recs[8].num_boxes * 16
    _flip(data, offset, 0x01)  # a float's low mantissa bit: only a checksum can tell

    plain = FeatureStore.open(tmp_path / "s")
    assert plain.get(recs[8].image_id).image_id == recs[8].image_id  # not verified: reads a slightly different value
    checked = FeatureStore.open(tmp_path / "s", verify=True)
    assert checked.get(recs[0].image_id).image_id == recs[0].image_id  # shard 0 is intact
    with pytest.raises(StoreError, match=rf"shard 00001\.{backend}.*sha256"):
        checked.get(recs[8].image_id)
    monkeypatch.setenv("VLPREP_VERIFY_SHARDS", "1")
    from_env = FeatureStore.open(tmp_path / "s")
    with pytest.raises(StoreError, match=rf"shard 00001\.{backend}.*sha256"):
        list(from_env)
    assert len(pickle.loads(pickle.dumps(from_env, 0)).get_many([recs[0].image_id])) == 1
    # once per process: shard 0, verified on first use, is not hashed again
    shard0 = _data_file(tmp_path / "s", f"00000.{backend}")
    _flip(shard0, shard0.stat().st_size // 2, 0x01)
    assert checked.get(recs[1].image_id).image_id == recs[1].image_id


# -- the id index is bound to the manifest --------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_foreign_index_with_the_same_shard_names_is_rebuilt_not_trusted(tmp_path, backend, caplog):
    kwargs = dict(backend=backend, shard_size=5, feature_dim=32)
    mine, other = make_records(10, seed=27), make_records(10, seed=28)
    write_records(tmp_path / "mine", mine, **kwargs)
    write_records(tmp_path / "other", other, **kwargs)
    (tmp_path / "mine" / INDEX_FILE).write_bytes((tmp_path / "other" / INDEX_FILE).read_bytes())

    store = FeatureStore.open(tmp_path / "mine")
    assert all(r.image_id in store for r in mine) and other[0].image_id not in store
    assert_same_record(mine[7], store.get(mine[7].image_id), exact=False)
    assert "stale" in caplog.text
    assert any("index.arrow" in w for w in verify_store(tmp_path / "mine").warnings)
    with FeatureStoreWriter(tmp_path / "mine", **kwargs) as writer:  # a resumed import
        assert not any(writer.write(r) for r in mine)
    store = FeatureStore.open(tmp_path / "mine")
    assert len(store) == 10 and list(store.ids()) == [r.image_id for r in mine]
    report = verify_store(tmp_path / "mine")
    assert report.ok and not report.warnings


# -- a store in a notebook ------------------------------------


def test_a_store_behaves_like_a_read_only_mapping(tmp_path):
    recs = make_records(7, seed=29)
    store = write_records(tmp_path / "s", recs, shard_size=3, feature_dim=32)
    assert len(store) == 7 and recs[4].image_id in store and "nope" not in store
    assert_same_record(recs[4], store[recs[4].image_id], exact=False)
    assert list(store.keys()) == [r.image_id for r in recs]
    assert [r.image_id for r in store] == [r.image_id for r in recs]  # iteration yields records
    with pytest.raises(KeyError, match=rf"'nope'.*{tmp_path / 's'}"):
        store["nope"]
    with pytest.raises(KeyError, match="record_at"):
        store[3]  # ids are strings; positions go through record_at
    assert store.record_at(3).image_id == recs[3].image_id
    text = repr(store)
    for part in (str(tmp_path / "s"), "arrow", "records=7", "shards=3", "features=32", "float16"):
        assert part in text, text


def test_shards_without_a_manifest_are_not_overwritten(tmp_path):
    """A folder whose manifest.json is gone but whose shards remain is not a store a writer
    may start afresh in: its shards would be overwritten one by one."""
    write_records(tmp_path / "s", make_records(3), backend="lmdb", shard_size=2, feature_dim=32)
    (tmp_path / "s" / "manifest.json").unlink()
    with pytest.raises(StoreError, match="00000.lmdb.*has no manifest.json"):
        write_records(tmp_path / "s", make_records(3, seed=1), backend="lmdb", feature_dim=32)
    assert sorted(p.name for p in (tmp_path / "s" / "shards").iterdir()) == ["00000.lmdb", "00001.lmdb"]


def test_a_shard_is_hashed_once_per_process_not_once_per_store_object(tmp_path):
    """Training opens the stores for its train and val splits (and each forked loader
    worker inherits them): with verification on, each shard file was hashed by every one."""
    write_records(tmp_path / "s", make_records(4, seed=3), shard_size=2, feature_dim=32, dtype="float32")
    ids = [r.image_id for r in make_records(4, seed=3)]
    assert FeatureStore.open(tmp_path / "s", verify=True).get(ids[0]).image_id == ids[0]  # shard 0 hashed
    data = tmp_path / "s" / "shards" / "00000.arrow"
    stat = data.stat()
    _flip(data, stat.st_size // 2, 0x01)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and time: the process's check stands
    assert FeatureStore.open(tmp_path / "s", verify=True).get(ids[1]).image_id == ids[1]
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the file changed: hashed again
    with pytest.raises(StoreError, match="00000.arrow is corrupt"):
        FeatureStore.open(tmp_path / "s", verify=True).get(ids[1])
