"""Store metadata at scale: manifest open time, id-index build (time, peak RSS) and lookups.

Simulates a huge store cheaply: real Arrow shards of the store's format whose records are
one 1-d region each (the index reads only the id column), written in bulk with pyarrow,
and a real manifest listing them. Measures, each in a fresh process:

  open      FeatureStore.open on a manifest of --shards entries (shard files not touched)
  index     build_index over --ids ids in --id-shards shards: seconds, peak RSS, and
            IdIndex.candidates lookups (µs) of random present ids

    python bench/store_scale.py                          # 100,000 shards; 10M ids (~3 min)
    python bench/store_scale.py --shards 1000 --ids 100000
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.io import sha256_file
from pipeline.store.arrow_shard import arrow_schema
from pipeline.store.layout import ProbStorage, StoreLayout
from pipeline.store.manifest import SHARDS_DIR, Manifest, ShardInfo, now_iso

TINY = StoreLayout(feature_dim=1, cls_prob=ProbStorage("none"), attr_prob=ProbStorage("none"))


def image_id(i: int) -> str:
    return f"COCO_train2014_{i:012d}"


def write_tiny_store(root: Path, shard_rows: list[int], files: bool = True) -> Manifest:
    """A store of sum(shard_rows) one-region records (ids `image_id(0..)`), shard i holding
    shard_rows[i]; with ``files=False`` only the manifest (shard entries of 0 bytes)."""
    (root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
    schema = arrow_schema(TINY)
    shards, start = [], 0
    for number, rows in enumerate(shard_rows):
        name = f"{number:05d}.arrow"
        if files:
            path = root / SHARDS_DIR / name
            ones = np.arange(rows + 1, dtype=np.int32)
            arrays = [
                pa.array([image_id(i) for i in range(start, start + rows)], pa.string()),
                pa.array(np.full(rows, 480, np.int32)),
                pa.array(np.full(rows, 640, np.int32)),
                pa.array(np.ones(rows, np.int32)),
                pa.ListArray.from_arrays(pa.array(ones * 4), pa.array(np.tile(np.float32([0, 0, 1, 1]), rows))),
                pa.ListArray.from_arrays(pa.array(ones), pa.array(np.ones(rows, np.float16))),
            ]
            arrays += [pa.nulls(rows, f.type) for f in list(schema)[len(arrays) :]]
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
            shards.append(ShardInfo(name, rows, path.stat().st_size, sha256_file(path), now_iso()))
        else:
            shards.append(ShardInfo(name, rows, 0, "0" * 64, now_iso()))
        start += rows
    manifest = Manifest(layout=TINY, shards=shards)
    manifest.write(root)
    return manifest


def measure_open(root: Path) -> dict:
    from pipeline.store import FeatureStore

    t0 = time.perf_counter()
    store = FeatureStore.open(root)
    seconds = time.perf_counter() - t0
    return {"open_s": seconds, "shards": len(store.manifest.shards)}


def measure_index(root: Path, lookups: int) -> dict:
    from pipeline.store.store import build_index

    manifest = Manifest.read(root)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    index = build_index(root, manifest)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total = manifest.num_records
    keys = [image_id(int(i)).encode() for i in np.random.default_rng(0).integers(0, total, lookups)]
    t0 = time.perf_counter()
    for key in keys:
        index.candidates(key)
    lookup_us = (time.perf_counter() - t0) / lookups * 1e6
    return {
        "ids": total,
        "build_s": seconds,
        "peak_rss_mb": peak / 1024,
        "rss_before_mb": before / 1024,
        "table_mb": 16 * len(index._hashes) / 2**20,
        "lookup_us": lookup_us,
        "entries": len(index),
    }


def in_fresh_process(what: str, root: Path, lookups: int = 0) -> dict:
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import store_scale as s; "
        f"from pathlib import Path; "
        f"print(json.dumps(s.measure_{what}(Path({str(root)!r}){', ' + str(lookups) if lookups else ''})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=100_000, help="manifest entries for the open test")
    parser.add_argument("--ids", type=int, default=10_000_000, help="ids for the index test")
    parser.add_argument("--id-shards", type=int, default=1000, help="shards the ids are spread over")
    parser.add_argument("--lookups", type=int, default=100_000)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="store_scale_", dir=args.workdir))
    try:
        write_tiny_store(root / "wide", [10] * args.shards, files=False)
        opened = [in_fresh_process("open", root / "wide") for _ in range(3)]
        print(f"open: manifest of {args.shards:,} shards: " + ", ".join(f"{o['open_s'] * 1e3:.0f} ms" for o in opened))
        per = args.ids // args.id_shards
        t0 = time.perf_counter()
        write_tiny_store(root / "ids", [per] * args.id_shards)
        print(f"wrote {per * args.id_shards:,} ids in {args.id_shards} shards in {time.perf_counter() - t0:.0f} s")
        print("index:", json.dumps(in_fresh_process("index", root / "ids", args.lookups)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
