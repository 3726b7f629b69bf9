"""`vlprep inspect` and `vlprep verify`: describe a store, and check all of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from pipeline.errors import InvalidRecordError, StoreError
from pipeline.io import TMP_PREFIX
from pipeline.records import RegionFeatures, validate_record
from pipeline.store.manifest import SHARDS_DIR, Manifest
from pipeline.store.store import FeatureStore, check_shard, fresh_index, open_shard_reader


def record_summary(rec: RegionFeatures) -> dict:
    feats = rec.features.astype(np.float32)
    out = {
        "image_id": rec.image_id,
        "image_h": rec.image_h,
        "image_w": rec.image_w,
        "num_boxes": rec.num_boxes,
        "features": {"shape": list(rec.features.shape), "dtype": str(rec.features.dtype),
                     "mean": round(float(feats.mean()), 4), "std": round(float(feats.std()), 4),
                     "min": round(float(feats.min()), 4), "max": round(float(feats.max()), 4)},
        "first_box": [round(float(v), 2) for v in rec.boxes[0]],
    }
    if rec.objects_id is not None:
        out["objects"] = [[int(i), round(float(c), 3)] for i, c in zip(rec.objects_id[:5], rec.objects_conf[:5])]
    if rec.attrs_id is not None:
        out["attributes"] = [[int(i), round(float(c), 3)] for i, c in zip(rec.attrs_id[:5], rec.attrs_conf[:5])]
    for name in ("cls_prob", "attr_prob"):
        value = getattr(rec, name)
        out[name] = None if value is None else list(value.shape)
    return out


def describe_store(path: Path) -> dict:
    """Everything `vlprep inspect` shows, as a JSON-able dict. A missing or truncated
    shard is a `StoreError` naming it (opening the store checks every shard's size)."""
    store = FeatureStore.open(path)
    manifest = store.manifest
    info = manifest.to_json()
    total = store.disk_bytes()
    summary = {
        "path": str(path),
        "format": info["format"],
        "schema_version": info["schema_version"],
        "backend": info["backend"],
        "records": len(store),
        "shards": len(manifest.shards),
        "dims": info["dims"],
        "dtypes": info["dtypes"],
        "probability_storage": {"cls_prob": str(manifest.layout.cls_prob), "attr_prob": str(manifest.layout.attr_prob)},
        "bytes_on_disk": total,
        "shard_bytes": info["bytes"],
        "bytes_per_image": round(info["bytes"] / len(store), 1) if len(store) else None,
        "provenance": manifest.provenance,
        "runs": len(manifest.runs),
        "created": manifest.created,
        "updated": manifest.updated,
        "sample": record_summary(store.record_at(0)) if len(store) else None,
    }
    store.close()
    return summary


@dataclass
class VerifyReport:
    path: Path
    records_checked: int = 0
    shards_checked: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(path: Path, on_record: Optional[Callable[[int], None]] = None) -> VerifyReport:
    """Check every shard's presence, size and sha256, its schema, every record's sanity,
    id uniqueness and the id index. Shards whose size or checksum is wrong are not decoded.
    The write lock file (`.vlprep.lock`, in the store's root) is neither a problem nor a
    warning."""
    report = VerifyReport(path)
    try:
        manifest = Manifest.read(path)
    except StoreError as err:
        report.problems.append(str(err))
        return report
    layout = manifest.layout
    shards_dir = path / SHARDS_DIR
    seen: dict[str, str] = {}
    shard_ids: list[list[tuple[int, str]]] = []  # (row, id) of each readable record
    for number, info in enumerate(manifest.shards):
        where = f"shard {info.name}"
        shard_ids.append([])
        try:
            check_shard(path, info, checksum=True)
            reader = open_shard_reader(path, manifest, number)
        except StoreError as err:
            report.problems.append(f"{err}; records not decoded")
            continue
        report.shards_checked += 1
        for row in range(reader.rows):
            try:
                rec = reader.record(row)
                validate_record(
                    rec,
                    feature_dim=layout.feature_dim,
                    prob_dims={"cls_prob": layout.cls_dim, "attr_prob": layout.attr_dim},
                )
            except (StoreError, InvalidRecordError, ValueError) as err:
                report.problems.append(f"{where} row {row}: {err}")
                continue
            shard_ids[-1].append((row, rec.image_id))
            if rec.image_id in seen:
                report.problems.append(f"{where} row {row}: image {rec.image_id!r} duplicates one in {seen[rec.image_id]}")
            seen[rec.image_id] = f"{info.name} row {row}"
            report.records_checked += 1
            if on_record:
                on_record(1)
        reader.close()
    for extra in sorted(shards_dir.iterdir()) if shards_dir.is_dir() else []:
        if extra.name.startswith(TMP_PREFIX):
            report.warnings.append(f"{extra.name}: unfinished shard of a killed writer (removed when the store is resumed)")
        elif extra.name not in manifest.shard_names:
            report.warnings.append(f"{extra.name}: not listed in the manifest (ignored by readers)")
    _check_index(path, manifest, shard_ids, report)
    return report


def _check_index(path: Path, manifest: Manifest, shard_ids: list[list[tuple[int, str]]], report: VerifyReport) -> None:
    index = fresh_index(path, manifest)
    if index is None:
        report.warnings.append("index.arrow is missing or stale: readers rebuild it in memory; resuming a writer persists it")
        return
    for shard, ids in enumerate(shard_ids):
        for row, image_id in ids:
            if (shard, row) not in index.candidates(image_id.encode("utf-8")):
                report.problems.append(f"index.arrow: no entry for image {image_id!r} (shard {manifest.shards[shard].name} row {row})")
                return
    if len(index) != manifest.num_records:
        report.problems.append(f"index.arrow: {len(index)} entries for {manifest.num_records} records")
