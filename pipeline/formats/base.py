"""Shared pieces of the format adapters: the registry entry (`Format`), what a reader and a writer
are handed (`ReadOptions`, `WriteContext`), rows and skipped rows, array decoding.

A reader yields, per source row, either a `Row` (the record and where it came from) or a
`Skipped` (where, a short kind, the reason). Any bad value in a row must become a
`RowError` in the decoder (hence a `Skipped`), never an exception that stops the import.
A source that is not of the format at all (the wrong schema) is a `ConfigError`, damage that
is no row's (a truncated shard, a card that disagrees with its data) a `FormatDataError`:
both before anything is written where the format can tell (files' footers, the card).
"""

from __future__ import annotations

import base64
import binascii
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from pipeline.errors import ConfigError, DataError, UnsafePickleError
from pipeline.formats.options import IMPORT, FormatOptions, option
from pipeline.records import RegionFeatures, labels_from_probs

if TYPE_CHECKING:
    from pipeline.store import FeatureStore
    from pipeline.store.manifest import Manifest

# Number of columns of a bottom-up-attention (Visual Genome) class table with background: a table
# of one column fewer has none (`with_background_first`, the "auto" of the cls-background option).
VG_CLASSES_WITH_BG = 1601
BACKGROUND_MODES = ("auto", "first", "last", "absent")
# The record fields every format carries (the others: `Format.round_trip`).
BASE_FIELDS = frozenset({"image_id", "image_h", "image_w", "boxes", "features"})


class FormatDataError(DataError):
    """A source that is damaged as a whole, not in one row: a truncated shard, a card that
    disagrees with its data (exit 3)."""


@dataclass(frozen=True)
class Skipped:
    """A source row that was not imported, and why."""

    location: str  # "file.tsv:12", "data.mdb key b'42'", ...
    kind: str  # short category, counted in the report
    detail: str

    def __str__(self) -> str:
        return f"{self.location}: {self.kind}: {self.detail}"


class RowError(ValueError):
    """Raised inside a row decoder; becomes a `Skipped` with this kind."""

    def __init__(self, kind: str, detail: str):
        self.kind, self.detail = kind, detail
        super().__init__(f"{kind}: {detail}")


@dataclass(frozen=True)
class Row:
    """A decoded source row: the record, and where it came from (for the import report)."""

    location: str
    record: RegionFeatures


ReadResult = Union[Row, Skipped]

# What numpy, int() and friends raise on a bad value.
_BAD_VALUE_ERRORS = (TypeError, ValueError, OverflowError, AttributeError, IndexError, KeyError, EOFError)


@contextmanager
def row_errors() -> Iterator[None]:
    """Turn any exception a bad value raises while one row is decoded into a `RowError`."""
    try:
        yield
    except RowError:
        raise
    except UnsafePickleError as err:
        raise RowError("refused pickle", str(err)) from err
    except UnicodeDecodeError as err:
        raise RowError("bad utf-8", str(err)) from err
    except _BAD_VALUE_ERRORS as err:
        raise RowError("bad value", f"{type(err).__name__}: {err}") from err


def decode_row(location: str, decode: Callable[[], RegionFeatures]) -> ReadResult:
    """One source row: the record `decode()` returns as a `Row`, or why not as a `Skipped`."""
    try:
        with row_errors():
            return Row(location, decode())
    except RowError as err:
        return Skipped(location, err.kind, err.detail)


def pickle_refusal(fmt: str) -> ConfigError:
    """The error for reading a pickled format without --trust-pickle."""
    return ConfigError(
        f"{fmt} stores Python pickles; pass --trust-pickle to load them through the restricted "
        "unpickler, which admits numpy arrays and plain values only (nothing that can run code)"
    )


@dataclass(frozen=True)
class ReadOptions:
    """What a reader (and a format's `describe`) is handed: whether pickles may be
    loaded, and the format's options (`--option KEY=VALUE`, parsed)."""

    trust_pickle: bool = False
    options: FormatOptions = FormatOptions()


@dataclass(frozen=True)
class WriteContext:
    """What a writer (and a format's `check`) is handed: the store's manifest (its layout and
    provenance), the format's options, the store's folder and the export command (the card
    names both)."""

    manifest: "Manifest"
    options: FormatOptions = FormatOptions()
    store: Optional[Path] = None
    command: str = ""


@dataclass(frozen=True)
class Description:
    """What sources say of themselves, read before any row (`Format.describe`): the store settings
    they state (feature_dim, dtype, cls_prob, attr_prob, backend, regions: used where the import
    command leaves them unset), the provenance an imported store records beyond the format (label
    names, the most regions a record can have, an exported store's own provenance), and whether a
    card or the files' metadata vouch for the rows (`checked`: then a row that is not what they say
    is damage, a `FormatDataError`, not a skipped row)."""

    layout: Mapping = field(default_factory=dict)
    provenance: Mapping = field(default_factory=dict)
    checked: bool = False


Reader = Callable[[Sequence[Path], ReadOptions], Iterator[ReadResult]]
Writer = Callable[[Iterable[RegionFeatures], Path, WriteContext], int]


@dataclass(frozen=True)
class Format:
    """One foreign format: a module's reader and writer and what the registry says of them. Help
    texts, `vlprep formats`, the docs' tables and the registry's round-trip test read these."""

    name: str
    summary: str
    read: Optional[Reader] = None
    # write(records, dest, ctx) -> records written; `dest` is a new path (a file or a folder, as
    # `output` says) under a temporary name, renamed into place when the writer returns
    write: Optional[Writer] = None
    output: str = "folder"  # what an export writes: "file" or "folder"
    needs_pickle: bool = False
    # check(store, ctx): raise ConfigError naming what of the store the format cannot hold (ids,
    # records lacking a field it needs); run before anything is written
    check: Optional[Callable[["FeatureStore", WriteContext], None]] = None
    regions: str = "detections"  # what an imported store holds ("grid": feature-map cells, row-major)
    # describe(sources, opts): what the sources say of themselves (`Description`), before any row;
    # where it can tell, a source of the wrong schema or damaged as a whole is refused here
    describe: Optional[Callable[[Sequence[Path], ReadOptions], "Description"]] = None
    options: type[FormatOptions] = FormatOptions
    # how the format spells each record field it holds (the docs' field table)
    fields: Mapping[str, str] = field(default_factory=dict)
    # the optional record fields an export then an import gives back exactly (beyond BASE_FIELDS)
    round_trip: frozenset = frozenset()
    # what a store needs to be exported: "labels" (label names), "grid" (a grid store)
    needs: str = ""
    card: bool = True  # a folder export gets the store's dataset card as README.md
    store_dtype: bool = False  # the writer gets the store's dtype (float16 stays float16), not float32 copies

    @property
    def importable(self) -> bool:
        return self.read is not None

    @property
    def exportable(self) -> bool:
        return self.write is not None

    def parse_options(self, pairs: Sequence[str], direction: str) -> FormatOptions:
        return self.options.parse(pairs, self.name, direction)


@dataclass(frozen=True)
class ClassTableOptions(FormatOptions):
    """The option of formats whose class tables may put the background elsewhere than column 0."""

    cls_background: str = option(
        "auto",
        "where the source's cls_prob has its background column (auto: absent from a 1600-column table, else "
        "first; last: detectron2's order)",
        when=IMPORT,
        choices=BACKGROUND_MODES,
    )


def decode_array(field: str, value: Union[str, bytes], dtype, num: int, width: Optional[int] = None) -> np.ndarray:
    """base64 of raw little-endian bytes -> (num, width); width None: inferred from the length."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise RowError("bad base64", f"field {field}: {err}") from err
    return array_from_bytes(field, raw, dtype, num, width)


def array_from_bytes(field: str, raw: bytes, dtype, num: int, width: Optional[int] = None) -> np.ndarray:
    itemsize = np.dtype(dtype).itemsize
    if width is None:
        per_box = num * itemsize
        if not raw or len(raw) % per_box:
            raise RowError(
                "num_boxes mismatch",
                f"field {field}: {len(raw)} bytes is not a multiple of num_boxes={num} x {itemsize}",
            )
        width = len(raw) // per_box
    expected = num * width * itemsize
    if len(raw) != expected:
        raise RowError("num_boxes mismatch", f"field {field}: {len(raw)} bytes, num_boxes={num} needs {expected}")
    return np.frombuffer(raw, np.dtype(dtype).newbyteorder("<")).reshape(num, width)


def decode_vector(field: str, value: Union[str, bytes], dtype, num: int) -> np.ndarray:
    """base64 of raw little-endian bytes -> (num,)."""
    return decode_array(field, value, dtype, num, 1).reshape(num)


def encode_array(arr: np.ndarray, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, np.dtype(dtype).newbyteorder("<")).tobytes()).decode("ascii")


def parse_int(field: str, value) -> int:
    """An integer from text, an int or an integral float; anything else (a bool, NaN,
    3.5, "12abc", an array) is a RowError."""
    if isinstance(value, (bool, np.bool_)):
        raise RowError("bad integer", f"field {field}: {value!r}")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise RowError("bad integer", f"field {field}: {value!r}")
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
        value = value.item()
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError) as err:
        raise RowError("bad integer", f"field {field}: {value!r}") from err


def with_background_first(cls_prob: np.ndarray, background: str = "auto") -> np.ndarray:
    """A class table with the background at column 0, as a store keeps it. `background` says where
    the source has it: "first" (Caffe, maskrcnn-benchmark), "last" (detectron2, the HF port: moved
    to column 0), "absent" (a zero column is prepended), or "auto": absent when the table has 1600
    columns (a Visual Genome table without background, as MMF writes by default), else first."""
    if background == "last":
        return np.concatenate([cls_prob[:, -1:], cls_prob[:, :-1]], axis=1)
    if background == "absent" or (background == "auto" and cls_prob.shape[1] == VG_CLASSES_WITH_BG - 1):
        return np.concatenate([np.zeros((cls_prob.shape[0], 1), cls_prob.dtype), cls_prob], axis=1)
    return cls_prob


def record_with_derived_labels(rec_fields: dict) -> RegionFeatures:
    """Fill objects_id/objects_conf from cls_prob when the source has no explicit labels."""
    for ids, conf, prob in (("objects_id", "objects_conf", "cls_prob"), ("attrs_id", "attrs_conf", "attr_prob")):
        table = rec_fields.get(prob)
        if rec_fields.get(ids) is None and table is not None:
            if table.ndim != 2 or table.shape[1] < 2:
                raise RowError("bad array", f"field {prob}: shape {table.shape}, needs a background column and a class")
            rec_fields[ids], rec_fields[conf] = labels_from_probs(table)
    return RegionFeatures(**rec_fields)


def safe_relative_path(image_id: str) -> Path:
    """A path for `image_id` under an export folder; refuses ids that would escape it."""
    parts = image_id.split("/")
    if any(p in ("", ".", "..") or "\\" in p for p in parts):
        raise ConfigError(f"image id {image_id!r} cannot be used as a file name (empty, '.', '..' or '\\' parts)")
    return Path(*parts)


# Key spellings used by the ViLBERT LMDB dicts and MMF's `_info.npy`/LMDB dicts.
_ALIASES = {
    "image_h": ("image_h", "image_height"),
    "image_w": ("image_w", "image_width"),
    "boxes": ("boxes", "bbox"),
    "objects_id": ("objects_id", "objects"),
    "attrs_id": ("attrs_id", "attrs", "attributes"),
}


def _numeric(field: str, value) -> np.ndarray:
    """`value` as a numeric numpy array (a RowError for text, objects, ragged lists)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise RowError("bad array", f"field {field}: {err}") from err
    if arr.dtype.kind not in "fiu":
        raise RowError("bad array", f"field {field}: dtype {arr.dtype}, expected numbers")
    return arr


def _as_matrix(field: str, value, num: int, width: Optional[int]) -> np.ndarray:
    """A decoded float32 (num, width) array from a numpy array or a base64 string."""
    if isinstance(value, (str, bytes)):
        return decode_array(field, value, np.float32, num, width)
    arr = _numeric(field, value).astype(np.float32, copy=False)
    if arr.size == 0 or arr.size % num or (width is not None and arr.size != num * width):
        raise RowError("num_boxes mismatch", f"field {field}: {arr.size} values for num_boxes={num}")
    return arr.reshape(num, -1)


def _as_ids(field: str, value, num: int) -> np.ndarray:
    """(num,) int64 label ids from integers (or integral floats)."""
    arr = _numeric(field, value).reshape(-1)
    if arr.size != num:
        raise RowError("num_boxes mismatch", f"field {field}: {arr.size} values for num_boxes={num}")
    if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
        raise RowError("bad array", f"field {field}: ids must be integers")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise RowError("bad array", f"field {field}: ids beyond int64")
    return arr.astype(np.int64)


def _image_id(raw, default_id: str) -> str:
    if raw is None:
        return default_id
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise RowError("bad image id", f"not UTF-8: {raw[:40]!r} ({err.reason})") from None
    if isinstance(raw, (str, int, np.integer, np.str_)) and not isinstance(raw, (bool, np.bool_)):
        return str(raw)
    raise RowError("bad image id", f"a {type(raw).__name__}: {raw!r:.80}")


def record_from_dict(obj: dict, default_id: str, features=None, background: str = "auto") -> RegionFeatures:
    """Convert a legacy per-image dict (ViLBERT / MMF spellings) to a record.

    `features` overrides the dict's (MMF keeps them in a separate `.npy`). A 1-d
    `cls_prob` (MMF's frcnn script) is the objects' confidence vector; a 2-d one gets its
    background to column 0 as `background` says (`with_background_first`).
    Any bad value is a `RowError` (the row is skipped with the reason).
    """
    if not isinstance(obj, dict):
        raise RowError("not a dict", f"value is a {type(obj).__name__}")
    with row_errors():
        return _record_from_dict(obj, default_id, features, background)


def _record_from_dict(obj: dict, default_id: str, features, background: str) -> RegionFeatures:
    def pick(name: str):
        for key in _ALIASES.get(name, (name,)):
            if obj.get(key) is not None:
                return obj[key]
        return None

    image_id = _image_id(pick("image_id"), default_id)
    boxes_value, feats_value = pick("boxes"), pick("features") if features is None else features
    for name, value in (
        ("image_h", pick("image_h")),
        ("image_w", pick("image_w")),
        ("boxes", boxes_value),
        ("features", feats_value),
    ):
        if value is None:
            raise RowError("missing field", f"no {name}")
    num = pick("num_boxes")
    if num is not None:
        n = parse_int("num_boxes", num)
    elif isinstance(boxes_value, (str, bytes)):
        raise RowError("missing field", "no num_boxes for base64 boxes")
    else:
        n = int(_numeric("boxes", boxes_value).size // 4)
    if n < 1:
        raise RowError("bad num_boxes", f"num_boxes={n}")
    fields: dict = dict(
        image_id=image_id,
        image_h=parse_int("image_h", pick("image_h")),
        image_w=parse_int("image_w", pick("image_w")),
        boxes=_as_matrix("boxes", boxes_value, n, 4),
        features=_as_matrix("features", feats_value, n, None),
    )
    cls_prob = pick("cls_prob")
    if cls_prob is not None:
        cls_prob = (
            _as_matrix("cls_prob", cls_prob, n, None)
            if isinstance(cls_prob, (str, bytes))
            else _numeric("cls_prob", cls_prob)
        )
        if cls_prob.ndim == 1:
            fields["objects_conf"] = _as_matrix("cls_prob", cls_prob, n, 1).reshape(n)
        else:
            fields["cls_prob"] = with_background_first(_as_matrix("cls_prob", cls_prob, n, None), background)
    if pick("attr_prob") is not None:
        fields["attr_prob"] = _as_matrix("attr_prob", pick("attr_prob"), n, None)
    for ids, conf in (("objects_id", "objects_conf"), ("attrs_id", "attrs_conf")):
        if pick(ids) is not None:
            fields[ids] = _as_ids(ids, pick(ids), n)
            if pick(conf) is not None:
                fields[conf] = _as_matrix(conf, pick(conf), n, 1).reshape(n)
        if fields.get(ids) is not None and fields.get(conf) is None:
            if (ids == "objects_id" and "cls_prob" in fields) or (ids == "attrs_id" and "attr_prob" in fields):
                del fields[ids]  # derived from the probability table below
            else:
                raise RowError("missing field", f"{ids} without {conf}")
    return record_with_derived_labels(fields)
