"""Image shards: the format `vlprep download` writes, and the one reader for every kind
of image source the extractor accepts.

Our shards are Parquet files ``NNNNN.parquet`` (one row per source item, in input order,
failed items included) beside ``NNNNN_stats.json`` (written last: its presence marks the
shard complete). Columns (`IMAGE_SHARD_SCHEMA`, version `IMAGE_SHARD_VERSION`):

    image_id, url, path, split, source        the source item (url or path is null)
    texts: list<struct<kind, text>>           captions / questions / statements
    extra: string                             reader-specific fields, JSON object
    status: "ok" | "failed"
    error_kind, error: string                 the named reason and its detail (failed rows)
    transient: bool                           whether a retry may succeed (--retry-failed)
    image: binary                             the stored bytes (null for failed rows)
    format: jpeg|png|webp
    width, height                             of the stored image
    original_width, original_height           of the downloaded image (after EXIF rotation)
    sha256                                    of the stored bytes
    attempts, http_status, final_url          how it was fetched

`iter_images(source)` reads our shard folders, plain image folders, and img2dataset's
output (``files``: its default, shard folders of images beside metadata parquets;
webdataset ``.tar``; ``parquet``), yielding `ImageItem`s with the bytes.
"""

from __future__ import annotations

import json
import logging
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import distribute
from pipeline.distribute import STATS_SUFFIX, shard_name, stats_path
from pipeline.download.source_item import SourceItem, Text
from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json, commit_path, tmp_path_for
from pipeline.sources.base import replace_surrogates

log = logging.getLogger(__name__)
IMAGE_SHARD_VERSION = 1
IMAGE_SHARD_SCHEMA = pa.schema(
    [
        pa.field("image_id", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("path", pa.string()),
        pa.field("split", pa.string()),
        pa.field("source", pa.string()),
        pa.field("texts", pa.list_(pa.struct([("kind", pa.string()), ("text", pa.string())]))),
        pa.field("extra", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("error_kind", pa.string()),
        pa.field("error", pa.string()),
        pa.field("transient", pa.bool_()),
        pa.field("image", pa.binary()),
        pa.field("format", pa.string()),
        pa.field("width", pa.int32()),
        pa.field("height", pa.int32()),
        pa.field("original_width", pa.int32()),
        pa.field("original_height", pa.int32()),
        pa.field("sha256", pa.string()),
        pa.field("attempts", pa.int32()),
        pa.field("http_status", pa.int32()),
        pa.field("final_url", pa.string()),
    ],
    metadata={"vlprep.image_shard_version": str(IMAGE_SHARD_VERSION)},
)
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")  # of images in img2dataset output


def item_row(item: SourceItem) -> dict:
    """The source-item columns of a row."""
    return {
        "image_id": item.image_id,
        "url": item.url,
        "path": item.path,
        "split": item.split,
        "source": item.source,
        "texts": [{"kind": t.kind, "text": t.text} for t in item.texts],
        "extra": json.dumps(dict(item.extra)) if item.extra else None,
    }


def row_item(row: dict) -> SourceItem:
    """The source item a row was made from (for --retry-failed)."""
    return SourceItem(
        image_id=row["image_id"],
        url=row["url"],
        path=row["path"],
        split=row["split"] or "",
        source=row["source"] or "",
        texts=tuple(Text(t["kind"], t["text"]) for t in row["texts"] or ()),
        extra=tuple(json.loads(row["extra"]).items()) if row["extra"] else (),
    )


def write_shard(out: Path, number: int, rows: list[dict], stats: dict) -> None:
    """Write a complete shard: Parquet under a temporary name, renamed; then its stats
    file, last, which marks the shard done."""
    final = out / f"{shard_name(number)}.parquet"
    tmp = tmp_path_for(final)
    try:
        table = pa.Table.from_pylist(rows, schema=IMAGE_SHARD_SCHEMA)
    except UnicodeEncodeError:  # a file name with bytes that are not UTF-8: written with U+FFFD
        table = pa.Table.from_pylist([replace_surrogates(row) for row in rows], schema=IMAGE_SHARD_SCHEMA)
    # JPEG/PNG bytes do not compress: only the metadata columns are zstd-compressed.
    codecs = {name: ("none" if name == "image" else "zstd") for name in IMAGE_SHARD_SCHEMA.names}
    pq.write_table(table, tmp, compression=codecs, row_group_size=256)
    commit_path(tmp, final)
    atomic_write_json(stats_path(out, number), stats)


def read_shard_rows(path: Path) -> list[dict]:
    return pq.read_table(path, schema=IMAGE_SHARD_SCHEMA).to_pylist()


def done_shards(out: Path) -> dict[int, dict]:
    """Shard number -> stats, for every complete shard in `out` (done-marker and Parquet file)."""
    return distribute.done_shards(
        out,
        "shard stats (the shard's done-marker)",
        complete=lambda number: (out / f"{shard_name(number)}.parquet").is_file(),
    )


# ---------------------------------------------------------------------------
# Reading images from any supported source


@dataclass(frozen=True)
class ImageItem:
    image_id: str
    data: bytes
    texts: tuple[Text, ...] = ()
    meta: dict = field(default_factory=dict)


def iter_images(source: Path) -> Iterator[ImageItem]:
    """Successful images from our shard folder, an img2dataset output folder (files,
    webdataset tars or parquet), or a plain folder of image files. A file of the source
    that cannot be read (not Parquet, a broken tar) is a ConfigError naming the source."""
    source = Path(source)
    if not source.exists():
        raise ConfigError(f"image source not found: {source}")
    try:
        yield from _iter_images(source)
    except (OSError, EOFError, tarfile.TarError, pa.ArrowException) as err:
        raise ConfigError(f"image source {source}: cannot be read ({type(err).__name__}: {err})") from err


def _iter_images(source: Path) -> Iterator[ImageItem]:
    files = [source] if source.is_file() else sorted(source.iterdir())
    ours = [f for f in files if f.suffix == ".parquet" and _is_our_shard(f)]
    if ours:
        yield from _iter_our_shards(ours)
        return
    tars = [f for f in files if f.suffix == ".tar"]
    parquets = [f for f in files if f.suffix == ".parquet"]
    shard_folders = [f.with_suffix("") for f in parquets if f.with_suffix("").is_dir()]
    if tars:
        for tar in tars:
            yield from _iter_webdataset(tar)
    elif shard_folders:
        for folder in shard_folders:
            yield from _iter_img2dataset_files(folder)
    elif parquets:
        for parquet in parquets:
            yield from _iter_img2dataset_parquet(parquet)
    elif source.is_dir():
        from pipeline.datasets.folder import image_files

        for path in image_files(source):
            yield ImageItem(
                path.relative_to(source).with_suffix("").as_posix(), path.read_bytes(), meta={"path": str(path)}
            )
    else:
        raise ConfigError(f"{source}: not an image shard, img2dataset output or image folder")


def _is_our_shard(path: Path) -> bool:
    """A complete shard of ours: our schema marker, and its stats file (written last)."""
    meta = pq.read_schema(path).metadata or {}
    return b"vlprep.image_shard_version" in meta and (path.parent / f"{path.stem}{STATS_SUFFIX}").exists()


def _iter_our_shards(paths: list[Path]) -> Iterator[ImageItem]:
    for path in paths:
        pf = pq.ParquetFile(path)
        for batch in pf.iter_batches(batch_size=256):
            for row in batch.to_pylist():
                if row["status"] == "ok":
                    yield ImageItem(
                        row["image_id"],
                        row["image"],
                        tuple(Text(t["kind"], t["text"]) for t in row["texts"] or ()),
                        meta={
                            "url": row["url"],
                            "width": row["width"],
                            "height": row["height"],
                            "sha256": row["sha256"],
                        },
                    )


def _iter_webdataset(path: Path) -> Iterator[ImageItem]:
    """img2dataset webdataset: per sample <key>.jpg (or .png/.webp), <key>.txt, <key>.json."""
    with tarfile.open(path) as tar:
        current: Optional[str] = None
        parts: dict[str, bytes] = {}
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.rpartition(".")
            if key != current and current is not None:
                item = _webdataset_item(current, parts)
                if item:
                    yield item
                parts = {}
            current = key
            parts[ext] = tar.extractfile(member).read()
        if current is not None:
            item = _webdataset_item(current, parts)
            if item:
                yield item


def _iter_img2dataset_files(folder: Path) -> Iterator[ImageItem]:
    """img2dataset --output_format files (its default): a shard folder ``NNNNN/`` of
    <key>.jpg (or .png/.webp), <key>.txt (caption) and <key>.json (metadata) per
    successful sample, beside ``NNNNN.parquet`` (metadata only)."""
    for path in sorted(folder.iterdir()):
        if path.suffix.lower().lstrip(".") not in IMAGE_EXTENSIONS or not path.is_file():
            continue
        caption, meta_file = path.with_suffix(".txt"), path.with_suffix(".json")
        texts = (Text("caption", caption.read_text(encoding="utf-8", errors="replace")),) if caption.is_file() else ()
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8", errors="replace")) if meta_file.is_file() else {}
        except json.JSONDecodeError:
            log.warning("%s: not valid JSON; its image is read without metadata", meta_file)
            meta = {}
        yield ImageItem(path.stem, path.read_bytes(), texts, meta if isinstance(meta, dict) else {})


def _webdataset_item(key: str, parts: dict[str, bytes]) -> Optional[ImageItem]:
    data = next((parts[e] for e in IMAGE_EXTENSIONS if e in parts), None)
    if data is None:
        return None
    meta = json.loads(parts["json"]) if "json" in parts else {}
    texts = (Text("caption", parts["txt"].decode("utf-8", "replace")),) if "txt" in parts else ()
    return ImageItem(key.rsplit("/", 1)[-1], data, texts, meta)


def _iter_img2dataset_parquet(path: Path) -> Iterator[ImageItem]:
    """img2dataset --output_format parquet: columns key, jpg (bytes), caption, status, url, ..."""
    pf = pq.ParquetFile(path)
    names = set(pf.schema_arrow.names)
    if "key" not in names or not names & {"jpg", "png", "webp"}:
        raise ConfigError(f"{path}: not an img2dataset parquet shard (needs key and jpg/png/webp columns)")
    image_col = next(c for c in ("jpg", "png", "webp") if c in names)
    for batch in pf.iter_batches(batch_size=256):
        for row in batch.to_pylist():
            if row.get("status", "success") == "success" and row[image_col]:
                caption = row.get("caption")
                texts = (Text("caption", caption),) if caption else ()
                yield ImageItem(str(row["key"]), row[image_col], texts, {"url": row.get("url")})
