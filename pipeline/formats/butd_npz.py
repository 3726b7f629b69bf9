"""Per-image ``.npz`` files as bottom-up-attention.pytorch's extractor writes them and OpenVQA / MCAN
read them.

MILVLG/bottom-up-attention.pytorch (``utils/extract_utils.py::save_roi_features``) writes, per image,
``<image>.npz`` with ``np.savez_compressed(x=features (N, 2048) float32, bbox=boxes (N, 4) float32,
num_bbox=N, image_h=H, image_w=W, info={image_id, image_h, image_w, num_boxes, objects_id,
objects_conf[, attrs_id, attrs_conf]})`` -- ``info`` a pickled dict, its labels argmax / max over the
non-background columns. OpenVQA's VQA loader (``openvqa/datasets/vqa/vqa_loader.py``) reads ``x``
*transposed* (``frcn_feat['x'].transpose((1, 0))``: its released VQA-v2 features hold ``x`` as
(2048, N)), with ``bbox`` and ``image_h`` / ``image_w``; its GQA files spell the size
``height`` / ``width``.

Export writes ``<id>.npz`` per image (the id's ``/`` make subfolders; ids that would escape the
folder or collide with another's file are refused before anything is written):

    x                  float32 (N, D), or (D, N) with ``x-layout=columns`` (for OpenVQA's VQA loader)
    bbox               float32 (N, 4), x1 y1 x2 y2 in original pixels
    num_bbox, image_h, image_w   int64 scalars
    image_id           the id (a unicode scalar)
    objects_id, objects_conf, attrs_id, attrs_conf, cls_prob, attr_prob   where the record has them

as plain arrays: no pickle is written (the labels ``info`` holds are separate keys; the readers above
ignore keys they do not use), with ``np.savez`` (``compress=true``: ``np.savez_compressed``, as
bottom-up-attention.pytorch does; float features barely shrink and zlib is slow).

Import reads every ``*.npz`` under the folders (the id: the relative path without ``.npz``, or the
file's ``image_id``). ``x``'s orientation comes from ``x-layout`` or, with ``auto``, from its shape
against ``num_bbox`` / ``bbox`` (a square ``x``, N = D, is skipped by name: say which). An ``info``
dict is read only with ``--trust-pickle``, through the restricted unpickler. A file that is
truncated, not a zip of ``.npy`` arrays, or lacks ``x``, ``bbox`` or the image size is skipped with its
path and the reason.
"""

from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

import numpy as np

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.formats.base import (
    BACKGROUND_MODES,
    Description,
    ReadOptions,
    ReadResult,
    RowError,
    WriteContext,
    decode_row,
    parse_int,
    record_with_derived_labels,
    safe_relative_path,
    with_background_first,
)
from pipeline.formats.options import BOTH, EXPORT, IMPORT, FormatOptions, option
from pipeline.records import RegionFeatures
from pipeline.safe_pickle import safe_load_npy_object

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

log = logging.getLogger(__name__)
NAME = "butd-npz"
LABELS = ("objects_id", "objects_conf", "attrs_id", "attrs_conf")
TABLES = ("cls_prob", "attr_prob")
NPZ_FIELDS = {
    "image_id": "<id> (path) / image_id",
    "image_h": "image_h (height)",
    "image_w": "image_w (width)",
    "boxes": "bbox (+ num_bbox)",
    "features": "x (N, D) or (D, N)",
    "objects_id": "objects_id (info['objects_id'])",
    "objects_conf": "objects_conf (info)",
    "attrs_id": "attrs_id (info)",
    "attrs_conf": "attrs_conf (info)",
    "cls_prob": "cls_prob",
    "attr_prob": "attr_prob",
}


@dataclass(frozen=True)
class NpzOptions(FormatOptions):
    x_layout: str = option(
        "auto",
        "x as (N, D) rows (bottom-up-attention.pytorch) or (D, N) columns (OpenVQA's VQA features); auto: rows on "
        "export, from the shape on import",
        when=BOTH,
        choices=("auto", "rows", "columns"),
    )
    compress: bool = option(
        False,
        "np.savez_compressed, as bottom-up-attention.pytorch writes (float features barely shrink, and zlib writes "
        "them some 20 times slower), or np.savez; np.load reads both",
        when=EXPORT,
    )
    cls_background: str = option(
        "first",
        "where the files' cls_prob has its background column",
        when=IMPORT,
        choices=BACKGROUND_MODES,
    )


# -- export ---------------------------------------------------------------------------------------


def check_npz_ids(store: "FeatureStore", ctx: WriteContext) -> None:
    """Ids that would escape the folder, or whose file is another id's folder (``a`` writes
    ``a.npz``, which ``a.npz/b`` needs as a folder), are refused before anything is written."""
    ids = set()
    for image_id in store.ids():
        safe_relative_path(image_id)
        ids.add(image_id)
    for image_id in ids:
        for folder in PurePosixPath(image_id).parents:
            name = folder.as_posix()
            if name.endswith(".npz") and name[: -len(".npz")] in ids:
                raise ConfigError(
                    f"{NAME} export: {name[:-4]!r} writes the file {name}, which {image_id!r} needs as a folder; "
                    "rename one, or export to another format"
                )


def write_butd_npz(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    options: NpzOptions = ctx.options  # type: ignore[assignment]
    save = np.savez_compressed if options.compress else np.savez
    dest.mkdir(parents=True)
    count = 0
    for rec in records:
        target = dest / safe_relative_path(rec.image_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        x = np.asarray(rec.features, np.float32)
        arrays = {
            "x": np.ascontiguousarray(x.T) if options.x_layout == "columns" else x,
            "bbox": np.asarray(rec.boxes, np.float32),
            "num_bbox": np.int64(rec.num_boxes),
            "image_h": np.int64(rec.image_h),
            "image_w": np.int64(rec.image_w),
            "image_id": np.str_(rec.image_id),
        }
        for name in LABELS + TABLES:
            value = getattr(rec, name)
            if value is not None:
                kind = np.int64 if name.endswith("_id") else np.float32
                arrays[name] = np.asarray(value, kind)
        with open(target.with_name(target.name + ".npz"), "wb") as out:
            save(out, allow_pickle=False, **arrays)
        count += 1
    return count


# -- import ---------------------------------------------------------------------------------------


def _scalar(name: str, value) -> int:
    arr = np.asarray(value)
    if arr.shape not in ((), (1,)):
        raise RowError("bad value", f"{name}: shape {arr.shape}, expected a number")
    return parse_int(name, arr.reshape(()).item() if arr.dtype.kind in "iuf" else arr.reshape(()))


def _member(npz: np.lib.npyio.NpzFile, name: str, trust_pickle: bool):
    """A member's array; an object array (a pickle) only with `trust_pickle`, restricted."""
    try:
        return npz[name]
    except ValueError:  # an object array: np.load refuses it without allow_pickle
        if not trust_pickle:
            raise
        with npz.zip.open(f"{name}.npy") as f:
            return safe_load_npy_object(f.read())


def _orient(x: np.ndarray, n: int, layout: str) -> np.ndarray:
    if x.ndim != 2:
        raise RowError("bad array", f"x: shape {x.shape}, expected 2-d")
    if layout == "rows" or (layout == "auto" and x.shape[0] == n and x.shape[1] != n):
        rows = x
    elif layout == "columns" or (layout == "auto" and x.shape[1] == n and x.shape[0] != n):
        rows = x.T
    elif x.shape == (n, n):
        raise RowError("ambiguous x", f"x is {n} x {n}: pass --option x-layout=rows or x-layout=columns")
    else:
        raise RowError("num_boxes mismatch", f"x: shape {x.shape}, neither side is num_bbox={n}")
    if rows.shape[0] != n:
        raise RowError("num_boxes mismatch", f"x: shape {x.shape} as {layout}, num_bbox={n}")
    return np.ascontiguousarray(rows, np.float32)


def _decode(path: Path, default_id: str, opts: ReadOptions, warned: list) -> RegionFeatures:
    options: NpzOptions = opts.options  # type: ignore[assignment]
    try:
        npz = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise RowError("bad npz", f"{path.name}: {err}") from None
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise RowError("bad npz", f"{path.name}: a single .npy array, not an .npz of named arrays")
    with npz:
        try:
            names = set(npz.files)
            for required in ("x", "bbox"):
                if required not in names:
                    raise RowError("missing field", f"no {required} (it holds {', '.join(sorted(names))})")
            info: dict = {}
            if "info" in names:
                try:
                    loaded = _member(npz, "info", opts.trust_pickle)
                    info = loaded if isinstance(loaded, dict) else {}
                except ValueError:
                    if not warned:
                        warned.append(True)
                        log.warning(
                            "%s holds an 'info' dict (a pickle): its labels are not read without --trust-pickle",
                            path.name,
                        )
            boxes = np.asarray(npz["bbox"], np.float32)
            if boxes.ndim != 2 or boxes.shape[1] != 4:
                raise RowError("bad array", f"bbox: shape {boxes.shape}, expected (N, 4)")
            n = _scalar("num_bbox", npz["num_bbox"]) if "num_bbox" in names else boxes.shape[0]
            if n != boxes.shape[0]:
                raise RowError("num_boxes mismatch", f"num_bbox={n}, bbox has {boxes.shape[0]} rows")
            size = {}
            for field, spellings in (("image_h", ("image_h", "height")), ("image_w", ("image_w", "width"))):
                found = next((s for s in spellings if s in names), None)
                if found is None and info.get(field) is None:
                    raise RowError("no image size", f"no {' or '.join(spellings)}")
                size[field] = _scalar(field, npz[found] if found else info[field])
            image_id = default_id
            if "image_id" in names:
                image_id = str(np.asarray(npz["image_id"]).reshape(()).item())
            fields: dict = dict(
                image_id=image_id,
                boxes=boxes,
                features=_orient(np.asarray(npz["x"]), n, options.x_layout),
                **size,
            )
            for name in LABELS:
                value = npz[name] if name in names else info.get(name)
                if value is not None:
                    fields[name] = np.asarray(value).reshape(-1)
            for name in TABLES:
                if name in names:
                    table = np.asarray(npz[name], np.float32)
                    fields[name] = with_background_first(table, options.cls_background) if name == "cls_prob" else table
            for ids, conf in (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf")):
                if (fields.get(ids) is None) != (fields.get(conf) is None):
                    raise RowError("missing field", f"{ids} and {conf} come together")
                if fields.get(ids) is not None:
                    fields[ids] = fields[ids].astype(np.int64)
                    fields[conf] = fields[conf].astype(np.float32)
            return record_with_derived_labels(fields)
        except UnsafePickleError:
            raise
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise RowError("bad npz", f"{path.name}: {err}") from None


def read_butd_npz(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    warned: list = []
    for root in paths:
        files = sorted(root.rglob("*.npz")) if root.is_dir() else [root]
        if not root.is_dir() and root.suffix != ".npz":
            raise ConfigError(f"{root}: {NAME} reads .npz files or folders of them")
        for path in files:
            rel = path.relative_to(root).as_posix() if root.is_dir() else path.name
            default_id = rel[: -len(".npz")]
            yield decode_row(rel, lambda path=path, default_id=default_id: _decode(path, default_id, opts, warned))


def _first_file(paths: Sequence[Path]) -> Optional[Path]:
    for root in paths:
        if root.is_dir():
            found = next(iter(sorted(root.rglob("*.npz"))), None)
            if found is not None:
                return found
        elif root.suffix == ".npz":
            return root
    return None


def npz_describe(paths: Sequence[Path], opts: ReadOptions) -> Description:
    """The feature width of the first file (its ``x`` against its ``bbox``), if it can tell."""
    first = _first_file(paths)
    if first is None:
        raise ConfigError(f"{NAME}: no .npz file among the sources ({', '.join(map(str, paths))})")
    try:
        with np.load(first, allow_pickle=False) as npz:
            x, n = npz["x"], np.asarray(npz["bbox"]).shape[0]
            return Description(layout={"feature_dim": int(_orient(np.asarray(x), n, opts.options.x_layout).shape[1])})
    except (RowError, KeyError, OSError, ValueError, EOFError, zipfile.BadZipFile, IndexError):
        return Description()  # that file's own problem is named when its row is read
