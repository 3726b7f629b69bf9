"""Tab-separated feature files with base64 array fields (no header), as written by the
bottom-up-attention extractors and read by LXMERT / ViLBERT.

lxmert-tsv (airsplay/lxmert `load_obj_tsv`), 10 fields:
    img_id, img_h, img_w, objects_id (int64), objects_conf (float32), attrs_id (int64),
    attrs_conf (float32), num_boxes, boxes (float32 N x 4), features (float32 N x D)
butd-tsv (peteanderson80 `generate_tsv.py`), 6 fields, or 7 with ViLBERT's cls_prob:
    image_id, image_w, image_h, num_boxes, boxes, features[, cls_prob (float32 N x 1601)]

Arrays are base64 of raw little-endian bytes. Rows are streamed; each is checked
(field count, base64, byte lengths against num_boxes) and a bad row becomes a `Skipped`
naming ``file:line``.
Written files end lines with CRLF, as Python's csv writer used by the extractors does.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from pipeline.errors import ConfigError
from pipeline.formats.base import (
    ReadOptions,
    ReadResult,
    RowError,
    Skipped,
    WriteContext,
    decode_array,
    decode_row,
    decode_vector,
    encode_array,
    parse_int,
    record_with_derived_labels,
)
from pipeline.records import RegionFeatures
from pipeline.store.layout import StoreLayout

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

LXMERT_FIELDS = (
    "img_id",
    "img_h",
    "img_w",
    "objects_id",
    "objects_conf",
    "attrs_id",
    "attrs_conf",
    "num_boxes",
    "boxes",
    "features",
)
BUTD_FIELDS = ("image_id", "image_w", "image_h", "num_boxes", "boxes", "features")
BUTD_CLS_FIELDS = BUTD_FIELDS + ("cls_prob",)
LINE_END = "\r\n"


def _rows(paths: Sequence[Path]) -> Iterator[tuple[str, list[bytes], bool]]:
    """(location, fields, newline-terminated) for each non-empty line, streamed."""
    for path in paths:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                complete = line.endswith(b"\n")
                line = line.rstrip(b"\r\n")
                if line:
                    yield f"{path.name}:{lineno}", line.split(b"\t"), complete


def _read(paths: Sequence[Path], decode, counts: tuple[int, ...]) -> Iterator[ReadResult]:
    for location, fields, complete in _rows(paths):

        def decode_fields(fields=fields):
            if len(fields) not in counts:
                raise RowError(
                    "wrong field count", f"expected {' or '.join(map(str, counts))} fields, found {len(fields)}"
                )
            return decode(fields)

        result = decode_row(location, decode_fields)
        if isinstance(result, Skipped) and not complete:
            result = Skipped(
                location, "truncated last line", f"no newline at end of file and {result.kind}: {result.detail}"
            )
        yield result


def _num_boxes(text: bytes) -> int:
    n = parse_int("num_boxes", text)
    if n < 1:
        raise RowError("bad num_boxes", f"num_boxes={n}")
    return n


def _decode_lxmert(f: list[bytes]) -> RegionFeatures:
    n = _num_boxes(f[7])
    return RegionFeatures(
        image_id=f[0].decode("utf-8"),
        image_h=parse_int("img_h", f[1]),
        image_w=parse_int("img_w", f[2]),
        objects_id=decode_vector("objects_id", f[3], np.int64, n),
        objects_conf=decode_vector("objects_conf", f[4], np.float32, n),
        attrs_id=decode_vector("attrs_id", f[5], np.int64, n),
        attrs_conf=decode_vector("attrs_conf", f[6], np.float32, n),
        boxes=decode_array("boxes", f[8], np.float32, n, 4),
        features=decode_array("features", f[9], np.float32, n),
    )


def _decode_butd(f: list[bytes]) -> RegionFeatures:
    n = _num_boxes(f[3])
    return record_with_derived_labels(
        dict(
            image_id=f[0].decode("utf-8"),
            image_w=parse_int("image_w", f[1]),
            image_h=parse_int("image_h", f[2]),
            boxes=decode_array("boxes", f[4], np.float32, n, 4),
            features=decode_array("features", f[5], np.float32, n),
            cls_prob=decode_array("cls_prob", f[6], np.float32, n) if len(f) == 7 else None,
        )
    )


def read_lxmert_tsv(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    return _read(paths, _decode_lxmert, (len(LXMERT_FIELDS),))


def read_butd_tsv(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    """6-field rows, or 7 with cls_prob; objects_id/conf are derived from cls_prob
    (argmax/max over the non-background columns) when it is present."""
    return _read(paths, _decode_butd, (len(BUTD_FIELDS), len(BUTD_CLS_FIELDS)))


LXMERT_LABELS = ("objects_id", "objects_conf", "attrs_id", "attrs_conf")


def _require(rec: RegionFeatures, names: Iterable[str], fmt: str) -> None:
    """The writers' own guard (the `check_*` functions refuse such a store before writing)."""
    missing = [n for n in names if getattr(rec, n) is None]
    if missing:
        raise ConfigError(f"image {rec.image_id!r} has no {', '.join(missing)}, which {fmt} requires")


def _require_all(store: "FeatureStore", names: Sequence[str], fmt: str, advice: str) -> None:
    """A ConfigError, before anything is written, when some record of `store` lacks one of
    the fields `names`: how many lack which, and the first such image."""
    lacking, first = Counter(), None
    for rec in store:
        missing = [n for n in names if getattr(rec, n) is None]
        lacking.update(missing)
        if missing and first is None:
            first = rec.image_id
    if lacking:
        which = ", ".join(f"{lacking[n]:,} without {n}" for n in names if lacking[n])
        raise ConfigError(
            f"{store.path}: {fmt} needs {', '.join(names)} in every record; of {len(store):,} records {which} "
            f"(the first: image {first!r}); nothing written. {advice}"
        )


def check_lxmert_fields(store: "FeatureStore", ctx: WriteContext) -> None:
    """Refuse a store whose records lack the object and attribute labels LXMERT's loader
    reads (a store imported from butd-tsv without cls_prob, say)."""
    _require_all(store, LXMERT_LABELS, "lxmert-tsv", "Export it --to butd-tsv, which needs no labels.")


def butd_with_cls_prob(layout: StoreLayout) -> bool:
    """Whether a butd-tsv export has the 7th field: when the store keeps cls_prob and some
    record had one (else the 6 fields of the original extractor, which vilbert_beta's
    convert_trainval_lmdb.py reads)."""
    return layout.cls_prob.mode != "none" and layout.cls_dim is not None


def check_butd_fields(store: "FeatureStore", ctx: WriteContext) -> None:
    """Refuse a store where some records have cls_prob and others not: one file holds 6 or 7
    fields a row, never both."""
    if butd_with_cls_prob(store.layout):
        _require_all(
            store, ("cls_prob",), "butd-tsv with cls_prob (7 fields)", "Re-import the records with their cls_prob."
        )


def write_lxmert_tsv(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    with open(dest, "w", encoding="utf-8", newline="") as out:
        return _write_lines(records, out, _lxmert_fields)


def _write_lines(records: Iterable[RegionFeatures], out: IO[str], fields_of) -> int:
    count = 0
    for rec in records:
        out.write("\t".join(fields_of(rec)) + LINE_END)
        count += 1
    return count


def _lxmert_fields(rec: RegionFeatures) -> list[str]:
    _require(rec, LXMERT_LABELS, "lxmert-tsv")
    return [
        rec.image_id,
        str(rec.image_h),
        str(rec.image_w),
        encode_array(rec.objects_id, np.int64),
        encode_array(rec.objects_conf, np.float32),
        encode_array(rec.attrs_id, np.int64),
        encode_array(rec.attrs_conf, np.float32),
        str(rec.num_boxes),
        encode_array(rec.boxes, np.float32),
        encode_array(rec.features, np.float32),
    ]


def write_butd_tsv(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    """6 fields, or 7 (ViLBERT's variant) when the store holds cls_prob (`butd_with_cls_prob`)."""
    with_cls_prob = butd_with_cls_prob(ctx.manifest.layout)

    def fields_of(rec: RegionFeatures) -> list[str]:
        fields = [
            rec.image_id,
            str(rec.image_w),
            str(rec.image_h),
            str(rec.num_boxes),
            encode_array(rec.boxes, np.float32),
            encode_array(rec.features, np.float32),
        ]
        if with_cls_prob:
            _require(rec, ("cls_prob",), "butd-tsv with cls_prob (7 fields)")
            fields.append(encode_array(rec.cls_prob, np.float32))
        return fields

    with open(dest, "w", encoding="utf-8", newline="") as out:
        return _write_lines(records, out, fields_of)
