"""A Hugging Face dataset: Parquet shards plus the dataset card, as the Hub and `datasets` read them.

Export writes a folder::

    README.md                               the dataset card (pipeline.formats.card): YAML header with
                                            configs / data_files, dataset_info (features, splits,
                                            sizes), license, size category; the provenance below it
    data/<split>-00000-of-0000N.parquet     one row per image, shards of at most --option
                                            shard-bytes (default 500MB of uncompressed data, the
                                            size `datasets`' push_to_hub shards by)

Columns (one row per image; the label and probability columns are null where a record has none,
the probability columns present when the store keeps those tables)::

    image_id string, image_h int32, image_w int32, num_boxes int32,
    boxes     list<fixed_size_list<float32>[4]>        x1, y1, x2, y2 in original pixels
    features  list<fixed_size_list<float16|float32>[D]>   (arrays=list: list<list<...>>)
    objects_id list<int32>, objects_conf list<float32>, attrs_id list<int32>, attrs_conf list<float32>
    cls_prob  list<fixed_size_list<...>[C]>            background at column 0
    attr_prob list<fixed_size_list<...>[A]>

The features and tables keep the store's dtype (float16 by default; ``dtype=float32`` widens them).
Each file's schema metadata ``vlprep`` holds the store's schema version, layout and provenance, so
a shard describes itself; ``datasets.load_dataset("parquet", data_files=...)`` and the folder
loader read the folder as it is.

Import takes the folder (or Parquet files). Before any row is read every file's footer is read:
a file that is no Parquet file or is truncated is a `FormatDataError`, one without the columns
above (or of other types) a `ConfigError`; the card, when there is one, must agree with the data
(files, their rows and sizes, records, layout, identity, the features and split sizes the Hub
reads), else a `FormatDataError` (nothing imported). Rows are then streamed a few at a time (a
100 GB export never sits in memory); a row whose arrays do not agree with its ``num_boxes`` is
skipped by name.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.errors import ConfigError
from pipeline.formats.base import (
    Description,
    FormatDataError,
    ReadOptions,
    ReadResult,
    Row,
    RowError,
    Skipped,
    WriteContext,
)
from pipeline.formats.card import (
    CARD_VERSION,
    RegionCounts,
    check_same,
    disagreement,
    imported_provenance,
    options_license,
    read_card,
    render_card,
)
from pipeline.formats.options import EXPORT, FormatOptions, byte_size, human_size, option, split_name
from pipeline.io import sha256_file
from pipeline.records import REGION_SCHEMA_VERSION, RegionFeatures
from pipeline.store.layout import StoreLayout
from pipeline.store.manifest import IDENTITY_KEYS

log = logging.getLogger(__name__)
NAME = "hf-dataset"
CARD = "README.md"
DATA = "data"
META_KEY = b"vlprep"
DEFAULT_SHARD_BYTES = 500 * 10**6  # datasets' config.MAX_SHARD_SIZE: push_to_hub's default shards
DEFAULT_ROW_GROUP_BYTES = 64 * 2**20
READ_BATCH_ROWS = 16  # rows a reader decodes at a time (of the row group it holds)
LABEL_COLUMNS = {"objects_id": pa.int32(), "objects_conf": pa.float32(), "attrs_id": pa.int32()}
LABEL_COLUMNS["attrs_conf"] = pa.float32()
TABLES = ("cls_prob", "attr_prob")
LAYOUT_KEYS = ("backend", "dtype", "feature_dim", "cls_prob", "attr_prob", "regions")  # what an import takes


@dataclass(frozen=True)
class HfOptions(FormatOptions):
    shard_bytes: int = option(
        DEFAULT_SHARD_BYTES,
        "the most uncompressed bytes of rows a Parquet shard holds (as datasets' max_shard_size)",
        when=EXPORT,
        parse=byte_size,
        show=human_size,
    )
    row_group_bytes: int = option(
        DEFAULT_ROW_GROUP_BYTES,
        "the most uncompressed bytes a row group holds (what a reader holds at once)",
        when=EXPORT,
        parse=byte_size,
        show=human_size,
    )
    arrays: str = option(
        "fixed",
        "per-region arrays as fixed-size lists (datasets' List(..., length=D)) or plain nested lists",
        when=EXPORT,
        choices=("fixed", "list"),
    )
    dtype: str = option(
        "store",
        "features and tables in the store's dtype, or widened to float32",
        when=EXPORT,
        choices=("store", "float32"),
    )
    compression: str = option(
        "snappy", "Parquet compression codec", when=EXPORT, choices=("none", "snappy", "zstd", "gzip")
    )
    split: str = option("train", "the split the card declares (the files' name prefix)", when=EXPORT, parse=split_name)
    license: Optional[str] = option(
        None,
        "the card's license identifier (default: the store's, or its dataset manifest's)",
        when=EXPORT,
        parse=options_license,
    )


# -- schema ---------------------------------------------------------------------------------------


def _region_list(value: pa.DataType, width: int, fixed: bool) -> pa.DataType:
    return pa.list_(pa.list_(value, width) if fixed else pa.list_(value))


def export_schema(layout: StoreLayout, provenance: dict, options: HfOptions) -> pa.Schema:
    wide = pa.float32() if options.dtype == "float32" else pa.from_numpy_dtype(layout.np_dtype)
    fixed = options.arrays == "fixed"
    fields = [
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("image_h", pa.int32(), nullable=False),
        pa.field("image_w", pa.int32(), nullable=False),
        pa.field("num_boxes", pa.int32(), nullable=False),
        pa.field("boxes", _region_list(pa.float32(), 4, fixed), nullable=False),
        pa.field("features", _region_list(wide, layout.feature_dim, fixed), nullable=False),
    ]
    fields += [pa.field(name, pa.list_(kind)) for name, kind in LABEL_COLUMNS.items()]
    for name in TABLES:
        dim = layout.prob_dim(name)
        if layout.prob(name).mode != "none" and dim is not None:
            fields.append(pa.field(name, _region_list(wide, dim, fixed)))
    meta = {"schema_version": REGION_SCHEMA_VERSION, "layout": layout.to_json(), "provenance": provenance}
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta, sort_keys=True).encode()})


def hub_feature(kind: pa.DataType):
    """How datasets (4 and later) spells an Arrow type in a card's dataset_info features."""
    if pa.types.is_fixed_size_list(kind):
        return {"list": hub_feature(kind.value_type), "length": kind.list_size}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return {"list": hub_feature(kind.value_type)}
    names = {pa.string(): "string", pa.large_string(): "large_string", pa.float16(): "float16"}
    names.update({pa.float32(): "float32", pa.float64(): "float64", pa.int32(): "int32", pa.int64(): "int64"})
    if kind not in names:
        raise ConfigError(f"no Hugging Face feature type for Arrow type {kind}")
    return names[kind]


def hub_features(schema: pa.Schema) -> list[dict]:
    out = []
    for f in schema:
        spelled = hub_feature(f.type)
        out.append({"name": f.name, **({"dtype": spelled} if isinstance(spelled, str) else spelled)})
    return out


# -- export ---------------------------------------------------------------------------------------


def _lists(parts: list[Optional[np.ndarray]], width: Optional[int], value: pa.DataType, fixed: bool) -> pa.Array:
    """A list<(fixed_size_)list<value>[width]> (width None: list<value>) of per-record arrays,
    null where a record has none."""
    present = [p for p in parts if p is not None]
    dtype = value.to_pandas_dtype()
    flat = np.concatenate([np.asarray(p, dtype).reshape(-1) for p in present]) if present else np.zeros(0, dtype)
    lengths = np.array([0 if p is None else len(p) for p in parts], np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    values = pa.array(flat, value)
    if width is not None:
        if fixed:
            values = pa.FixedSizeListArray.from_arrays(values, width)
        else:
            inner = pa.array(np.arange(0, len(flat) + 1, width, dtype=np.int32))
            values = pa.ListArray.from_arrays(inner, values)
    mask = pa.array([p is None for p in parts]) if len(present) < len(parts) else None
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def _table(records: list[RegionFeatures], schema: pa.Schema) -> pa.Table:
    fixed = pa.types.is_fixed_size_list(schema.field("boxes").type.value_type)
    columns = {
        "image_id": pa.array([r.image_id for r in records], pa.string()),
        "image_h": pa.array([r.image_h for r in records], pa.int32()),
        "image_w": pa.array([r.image_w for r in records], pa.int32()),
        "num_boxes": pa.array([r.num_boxes for r in records], pa.int32()),
    }
    for f in schema:
        if f.name in columns:
            continue
        kind = f.type.value_type
        if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind):
            width = kind.list_size if fixed else (4 if f.name == "boxes" else None)
            if width is None:  # plain nested lists: the width of the first record holding the field
                width = next((getattr(r, f.name).shape[1] for r in records if getattr(r, f.name) is not None), 1)
            columns[f.name] = _lists([getattr(r, f.name) for r in records], width, kind.value_type, fixed)
        else:
            columns[f.name] = _lists([getattr(r, f.name) for r in records], None, kind, fixed)
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def _record_bytes(rec: RegionFeatures) -> int:
    return sum(a.nbytes for a in rec.array_fields().values()) + len(rec.image_id) + 16


class _Shards:
    """Parquet shards of at most `shard_bytes` (uncompressed) under `folder`, named
    ``<split>-NNNNN.parquet`` while written and ``<split>-NNNNN-of-MMMMM.parquet`` when done."""

    def __init__(self, folder: Path, schema: pa.Schema, options: HfOptions):
        self.folder, self.schema, self.options = folder, schema, options
        self.files: list[dict] = []
        self.writer: Optional[pq.ParquetWriter] = None
        self.current_bytes = 0
        self.total_bytes = 0

    def _open(self) -> None:
        path = self.folder / f"{self.options.split}-{len(self.files):05d}.parquet"
        # no dictionary pages (float arrays never repeat; trying costs most of the write time) and
        # statistics only of the per-image columns (what a filter on image_id / sizes uses)
        self.writer = pq.ParquetWriter(
            path,
            self.schema,
            compression=self.options.compression,
            use_dictionary=False,
            write_statistics=["image_id", "image_h", "image_w", "num_boxes"],
        )
        self.files.append({"path": path, "rows": 0})
        self.current_bytes = 0

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def write(self, records: list[RegionFeatures]) -> None:
        table = _table(records, self.schema)
        size = table.nbytes
        if self.writer is not None and self.current_bytes and self.current_bytes + size > self.options.shard_bytes:
            self._close()
        if self.writer is None:
            self._open()
        self.writer.write_table(table, row_group_size=max(len(records), 1))
        self.files[-1]["rows"] += len(records)
        self.current_bytes += size
        self.total_bytes += size

    def finish(self) -> list[dict]:
        """Close the last shard, give every shard its final name; (name, rows, bytes, sha256) each."""
        if not self.files:
            self._open()  # an empty store: one empty shard, so the dataset still loads
        self._close()
        out = []
        for i, entry in enumerate(self.files):
            final = entry["path"].with_name(f"{self.options.split}-{i:05d}-of-{len(self.files):05d}.parquet")
            entry["path"].rename(final)
            out.append(
                {
                    "name": f"{DATA}/{final.name}",
                    "rows": entry["rows"],
                    "bytes": final.stat().st_size,
                    "sha256": sha256_file(final),
                }
            )
        return out


def write_hf_dataset(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    options: HfOptions = ctx.options  # type: ignore[assignment]
    manifest = ctx.manifest
    schema = export_schema(manifest.layout, manifest.provenance, options)
    (dest / DATA).mkdir(parents=True)
    shards = _Shards(dest / DATA, schema, options)
    counts = RegionCounts()
    batch: list[RegionFeatures] = []
    batch_bytes = 0
    group_bytes = min(options.row_group_bytes, options.shard_bytes)  # a row group never spans two shards
    for rec in records:
        size = _record_bytes(rec)
        if batch and batch_bytes + size > group_bytes:
            shards.write(batch)
            batch, batch_bytes = [], 0
        batch.append(rec)
        batch_bytes += size
        counts.add(rec.num_boxes)
    if batch:
        shards.write(batch)
    files = shards.finish()
    metadata = card_metadata_for(schema, files, shards.total_bytes, counts.images, options)
    name = ctx.store.resolve().name if ctx.store is not None else "features"
    text = render_card(
        manifest,
        name=name,
        export=NAME,
        command=ctx.command,
        metadata=metadata,
        counts=counts,
        license=options.license,
    )
    (dest / CARD).write_text(text, encoding="utf-8")
    return counts.images


def card_metadata_for(schema: pa.Schema, files: list[dict], num_bytes: int, count: int, options: HfOptions) -> dict:
    """The header keys the Hub reads for these shards, and the files the vlprep block lists."""
    return {
        "configs": [
            {"config_name": "default", "data_files": [{"split": options.split, "path": f"{DATA}/{options.split}-*"}]}
        ],
        "dataset_info": {
            "features": hub_features(schema),
            "splits": [{"name": options.split, "num_bytes": num_bytes, "num_examples": count}],
            "download_size": sum(f["bytes"] for f in files),
            "dataset_size": num_bytes,
        },
        "vlprep": {"files": files},
    }


# -- import ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """The files an import reads and what the card (if any) and the files' metadata say."""

    files: list[Path]
    card: Optional[object]  # pipeline.formats.card.Card
    meta: Optional[dict]  # the first file's vlprep metadata


def _parquet_files(paths: Sequence[Path]) -> tuple[list[Path], Optional[Path]]:
    files: list[Path] = []
    card = None
    for path in paths:
        if path.is_dir():
            found = path.rglob("*.parquet")
            files += sorted(p for p in found if not any(part.startswith(".") for part in p.relative_to(path).parts))
            if (path / CARD).is_file():
                if card is not None:
                    raise ConfigError(f"{NAME}: give one export folder (two cards: {card}, {path / CARD})")
                card = path / CARD
        elif path.suffix == ".parquet":
            files.append(path)
        elif path.name == CARD:
            card = path
        else:
            raise ConfigError(f"{path}: {NAME} reads Parquet files, an export folder, or its README.md card")
    if not files:
        raise ConfigError(f"{NAME}: no .parquet file among the sources ({', '.join(map(str, paths))})")
    return files, card


def _open(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise FormatDataError(
            f"{path}: not a readable Parquet file (truncated, or not Parquet at all): {err}; nothing imported"
        ) from None


def _check_schema(path: Path, schema: pa.Schema) -> None:
    """A ConfigError naming the file and the column when the schema is not one this format writes."""

    def want(name: str, ok, expected: str, required: bool = True) -> None:
        if name not in schema.names:
            if required:
                raise ConfigError(f"{path}: {NAME} needs a column {name!r} ({expected}); the file has {schema.names}")
            return
        if not ok(schema.field(name).type):
            raise ConfigError(f"{path}: column {name!r} is {schema.field(name).type}, expected {expected}")

    def regions(kind, floats=True) -> bool:
        if not pa.types.is_list(kind):
            return False
        inner = kind.value_type
        if not (pa.types.is_fixed_size_list(inner) or pa.types.is_list(inner)):
            return False
        return pa.types.is_floating(inner.value_type) if floats else True

    want("image_id", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string")
    for name in ("image_h", "image_w", "num_boxes"):
        want(name, pa.types.is_integer, "an integer")
    for name in ("boxes", "features"):
        want(name, regions, "a list of float lists (one per region)")
    for name in TABLES:
        want(name, regions, "a list of float lists (one per region)", required=False)
    for name, kind in LABEL_COLUMNS.items():
        number = pa.types.is_integer if kind == pa.int32() else pa.types.is_floating
        want(name, lambda t, number=number: pa.types.is_list(t) and number(t.value_type), f"list<{kind}>", False)


def _metadata(path: Path, schema: pa.Schema) -> Optional[dict]:
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise FormatDataError(f"{path}: its vlprep metadata is not readable JSON ({err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("layout"), dict):
        raise FormatDataError(f"{path}: its vlprep metadata holds no layout")
    return meta


def _inspect(paths: Sequence[Path]) -> _Source:
    """Every file's footer and schema (and the card against them), before any row is read."""
    files, card_path = _parquet_files(paths)
    footers = {}
    meta = None
    for path in files:
        pf = _open(path)
        schema = pf.schema_arrow
        _check_schema(path, schema)
        here = _metadata(path, schema)
        if meta is None:
            meta = here
        elif here is not None and here != meta:
            raise FormatDataError(f"{path}: its vlprep metadata (layout, provenance) differs from {files[0].name}'s")
        footers[path] = (pf.metadata.num_rows, schema)
    card = read_card(card_path) if card_path is not None else None
    if card is not None:
        _check_card(card, card_path.parent, files, footers, meta)
    return _Source(files, card, meta)


def _check_card(card, root: Path, files: list[Path], footers: dict, meta: Optional[dict]) -> None:
    """The card's claims against the files: which files, their rows and bytes, the records, the
    layout and identity (against the files' metadata), the features and split sizes the Hub reads."""
    where = card.path
    block = card.vlprep
    check_same(where, "card version", block.get("card"), CARD_VERSION)
    check_same(where, "format", block.get("format"), NAME)
    listed = block.get("files")
    if not isinstance(listed, list) or not all(isinstance(f, dict) and "name" in f for f in listed):
        raise FormatDataError(f"{where}: the card's vlprep block lists no files")
    names = {str(f.relative_to(root)) if f.is_relative_to(root) else str(f): f for f in files}
    check_same(where, "the data files", sorted(f["name"] for f in listed), sorted(names))
    for entry in listed:
        path = names[entry["name"]]
        size = path.stat().st_size
        if size != entry.get("bytes"):
            state = "truncated" if isinstance(entry.get("bytes"), int) and size < entry["bytes"] else "changed"
            raise FormatDataError(
                f"{path}: {state}: {size:,} bytes on disk, the card says {entry.get('bytes')!r}; nothing imported"
            )
        check_same(where, f"rows of {entry['name']}", entry.get("rows"), footers[path][0])
    rows = sum(n for n, _ in footers.values())
    check_same(where, "records", block.get("records"), rows)
    if meta is not None:
        check_same(where, "layout", block.get("layout"), meta["layout"])
        ident = {k: (meta.get("provenance") or {}).get(k) for k in IDENTITY_KEYS}
        check_same(where, "identity (detector, weights sha256, box policy)", block.get("identity"), ident)
    info = card.metadata.get("dataset_info")
    if not isinstance(info, dict):
        raise FormatDataError(f"{where}: the card has no dataset_info")
    schema = footers[files[0]][1].remove_metadata()
    check_same(where, "dataset_info features", info.get("features"), hub_features(schema))
    splits = info.get("splits")
    counted = sum(s.get("num_examples", 0) for s in splits) if isinstance(splits, list) else None
    if counted != rows:
        raise disagreement(where, "dataset_info split sizes (num_examples)", counted, rows)


def hf_describe(paths: Sequence[Path], opts: ReadOptions) -> Description:
    """Every file's footer and schema, and the card against them (before any row); the store
    settings the export states (else what the schema shows) and the exporting store's provenance."""
    source = _inspect(paths)
    if source.meta is not None:
        layout = {k: source.meta["layout"][k] for k in LAYOUT_KEYS if k in source.meta["layout"]}
    else:
        inner = _open(source.files[0]).schema_arrow.field("features").type.value_type
        layout = {"dtype": "float16" if inner.value_type == pa.float16() else "float32"}
        if pa.types.is_fixed_size_list(inner):
            layout["feature_dim"] = inner.list_size
    license_ = source.card.metadata.get("license") if source.card is not None else None
    provenance = imported_provenance((source.meta or {}).get("provenance"), license_) if source.meta else {}
    if license_ not in (None, "", "unknown") and not source.meta:
        provenance["license"] = license_
    return Description(layout=layout, provenance=provenance, checked=source.card is not None)


@dataclass(frozen=True)
class _Lists:
    """A batch's list column as numpy: per-row region offsets, the flat values, and how a region's
    values are found (a fixed width, or per-region offsets), with the nulls."""

    offsets: np.ndarray  # rows + 1, into the regions
    values: np.ndarray  # every value, flat
    width: Optional[int]  # values per region (fixed-size lists)
    inner: Optional[np.ndarray]  # per-region offsets into `values` (nested plain lists)
    valid: Optional[np.ndarray]  # per value, when some value is null
    rows_valid: Optional[np.ndarray]  # per row, when some row is null


def _column(batch: pa.RecordBatch, name: str) -> Optional[_Lists]:
    if name not in batch.schema.names:
        return None
    col = batch.column(name)
    child = col.values  # the whole child: `offsets` index it
    width = inner = None
    if pa.types.is_fixed_size_list(child.type):
        width, leaf = child.type.list_size, child.flatten()
    elif pa.types.is_list(child.type):
        inner, leaf = child.offsets.to_numpy(), child.values
    else:
        leaf = child
    return _Lists(
        offsets=col.offsets.to_numpy(),
        values=leaf.to_numpy(zero_copy_only=False),
        width=width,
        inner=inner,
        valid=leaf.is_valid().to_numpy(zero_copy_only=False) if leaf.null_count else None,
        rows_valid=col.is_valid().to_numpy(zero_copy_only=False) if col.null_count else None,
    )


def _regions(lists: _Lists, row: int, name: str, n: int, want_width: Optional[int] = None) -> Optional[np.ndarray]:
    """Row `row`'s values of a column: (n, width), or (n,) for a flat list; None when null."""
    if lists.rows_valid is not None and not lists.rows_valid[row]:
        return None
    start, stop = int(lists.offsets[row]), int(lists.offsets[row + 1])
    if stop - start != n:
        raise RowError("num_boxes mismatch", f"field {name}: {stop - start} entries for num_boxes={n}")
    if lists.width is not None:
        lo, hi, shape = start * lists.width, stop * lists.width, (n, lists.width)
    elif lists.inner is not None:
        lengths = np.diff(lists.inner[start : stop + 1])
        if (lengths != lengths[0]).any():
            raise RowError("ragged rows", f"field {name}: regions of different widths")
        lo, hi, shape = int(lists.inner[start]), int(lists.inner[stop]), (n, int(lengths[0]))
    else:
        lo, hi, shape = start, stop, (n,)
    if lists.valid is not None and not lists.valid[lo:hi].all():
        raise RowError("null value", f"field {name}: a null among its values")
    out = lists.values[lo:hi].reshape(shape)
    if want_width is not None and out.shape[1] != want_width:
        raise RowError("bad array", f"field {name}: {out.shape[1]} values a region, expected {want_width}")
    return out


def _decode_batch(path: Path, batch: pa.RecordBatch, first_row: int) -> Iterator[ReadResult]:
    ids = batch.column("image_id").to_pylist()
    sizes = {n: batch.column(n).to_numpy(zero_copy_only=False) for n in ("image_h", "image_w", "num_boxes")}
    required = ("image_h", "image_w", "num_boxes", "boxes", "features")
    nulls = {
        n: batch.column(n).is_valid().to_numpy(zero_copy_only=False) for n in required if batch.column(n).null_count
    }
    columns = {name: _column(batch, name) for name in ("boxes", "features", *LABEL_COLUMNS, *TABLES)}
    for row, image_id in enumerate(ids):
        location = f"{path.name}:row {first_row + row}"
        try:
            if image_id is None or any(not valid[row] for valid in nulls.values()):
                raise RowError("null value", "image_id, a size, num_boxes, boxes or features is null")
            n = int(sizes["num_boxes"][row])
            if n < 1:
                raise RowError("bad num_boxes", f"num_boxes={n}")
            fields = dict(
                image_id=image_id,
                image_h=int(sizes["image_h"][row]),
                image_w=int(sizes["image_w"][row]),
                boxes=np.asarray(_regions(columns["boxes"], row, "boxes", n, 4), np.float32),
                features=_regions(columns["features"], row, "features", n),
            )
            for name in (*LABEL_COLUMNS, *TABLES):
                if columns[name] is not None:
                    fields[name] = _regions(columns[name], row, name, n)
            yield Row(location, RegionFeatures(**fields))
        except RowError as err:
            yield Skipped(location, err.kind, err.detail)
        except (TypeError, ValueError, OverflowError) as err:
            yield Skipped(location, "bad value", f"{type(err).__name__}: {err}")


def read_hf_dataset(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    """The rows of every file, one row group at a time (read whole, single-threaded: pyarrow's batch
    reader holds far more of a file of nested lists), a few rows decoded at a time."""
    source = _inspect(paths)
    for path in source.files:
        pf = _open(path)
        first = 0
        for group in range(pf.metadata.num_row_groups):
            try:
                table = pf.read_row_group(group, use_threads=False)
            except (pa.ArrowInvalid, OSError) as err:
                raise FormatDataError(f"{path}: row group {group} (from row {first}) is damaged: {err}") from None
            for batch in table.to_batches(max_chunksize=READ_BATCH_ROWS):
                yield from _decode_batch(path, batch, first)
                first += batch.num_rows
            del table


HF_FIELDS = {
    "image_id": "image_id",
    "image_h": "image_h",
    "image_w": "image_w",
    "boxes": "boxes (list of [4])",
    "features": "features (list of [D])",
    "objects_id": "objects_id",
    "objects_conf": "objects_conf",
    "attrs_id": "attrs_id",
    "attrs_conf": "attrs_conf",
    "cls_prob": "cls_prob (list of [C])",
    "attr_prob": "attr_prob (list of [A])",
}
