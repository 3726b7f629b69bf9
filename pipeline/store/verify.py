"""`vlprep inspect` and `vlprep verify`: describe a store, and check all of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from pipeline.errors import ConfigError, InvalidRecordError, StoreError
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
        "features": {
            "shape": list(rec.features.shape),
            "dtype": str(rec.features.dtype),
            "mean": round(float(feats.mean()), 4),
            "std": round(float(feats.std()), 4),
            "min": round(float(feats.min()), 4),
            "max": round(float(feats.max()), 4),
        },
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
    store.check_shards()
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
    checked: list[str] = field(default_factory=list)  # what was checked, one line each

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(
    path: Path, on_record: Optional[Callable[[int], None]] = None, *, sample: Optional[int] = None, seed: int = 0
) -> VerifyReport:
    """Check every shard's presence, size and sha256, its schema, every record's sanity,
    id uniqueness and the id index. Shards whose size or checksum is wrong are not decoded.
    The write lock file (`.vlprep.lock`, in the store's root) is neither a problem nor a
    warning.

    With `sample`, for huge stores: the cheap checks of the whole store (manifest, every
    shard's presence and size, leftover files, the index's entry count) and the full
    record checks on `sample` records drawn at random (seeded by `seed`): their shard's
    schema, their sanity, and that the index finds each at its place and nowhere else.
    Checksums are not computed (they read every byte)."""
    report = VerifyReport(path)
    if sample is not None:
        check_seed(seed)  # an invocation error, before any work
    try:
        manifest = Manifest.read(path)
    except StoreError as err:
        report.problems.append(str(err))
        return report
    if sample is not None:
        _verify_sample(path, manifest, sample, seed, report, on_record)
        return report
    seen: dict[str, str] = {}
    shard_ids: list[list[tuple[int, str]]] = []  # (row, id) of each readable record
    for number, info in enumerate(manifest.shards):
        shard_ids.append([])
        reader = _open_checked(path, manifest, number, report, checksum=True)
        if reader is None:
            continue
        for row in range(reader.rows):
            rec = _check_record(reader, row, info.name, manifest.layout, report)
            if rec is None:
                continue
            shard_ids[-1].append((row, rec.image_id))
            if rec.image_id in seen:
                report.problems.append(
                    f"shard {info.name} row {row}: image {rec.image_id!r} duplicates one in {seen[rec.image_id]}"
                )
            seen[rec.image_id] = f"{info.name} row {row}"
            if on_record:
                on_record(1)
        reader.close()
    _check_leftovers(path, manifest, report)
    _check_index(path, manifest, shard_ids, report)
    report.checked = [
        f"{report.shards_checked} of {len(manifest.shards)} shards: size, sha256, schema",
        f"{report.records_checked} of {manifest.num_records} records: structure, values, unique ids",
        "index.arrow: an entry for every record",
    ]
    return report


def _open_checked(path: Path, manifest: Manifest, number: int, report: VerifyReport, checksum: bool):
    """A reader of shard `number` once its size (and with `checksum` its sha256) and schema
    check out, else None with the problem reported."""
    try:
        check_shard(path, manifest.shards[number], checksum=checksum)
        reader = open_shard_reader(path, manifest, number)
    except StoreError as err:
        report.problems.append(f"{err}; records not decoded")
        return None
    report.shards_checked += 1
    return reader


def _check_record(reader, row: int, shard: str, layout, report: VerifyReport) -> Optional[RegionFeatures]:
    """The record at `row` if it decodes and is sane (counted), else None with the problem reported."""
    try:
        rec = reader.record(row)
        validate_record(
            rec, feature_dim=layout.feature_dim, prob_dims={"cls_prob": layout.cls_dim, "attr_prob": layout.attr_dim}
        )
    except (StoreError, InvalidRecordError, ValueError) as err:
        report.problems.append(f"shard {shard} row {row}: {err}")
        return None
    report.records_checked += 1
    return rec


def _verify_sample(
    path: Path,
    manifest: Manifest,
    sample: int,
    seed: int,
    report: VerifyReport,
    on_record: Optional[Callable[[int], None]],
) -> None:
    """`verify_store(sample=...)`: the cheap checks of everything, the full ones on a sample."""
    total = manifest.num_records
    bad = set()
    for number, info in enumerate(manifest.shards):
        try:
            check_shard(path, info)
        except StoreError as err:
            report.problems.append(f"{err}; records not decoded")
            bad.add(number)
    _check_leftovers(path, manifest, report)
    index = fresh_index(path, manifest)
    if index is None:
        report.warnings.append(
            "index.arrow is missing or stale: readers rebuild it in memory; resuming a writer persists it"
        )
    elif len(index) != total:
        report.problems.append(f"index.arrow: {len(index)} entries for {total} records")
    positions = sample_positions(total, sample, seed)
    starts = np.cumsum([0] + [s.rows for s in manifest.shards])
    shards = np.searchsorted(starts, positions, side="right") - 1
    for number in np.unique(shards).tolist():
        info = manifest.shards[number]
        reader = None if number in bad else _open_checked(path, manifest, number, report, checksum=False)
        if reader is None:
            continue
        for row in (positions[shards == number] - starts[number]).tolist():
            rec = _check_record(reader, row, info.name, manifest.layout, report)
            if rec is not None and index is not None:
                _check_entry(path, manifest, index, number, row, rec.image_id, report)
            if on_record:
                on_record(1)
        reader.close()
    listed = len(manifest.shards)
    shards_line = f"all {listed} shards" if not bad else f"{listed - len(bad)} of {listed} shards ({len(bad)} not)"
    report.checked = [
        f"manifest; {shards_line}: present with the recorded size (sha256 not computed)",
        f"{report.shards_checked} shards holding the sample: schema",
        f"{report.records_checked} of {len(positions)} sampled records (seed {seed}) of {total}: structure, values, "
        "index entry (found at its place, no duplicate id)",
        "index.arrow: entry count",
    ]


def check_seed(seed: object) -> int:
    """`seed` if it can seed --sample's draw (an integer in [0, 2**64)), else a ConfigError."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ConfigError(f"--seed must be an integer from 0 to 2**64 - 1, got {seed!r}")
    return int(seed)


def sample_positions(total: int, count: int, seed: int) -> np.ndarray:
    """The global record positions `verify_store(sample=count, seed=seed)` checks, sorted;
    a seed numpy cannot take is a ConfigError (`check_seed`)."""
    seed = check_seed(seed)
    return np.sort(np.random.default_rng(seed).choice(total, size=min(max(count, 0), total), replace=False))


def _check_entry(
    path: Path, manifest: Manifest, index, shard: int, row: int, image_id: str, report: VerifyReport
) -> None:
    """The index sends `image_id` to (shard, row) and to no other row holding that id."""
    where = f"shard {manifest.shards[shard].name} row {row}"
    found = index.candidates(image_id.encode("utf-8"))
    if (shard, row) not in found:
        report.problems.append(f"index.arrow: no entry for image {image_id!r} ({where})")
    for other_shard, other_row in found:
        if (other_shard, other_row) == (shard, row):
            continue
        reader = open_shard_reader(path, manifest, other_shard)
        try:
            if reader.image_id(other_row) == image_id:
                report.problems.append(
                    f"{where}: image {image_id!r} duplicates one in {manifest.shards[other_shard].name} row {other_row}"
                )
        finally:
            reader.close()


def _check_leftovers(path: Path, manifest: Manifest, report: VerifyReport) -> None:
    shards_dir = path / SHARDS_DIR
    listed = set(manifest.shard_names)
    for extra in sorted(shards_dir.iterdir()) if shards_dir.is_dir() else []:
        if extra.name.startswith(TMP_PREFIX):
            report.warnings.append(
                f"{extra.name}: unfinished shard of a killed writer (removed when the store is resumed)"
            )
        elif extra.name not in listed:
            report.warnings.append(f"{extra.name}: not listed in the manifest (ignored by readers)")


def _check_index(path: Path, manifest: Manifest, shard_ids: list[list[tuple[int, str]]], report: VerifyReport) -> None:
    index = fresh_index(path, manifest)
    if index is None:
        report.warnings.append(
            "index.arrow is missing or stale: readers rebuild it in memory; resuming a writer persists it"
        )
        return
    for shard, ids in enumerate(shard_ids):
        for row, image_id in ids:
            if (shard, row) not in index.candidates(image_id.encode("utf-8")):
                report.problems.append(
                    f"index.arrow: no entry for image {image_id!r} (shard {manifest.shards[shard].name} row {row})"
                )
                return
    if len(index) != manifest.num_records:
        report.problems.append(f"index.arrow: {len(index)} entries for {manifest.num_records} records")
