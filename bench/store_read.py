"""Random-access read speed of the feature store vs. the formats in use today.

One run, the same synthetic records (default 5,000 images x 36 boxes x 2048-d, with a
1601-column cls_prob), each read once in a random order, per method:

  ours-arrow / ours-lmdb     FeatureStore.get(id) -> RegionFeatures (zero-copy views);
                             "+copy" also copies every array out of the map (what a
                             collate does), the like-for-like comparison with memcpy;
                             "batched f16" gathers 32 ids at a time with get_many_into into
                             one reused RegionBuffer in the stored float16 (on Arrow one
                             compiled call per batch: look-up, id checks and every field's
                             copy; on LMDB one slice copy per record and field): all fields, or
                             only LXMERT's / ViLBERT's (ratios count the bytes read);
                             "batched f32" converts to float32 on the way; "shards of 100":
                             the same gather from a store of 100-record shards (a random batch
                             of 32 then meets ~27 shards; the main store has one)
  (a) vilbert-pickle-lmdb    vilbert-multi-task's reader: keys.index(id) + pickle.loads
                             of the dict of float32 arrays (cls_prob kept, as MMF does)
  (b) lxmert-tsv-decode      one LXMERT TSV row (10 fields; already located in a
                             memory map: no file scan) split + base64 -> numpy, as
                             load_obj_tsv does per row
  (c) memcpy                 copying the record's stored bytes (our float16 layout) from
                             RAM into a buffer: the physical limit of delivering them
                             ("into a batch": 32 records into one batch-sized buffer;
                             "from the map into a batch": the same, from the Arrow store's
                             own mapped arrays, one copy per array: a gather's floor)

Methods are timed in turn, several rounds, best of each (a loaded box slows them alike);
the load average is printed with the numbers.

Then where the gap between a gather and (c) goes ("the floor, field by field"): each of the two
large fields (features, cls_prob: 99 % of a record's bytes) copied alone, 32 records at a time
from the map into a batch, against a memcpy of the same number of bytes per record from
contiguous memory, with where the records' values start in the map (address modulo 64: a
record's cls_prob is 36 x 1601 x 2 = 115,272 bytes, so its rows start at every multiple of 8).

Prints records/s, ratios, and bytes per image on disk (also for stores without cls_prob).

    python bench/store_read.py            # full size (~10 GB of scratch space, ~2 min)
    python bench/store_read.py --n 500    # quick look
    python bench/store_read.py --loader   # also PretrainDataset + DataLoader (1 worker) samples/s,
                                          # LXMERT and ViLBERT, per-record path vs the batched
                                          # one (__getitems__ + collate), interleaved
"""

from __future__ import annotations

import argparse
import base64
import json
import mmap
import os
import pickle
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import lmdb
import numpy as np
import pyarrow
from common import BOXES, CLASSES, DIM
from common import vg_like_record as make_record

from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore, FeatureStoreWriter


def b64(a, dtype) -> bytes:
    return base64.b64encode(np.ascontiguousarray(a, dtype).tobytes())


def build(root: Path, n: int) -> dict:
    """Write every format from the same records; returns paths and stored sizes."""
    stores = {
        "ours-arrow": dict(backend="arrow"),
        "ours-lmdb": dict(backend="lmdb"),
        "ours-arrow-no-cls": dict(backend="arrow", cls_prob="none"),
        "ours-lmdb-no-cls": dict(backend="lmdb", cls_prob="none"),
        "ours-arrow-shards-100": dict(backend="arrow", shard_size=100),
    }
    writers = {
        name: FeatureStoreWriter(root / name, attr_prob="none", **{"shard_size": 1000, **kw})
        for name, kw in stores.items()
    }
    for w in writers.values():
        w.open()
    pkl_env = lmdb.open(str(root / "vilbert.lmdb"), map_size=1 << 40)  # as the reference does
    keys = []
    with open(root / "lxmert.tsv", "wb") as tsv, pkl_env.begin(write=True) as txn:
        for i in range(n):
            rec = make_record(i)
            for w in writers.values():
                w.write(rec)
            key = rec.image_id.encode()
            txn.put(
                key,
                pickle.dumps(
                    {
                        "image_id": rec.image_id,
                        "image_h": rec.image_h,
                        "image_w": rec.image_w,
                        "num_boxes": BOXES,
                        "boxes": rec.boxes,
                        "features": rec.features,
                        "cls_prob": rec.cls_prob,
                        "objects": rec.objects_id,
                        "objects_conf": rec.objects_conf,
                    }
                ),
            )
            keys.append(key)
            tsv.write(
                b"\t".join(
                    [
                        key,
                        b"480",
                        b"640",
                        b64(rec.objects_id, np.int64),
                        b64(rec.objects_conf, np.float32),
                        b64(rec.attrs_id, np.int64),
                        b64(rec.attrs_conf, np.float32),
                        str(BOXES).encode(),
                        b64(rec.boxes, np.float32),
                        b64(rec.features, np.float32),
                    ]
                )
                + b"\r\n"
            )
        txn.put(b"keys", pickle.dumps(keys))
    pkl_env.close()
    for w in writers.values():
        w.close()
    return {"ids": [k.decode() for k in keys]}


class VilbertPickleReader:
    """vilbert/datasets/_image_features_reader.py's access path."""

    def __init__(self, path: Path):
        self.env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, meminit=False, max_readers=1)
        with self.env.begin(write=False) as txn:
            self.image_ids = pickle.loads(txn.get(b"keys"))

    def get(self, image_id: str) -> dict:
        key = image_id.encode()
        self.image_ids.index(key)  # the reference's O(N) key lookup
        with self.env.begin(write=False) as txn:
            item = pickle.loads(txn.get(key))
        item["features"] = item["features"].reshape(-1, DIM)
        return item


class LxmertRowReader:
    """load_obj_tsv's per-row decode, on rows located through a memory map."""

    FIELDS = ("objects_id", "objects_conf", "attrs_id", "attrs_conf", "boxes", "features")

    def __init__(self, path: Path):
        self.f = open(path, "rb")
        self.map = mmap.mmap(self.f.fileno(), 0, access=mmap.ACCESS_READ)
        self.offsets = {}
        start = 0
        while start < len(self.map):
            end = self.map.find(b"\n", start)
            self.offsets[self.map[start : self.map.find(b"\t", start)].decode()] = (start, end)
            start = end + 1

    def get(self, image_id: str) -> dict:
        start, end = self.offsets[image_id]
        f = self.map[start:end].rstrip(b"\r").split(b"\t")
        n = int(f[7])
        item = {"img_id": f[0].decode(), "img_h": int(f[1]), "img_w": int(f[2]), "num_boxes": n}
        shapes = [(n,), (n,), (n,), (n,), (n, 4), (n, -1)]
        dtypes = [np.int64, np.float32, np.int64, np.float32, np.float32, np.float32]
        for key, raw, shape, dtype in zip(self.FIELDS, (f[3], f[4], f[5], f[6], f[8], f[9]), shapes, dtypes):
            item[key] = np.frombuffer(base64.b64decode(raw), dtype=dtype).reshape(shape)
        return item


class Memcpy:
    """Copy each record's stored bytes (float16 layout with cls_prob) out of RAM."""

    def __init__(self, n: int, record_bytes: int):
        self.size = record_bytes
        self.src = np.random.default_rng(0).integers(0, 255, n * record_bytes, dtype=np.uint8)
        self.dst = np.empty(record_bytes, np.uint8)
        self.position = {}

    def get(self, i: int) -> np.ndarray:
        start = i * self.size
        np.copyto(self.dst, self.src[start : start + self.size])
        return self.dst


def copy_out(rec: RegionFeatures) -> list[np.ndarray]:
    return [np.array(a, copy=True) for a in rec.array_fields().values()]


BATCH = 32
LXMERT_FIELDS = ("objects_id", "objects_conf", "attrs_id", "attrs_conf")


def batched(store: FeatureStore, dtype: str, fields=None):
    """Read ids BATCH at a time into one reused buffer (`dtype`; `fields`: default all)."""
    buffer = store.region_buffer(BATCH, BOXES, dtype=dtype, fields=fields)

    def read(chunk):
        store.get_many_into(chunk, buffer)

    return read


def stored_bytes(store: FeatureStore, image_id: str, fields) -> int:
    """Bytes of one record's boxes, features and `fields` as stored: what a gather copies."""
    rec = store.get(image_id)
    return sum(getattr(rec, name).nbytes for name in ("boxes", "features", *fields))


class BatchMemcpy:
    """Copy BATCH records' stored bytes into one batch-sized destination (reused), as a
    gather into a batch buffer does: the like-for-like with a gather's destination size."""

    def __init__(self, mem: Memcpy):
        self.mem = mem
        self.dst = np.empty((BATCH, mem.size), np.uint8)

    def get(self, positions) -> None:
        for b, i in enumerate(positions):
            np.copyto(self.dst[b], self.mem.src[i * self.mem.size : (i + 1) * self.mem.size])


class MappedMemcpy:
    """Copy BATCH records' stored arrays (all fields), as the store's zero-copy views of its
    map, byte for byte into one batch-sized destination (reused): the same source pages and
    destination as a gather of all fields, with one plain copy per array and no lookup."""

    def __init__(self, store: FeatureStore, ids):
        self.views = {}
        for image_id in ids:
            arrays = store.get(image_id).array_fields().values()
            self.views[image_id] = [a.reshape(-1).view(np.uint8) for a in arrays]
        self.dst = np.empty((BATCH, sum(v.size for v in self.views[ids[0]])), np.uint8)

    def get(self, chunk) -> None:
        for b, image_id in enumerate(chunk):
            out, at = self.dst[b], 0
            for view in self.views[image_id]:
                out[at : at + view.size] = view
                at += view.size


def floor_profile(store: FeatureStore, ids: list, chunks: list, repeats: int) -> dict:
    """Per large field (features, cls_prob): µs per record to copy its values from the map into a
    batch-sized destination (32 records), and to memcpy as many bytes per record from contiguous
    memory into the same destination; and the records' start addresses modulo 64 in the map."""
    out = {}
    for field in ("features", "cls_prob"):
        views = {i: getattr(store.get(i), field).reshape(-1).view(np.uint8) for i in ids}
        size = views[ids[0]].size
        dst = np.empty((BATCH, size), np.uint8)
        src = np.random.default_rng(0).integers(0, 255, len(ids) * size, dtype=np.uint8)
        at = {image_id: k * size for k, image_id in enumerate(ids)}

        def from_map(chunk, views=views, dst=dst):
            for b, image_id in enumerate(chunk):
                dst[b] = views[image_id]

        def contiguous(chunk, src=src, dst=dst, at=at, size=size):
            for b, image_id in enumerate(chunk):
                dst[b] = src[at[image_id] : at[image_id] + size]

        rates = interleaved({"map": (from_map, chunks, BATCH), "memcpy": (contiguous, chunks, BATCH)}, repeats)
        out[field] = {
            "bytes": size,
            "map us": 1e6 / rates["map"],
            "memcpy us": 1e6 / rates["memcpy"],
            "starts mod 64": sorted({v.ctypes.data % 64 for v in views.values()}),
        }
    return out


def loader_rates(workdir, images: int = 512, batches: int = 30, repeats: int = 3) -> dict:
    """PretrainDataset + DataLoader, batch 32, 1 worker, LXMERT and ViLBERT items: the
    per-record path (`__getitem__` per item, then the default collate) vs the batched one
    (`__getitems__` + `collate`); interleaved, best of `repeats`."""
    import torch
    from train_step import build_data

    from vl_models import families
    from vl_models.config import DataSettings
    from vl_models.data.dataset import PretrainDataset, collate
    from vl_models.data.tokenize import bundled_bert_vocab

    class PerRecord(torch.utils.data.Dataset):
        def __init__(self, data):
            self.data = data

        def __len__(self):
            return len(self.data)

        def __getitem__(self, i):
            return self.data[i]

    root = Path(tempfile.mkdtemp(prefix="loader_", dir=workdir))
    try:
        vocab = bundled_bert_vocab()
        build_data(root, images, vocab)
        loaders = {}
        for model in ("lxmert", "vilbert"):
            data = PretrainDataset(
                root / "mix", [root / "feats"], vocab, DataSettings(max_text=20, max_regions=36), families.get(model)
            )
            for name, dataset, fn in (("per-record", PerRecord(data), None), ("batched", data, collate)):
                loaders[f"{model} {name}"] = torch.utils.data.DataLoader(
                    dataset, batch_size=BATCH, shuffle=True, num_workers=1, drop_last=True, collate_fn=fn
                )
        best = dict.fromkeys(loaders, 0.0)
        for _ in range(repeats):
            for name, loader in loaders.items():
                count = min(batches, len(loader) - 1)
                it = iter(loader)
                next(it)  # the worker has started
                start = time.perf_counter()
                for _ in range(count):
                    next(it)
                best[name] = max(best[name], count * BATCH / (time.perf_counter() - start))
                del it
        return best
    finally:
        shutil.rmtree(root, ignore_errors=True)


def interleaved(methods: dict, repeats: int) -> dict:
    """records/s of each method (name -> (fn, calls, records per call)), timing the methods
    in turn, `repeats` rounds, best of each (a loaded box slows them alike)."""
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(repeats):
        for name, (fn, calls, per_call) in methods.items():
            t0 = time.perf_counter()
            for call in calls:
                fn(call)
            best[name] = min(best[name], (time.perf_counter() - t0) / (len(calls) * per_call))
    return {name: 1 / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=5000, help="images (default 5000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per method; the best is kept")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--loader", action="store_true", help="also time the training DataLoader (1 worker)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="store_read_", dir=args.workdir))
    try:
        t0 = time.perf_counter()
        ids = build(root, args.n)["ids"]
        load = [os.getloadavg()[0]]
        build_s = time.perf_counter() - t0
        order = [ids[i] for i in np.random.default_rng(1).permutation(len(ids))]
        positions = {image_id: i for i, image_id in enumerate(ids)}

        arrow, lmdb_store = FeatureStore.open(root / "ours-arrow"), FeatureStore.open(root / "ours-lmdb")
        small_shards = FeatureStore.open(root / "ours-arrow-shards-100")
        record_bytes = sum(a.nbytes for a in arrow.get(ids[0]).array_fields().values())
        vil, tsv, mem = (
            VilbertPickleReader(root / "vilbert.lmdb"),
            LxmertRowReader(root / "lxmert.tsv"),
            Memcpy(len(ids), record_bytes),
        )
        for reader in (arrow.get, lmdb_store.get, small_shards.get, vil.get, tsv.get):  # warm the page cache
            for k in order:
                reader(k)
        slow_keys = order[: max(200, len(order) // 5)]  # the slow baselines need fewer samples
        chunks = [order[i : i + BATCH] for i in range(0, len(order) - BATCH + 1, BATCH)]
        position_chunks = [[positions[k] for k in chunk] for chunk in chunks]
        batch_mem, mapped_mem = BatchMemcpy(mem), MappedMemcpy(arrow, ids)
        fields = {"all fields": None, "lxmert fields": LXMERT_FIELDS, "vilbert fields": ("cls_prob",)}
        gathers = {}
        for label, store in (("arrow", arrow), ("lmdb", lmdb_store)):
            for what, chosen in fields.items():
                gathers[f"ours-{label} batched f16, {what}"] = (batched(store, "float16", chosen), chunks, BATCH)
            gathers[f"ours-{label} batched f32, all fields"] = (batched(store, "float32"), chunks, BATCH)
        gathers["ours-arrow batched f16, all fields, shards of 100"] = (
            batched(small_shards, "float16"),
            chunks,
            BATCH,
        )
        rates = interleaved(
            {
                "(c) memcpy": (lambda k: mem.get(positions[k]), order, 1),
                "(c) memcpy into a batch": (batch_mem.get, position_chunks, BATCH),
                "(c) memcpy from the map into a batch": (mapped_mem.get, chunks, BATCH),
                "ours-arrow": (arrow.get, order, 1),
                "ours-lmdb": (lmdb_store.get, order, 1),
                "ours-arrow+copy": (lambda k: copy_out(arrow.get(k)), order, 1),
                "ours-lmdb+copy": (lambda k: copy_out(lmdb_store.get(k)), order, 1),
                **gathers,
            },
            args.repeats,
        )
        rates.update(
            interleaved(
                {"(a) vilbert-pickle-lmdb": (vil.get, slow_keys, 1), "(b) lxmert-tsv-decode": (tsv.get, slow_keys, 1)},
                args.repeats,
            )
        )
        floor = floor_profile(arrow, ids, chunks, args.repeats)
        load.append(os.getloadavg()[0])
        # bytes a gather copies per record (fields read): its rate counts as that share of a memcpy record
        share = {
            what: stored_bytes(
                arrow, ids[0], chosen or ("objects_id", "objects_conf", "attrs_id", "attrs_conf", "cls_prob")
            )
            / record_bytes
            for what, chosen in fields.items()
        }

        def shard_bytes(name):
            return sum(s.bytes for s in FeatureStore.open(root / name).manifest.shards)

        per_image = {
            "ours-arrow": shard_bytes("ours-arrow") / args.n,
            "ours-lmdb": shard_bytes("ours-lmdb") / args.n,
            "ours-arrow-no-cls": shard_bytes("ours-arrow-no-cls") / args.n,
            "ours-lmdb-no-cls": shard_bytes("ours-lmdb-no-cls") / args.n,
            "(a) vilbert-pickle-lmdb": os.path.getsize(root / "vilbert.lmdb" / "data.mdb") / args.n,
            "(b) lxmert-tsv (no cls_prob)": os.path.getsize(root / "lxmert.tsv") / args.n,
            "(c) memcpy record": record_bytes,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus; "
        f"python {sys.version.split()[0]}, "
        f"numpy {np.__version__}, pyarrow {pyarrow.__version__}, lmdb {lmdb.__version__}"
    )
    print(
        f"{args.n} images x {BOXES} boxes x {DIM}-d, cls_prob {CLASSES}; built in {build_s:.0f} s; "
        f"load average {load[0]:.2f} before, {load[1]:.2f} after the timings\n"
    )
    print(f"{'method':40s} {'records/s':>12s} {'us/record':>10s}")
    for name, rate in rates.items():
        print(f"{name:40s} {rate:12,.0f} {1e6 / rate:10.1f}")
    print("\nratios (batched: bytes gathered per second over memcpy's; share = bytes read / memcpy record)")
    ratios = {}
    for ours in ("ours-arrow", "ours-lmdb"):
        ratios[f"{ours} / (a)"] = rates[ours] / rates["(a) vilbert-pickle-lmdb"]
        ratios[f"{ours} / (b)"] = rates[ours] / rates["(b) lxmert-tsv-decode"]
        ratios[f"{ours}+copy / (c)"] = rates[f"{ours}+copy"] / rates["(c) memcpy"]
        ratios[f"{ours}+copy / (a)"] = rates[f"{ours}+copy"] / rates["(a) vilbert-pickle-lmdb"]
        for what in fields:
            rate = rates[f"{ours} batched f16, {what}"] * share[what]
            ratios[f"{ours} batched f16, {what} / (c)"] = rate / rates["(c) memcpy"]
            ratios[f"{ours} batched f16, {what} / (c) into a batch"] = rate / rates["(c) memcpy into a batch"]
            ratios[f"{ours} batched f16, {what} / (c) from the map"] = (
                rate / rates["(c) memcpy from the map into a batch"]
            )
        ratios[f"{ours} batched f32, all fields / (c)"] = rates[f"{ours} batched f32, all fields"] / rates["(c) memcpy"]
    small = rates["ours-arrow batched f16, all fields, shards of 100"]
    ratios["ours-arrow batched f16, all fields, shards of 100 / (c) into a batch"] = (
        small / rates["(c) memcpy into a batch"]
    )
    ratios["ours-arrow batched f16, all fields, shards of 100 / (c) from the map"] = (
        small / rates["(c) memcpy from the map into a batch"]
    )
    # the batched target is against the like-for-like baseline: memcpy into a batch-sized destination
    targets = {
        "/ (a)": 10,
        "/ (b)": 100,
        "+copy / (c)": 0.30,
        "batched f16, all fields / (c) into a batch": 0.85,
        "batched f16, lxmert fields / (c) into a batch": 0.85,
        "batched f16, vilbert fields / (c) into a batch": 0.85,
    }
    for name, value in ratios.items():
        target = next((t for suffix, t in targets.items() if name.endswith(suffix) and "+copy / (a)" not in name), None)
        mark = "" if target is None else f"   target >= {target:g}: {'met' if value >= target else 'MISSED'}"
        print(f"  {name:58s} {value:8.2f}{mark}")
    print("\nthe floor, field by field (µs per record, 32 records into a batch-sized destination)")
    for field, f in floor.items():
        print(
            f"  {field:9s} {f['bytes']:8,d} B: from the map {f['map us']:6.2f}, memcpy of as many bytes "
            f"{f['memcpy us']:6.2f} ({f['memcpy us'] / f['map us']:.0%}); starts mod 64 in the map: "
            f"{f['starts mod 64']}"
        )
    print("\nbytes per image on disk")
    for name, size in per_image.items():
        note = "   target <= 155 KB: " + ("met" if size <= 155_000 else "MISSED") if name.endswith("no-cls") else ""
        print(f"  {name:30s} {size:12,.0f}{note}")
    loader = loader_rates(args.workdir, repeats=args.repeats) if args.loader else {}
    if loader:
        print(f"\ntraining DataLoader, batch {BATCH}, 1 worker (samples/s); load average {os.getloadavg()[0]:.2f}")
        for name, rate in loader.items():
            print(f"  {name:28s} {rate:10,.0f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "n": args.n,
                    "load": load,
                    "rates": rates,
                    "ratios": ratios,
                    "bytes_per_image": per_image,
                    "floor": floor,
                    "loader": loader,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
