"""meshed-memory-transformer's detections HDF5 (``coco_detections.hdf5``), as its
``data/field.py::ImageDetectionsField`` reads it: for an image whose file name ends in ``_<number>``
(``COCO_val2014_000000000042.jpg``), the datasets ``<number>_features`` (N x 2048; read with
``[()]`` and cast to float32, padded or cut to ``max_detections``), ``<number>_boxes`` (N x 4) and
``<number>_cls_prob`` (N x 1601, background first: its ``sort_by_prob`` orders regions by the row
maximum). Users convert BUTD TSVs to it (meshed-memory-transformer #49).

Export writes one file (``h5py``: ``pip install vlprep[formats]``), in storage order:

    <key>_features    (N, D) float32 (``dtype=store`` keeps float16), attributes image_id, image_h, image_w
    <key>_boxes       (N, 4) float32, x1 y1 x2 y2 in original pixels
    <key>_cls_prob    (N, C) when the record has one
    <key>_objects_id, _objects_conf, _attrs_id, _attrs_conf, _attr_prob   (m2 ignores them; a round trip keeps them)
    __vlprep__        the store's schema version, layout and provenance (JSON text)
    __card__          the store's dataset card (README.md text)

The key is the number m2 parses from the image id (``keys=m2``: the id's last ``_`` field, up to a
dot, as a decimal integer), or the id itself made safe for HDF5 names (``keys=id``: the WebDataset
key encoding, no ``/`` or ``.``); ``keys=auto`` (default) takes m2's numbers when every id gives one
and no two the same, else the ids. ``keys=m2`` on a store whose ids do not give distinct numbers is
refused before anything is written.

Import reads every ``<key>_features`` in the file's order: the image id and size come from the
dataset's attributes; m2's own file has none, so its image sizes come from ``--option
sizes=FILE`` (a JSON object of key -> [height, width]; an image without one is skipped by name,
never sized by guess) and its ids are the keys. ``cls_prob`` tables are read as ``cls-background``
says (default: background first, as BUTD writes them). A file that is not HDF5 or holds no
``<key>_features`` is a ``ConfigError``, a truncated one a `FormatDataError`, before anything is
written.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

import numpy as np

from pipeline.errors import ConfigError
from pipeline.formats.base import (
    BACKGROUND_MODES,
    Description,
    FormatDataError,
    ReadOptions,
    ReadResult,
    RowError,
    WriteContext,
    decode_row,
    parse_int,
    record_with_derived_labels,
    with_background_first,
)
from pipeline.formats.card import RegionCounts, imported_provenance, render_card
from pipeline.formats.options import EXPORT, IMPORT, FormatOptions, option
from pipeline.formats.wds import decode_key, encode_key
from pipeline.records import OPTIONAL_ARRAYS, REGION_SCHEMA_VERSION, RegionFeatures

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

log = logging.getLogger(__name__)
NAME = "m2-hdf5"
META = "__vlprep__"
CARD = "__card__"
SUFFIX = "_features"
LAYOUT_KEYS = ("backend", "dtype", "feature_dim", "cls_prob", "attr_prob", "regions")  # what an import takes
EXTRAS = ("objects_id", "objects_conf", "attrs_id", "attrs_conf", "cls_prob", "attr_prob")
_M2_NUMBER = re.compile(r"[0-9]+")
M2_FIELDS = {
    "image_id": "<key> (+ attribute image_id)",
    "image_h": "<key>_features attribute image_h",
    "image_w": "<key>_features attribute image_w",
    "boxes": "<key>_boxes",
    "features": "<key>_features",
    **{name: f"<key>_{name}" for name in OPTIONAL_ARRAYS},
}


@dataclass(frozen=True)
class M2Options(FormatOptions):
    keys: str = option(
        "auto",
        "dataset names: m2's numbers (the id's last _ field), the ids themselves, or auto (numbers when every id "
        "gives a distinct one)",
        when=EXPORT,
        choices=("auto", "m2", "id"),
    )
    dtype: str = option(
        "float32", "features and tables as float32 (as m2 casts them), or in the store's dtype", when=EXPORT,
        choices=("float32", "store"),
    )  # fmt: skip
    compression: str = option("none", "HDF5 filter of every dataset", when=EXPORT, choices=("none", "gzip", "lzf"))
    sizes: Optional[Path] = option(
        None,
        "a JSON object of key -> [height, width] for a file without size attributes (m2's own)",
        when=IMPORT,
    )
    cls_background: str = option(
        "first",
        "where the file's cls_prob has its background column (BUTD's: first)",
        when=IMPORT,
        choices=BACKGROUND_MODES,
    )


def _h5py():
    try:
        import h5py
    except ImportError:  # an optional dependency
        raise ConfigError(f"{NAME} needs h5py: pip install 'vlprep[formats]' (or h5py)") from None
    return h5py


def m2_number(image_id: str) -> Optional[int]:
    """The number meshed-memory-transformer parses from an image's file name: its last ``_``
    field up to a dot (``COCO_val2014_000000000042.jpg`` -> 42); None when that is no number."""
    field = image_id.split("_")[-1].split(".")[0]
    return int(field) if _M2_NUMBER.fullmatch(field) else None


def key_mode(ids: Iterable[str], wanted: str) -> str:
    """ "m2" or "id" for `wanted` (auto: m2 when every id gives a distinct number); a ConfigError
    naming the first offending id when ``keys=m2`` cannot hold them."""
    if wanted == "id":
        return "id"
    seen: dict[int, str] = {}
    for image_id in ids:
        number = m2_number(image_id)
        clash = seen.get(number) if number is not None else None
        if number is None or clash is not None:
            if wanted == "auto":
                return "id"
            what = f"{image_id!r} gives no number" if number is None else f"{clash!r} and {image_id!r} give {number}"
            raise ConfigError(
                f"{NAME} keys=m2: {what} (m2 looks images up by the number after the last '_'); "
                "export with --option keys=id"
            )
        seen[number] = image_id
    return "m2"


def check_m2(store: "FeatureStore", ctx: WriteContext) -> None:
    _h5py()
    key_mode(store.ids(), ctx.options.keys)


def write_m2_hdf5(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    from pipeline.store import FeatureStore

    h5py = _h5py()
    options: M2Options = ctx.options  # type: ignore[assignment]
    manifest = ctx.manifest
    with FeatureStore.open(ctx.store) as store:
        mode = key_mode(store.ids(), options.keys)
    float_dtype = np.dtype(manifest.layout.dtype if options.dtype == "store" else "float32")
    filters = {} if options.compression == "none" else {"compression": options.compression}
    meta = {"schema_version": REGION_SCHEMA_VERSION, "layout": manifest.layout.to_json(), "keys": mode}
    meta["provenance"] = manifest.provenance
    count = 0
    counts = RegionCounts()
    with h5py.File(dest, "w", track_order=True) as f:
        for rec in records:
            key = str(m2_number(rec.image_id)) if mode == "m2" else encode_key(rec.image_id)
            feats = f.create_dataset(f"{key}_features", data=np.asarray(rec.features, float_dtype), **filters)
            feats.attrs["image_id"] = rec.image_id
            feats.attrs["image_h"] = np.int64(rec.image_h)
            feats.attrs["image_w"] = np.int64(rec.image_w)
            f.create_dataset(f"{key}_boxes", data=np.asarray(rec.boxes, np.float32), **filters)
            for name in EXTRAS:
                value = getattr(rec, name)
                if value is not None:
                    if name in ("cls_prob", "attr_prob"):
                        value = np.asarray(value, float_dtype)
                    f.create_dataset(f"{key}_{name}", data=value, **filters)
            counts.add(rec.num_boxes)
            count += 1
        name = ctx.store.resolve().name if ctx.store is not None else "features"
        f.create_dataset(META, data=json.dumps(meta, sort_keys=True))
        f.create_dataset(CARD, data=render_card(manifest, name=name, export=NAME, command=ctx.command, counts=counts))
    return count


# -- import ---------------------------------------------------------------------------------------


def _file(paths: Sequence[Path]) -> Path:
    files = [p for p in paths if p.is_file()]
    if len(files) != 1 or len(paths) != 1:
        raise ConfigError(f"{NAME} reads one .hdf5 / .h5 file; got {', '.join(map(str, paths))}")
    return files[0]


def _open(path: Path):
    h5py = _h5py()
    try:
        return h5py.File(path, "r")
    except OSError as err:
        if "truncated" in str(err):
            raise FormatDataError(f"{path}: a truncated HDF5 file ({err}); nothing imported") from None
        raise ConfigError(f"{path}: not an HDF5 file ({err})") from None


def _feature_keys(path: Path, f) -> list[str]:
    keys = [name[: -len(SUFFIX)] for name in f.keys() if name.endswith(SUFFIX)]
    if not keys:
        raise ConfigError(
            f"{path}: no <key>_features dataset: not a meshed-memory-transformer detections file "
            f"(it holds {', '.join(list(f.keys())[:5]) or 'nothing'})"
        )
    return keys


def _meta(path: Path, f) -> Optional[dict]:
    if META not in f:
        return None
    try:
        raw = f[META][()]
        meta = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except (ValueError, TypeError, RecursionError, UnicodeDecodeError) as err:
        raise FormatDataError(f"{path}: its {META} dataset is not readable JSON ({err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("layout"), dict):
        raise FormatDataError(f"{path}: its {META} dataset holds no layout")
    return meta


def _sizes(option_path: Optional[Path]) -> dict:
    if option_path is None:
        return {}
    try:
        obj = json.loads(Path(option_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ConfigError(f"--option sizes={option_path}: not a readable JSON file ({err})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"--option sizes={option_path}: expected an object of key -> [height, width]")
    return obj


def m2_describe(paths: Sequence[Path], opts: ReadOptions) -> Description:
    """The file opened (not HDF5: ConfigError; truncated: FormatDataError) and its datasets listed
    before any row; the store settings and provenance its ``__vlprep__`` states (an export of ours:
    its rows are vouched for), else the first features' width."""
    path = _file(paths)
    with _open(path) as f:
        keys = _feature_keys(path, f)
        meta = _meta(path, f)
        if meta is None:
            shape = f[keys[0] + SUFFIX].shape
            return Description(layout={"feature_dim": int(shape[1])} if len(shape) == 2 else {})
    layout = {k: meta["layout"][k] for k in LAYOUT_KEYS if k in meta["layout"]}
    return Description(layout=layout, provenance=imported_provenance(meta.get("provenance")), checked=True)


def _array(f, name: str, ndim: int) -> np.ndarray:
    data = f[name][()]
    if not isinstance(data, np.ndarray) or data.ndim != ndim or data.dtype.kind not in "fiu":
        raise RowError("bad array", f"{name}: {getattr(data, 'shape', type(data).__name__)}, expected {ndim}-d numbers")
    return data


def _decode(f, key: str, sizes: dict, background: str) -> RegionFeatures:
    try:
        return _decode_key(f, key, sizes, background)
    except OSError as err:  # HDF5's error for a damaged dataset
        raise RowError("unreadable", f"{key}: {err}") from None


def _decode_key(f, key: str, sizes: dict, background: str) -> RegionFeatures:
    feats_ds = f[key + SUFFIX]
    attrs = feats_ds.attrs
    if f"{key}_boxes" not in f:
        raise RowError("missing field", f"no {key}_boxes")
    features = _array(f, key + SUFFIX, 2)
    boxes = _array(f, f"{key}_boxes", 2).astype(np.float32)
    if "image_h" in attrs and "image_w" in attrs:
        height, width = parse_int("image_h", attrs["image_h"]), parse_int("image_w", attrs["image_w"])
    elif key in sizes:
        size = sizes[key]
        if not (isinstance(size, list) and len(size) == 2):
            raise RowError("bad size", f"the sizes file gives {size!r:.60} for {key!r}, not [height, width]")
        height, width = parse_int("height", size[0]), parse_int("width", size[1])
    else:
        raise RowError("no image size", f"{key!r} has no image_h/image_w attributes and is not in --option sizes")
    if "image_id" in attrs:
        image_id = attrs["image_id"]
        image_id = image_id.decode("utf-8") if isinstance(image_id, bytes) else str(image_id)
    else:
        try:
            image_id = decode_key(key)
        except (ValueError, UnicodeDecodeError):
            image_id = key
    fields: dict = dict(image_id=image_id, image_h=height, image_w=width, boxes=boxes, features=features)
    n = boxes.shape[0]
    for name in EXTRAS:
        if f"{key}_{name}" in f:
            value = _array(f, f"{key}_{name}", 2 if name.endswith("_prob") else 1)
            if value.shape[0] != n:
                raise RowError("num_boxes mismatch", f"{key}_{name}: {value.shape[0]} rows, boxes has {n}")
            fields[name] = with_background_first(value, background) if name == "cls_prob" else value
    for ids, conf in (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf")):
        if (fields.get(ids) is None) != (fields.get(conf) is None):
            raise RowError("missing field", f"{key}: {ids} and {conf} come together")
    return record_with_derived_labels(fields)


def read_m2_hdf5(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    options: M2Options = opts.options  # type: ignore[assignment]
    path = _file(paths)
    sizes = _sizes(options.sizes)
    with _open(path) as f:
        for key in _feature_keys(path, f):
            yield decode_row(f"{path.name}:{key}", lambda key=key: _decode(f, key, sizes, options.cls_background))
