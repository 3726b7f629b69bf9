"""WebDataset: POSIX tar shards, one sample per image, as the `webdataset` library (and img2dataset's
output, OpenCLIP-style training, the Hub's WebDataset viewer) reads them.

Export writes a folder::

    README.md                   the dataset card (pipeline.formats.card); its header's configs point
                                the Hub at the shards, its vlprep block lists them
    <split>-000000.tar ...      shards of at most --option shard-bytes (default 1GB, the size the
                                Hub's WebDataset guide names)

Each shard starts with a ``__vlprep__`` member (the store's schema version, layout and provenance
as JSON; `webdataset` and `datasets` skip ``__...__`` names), then per image, in storage order::

    <key>.json              {"image_id", "image_h", "image_w", "num_boxes"}
    <key>.boxes.npy         float32 (N, 4), x1 y1 x2 y2 in original pixels
    <key>.features.npy      (N, D), the store's dtype (``dtype=float32`` widens)
    <key>.objects_id.npy    int32 (N,)   and objects_conf, attrs_id, attrs_conf (float32 / int32)
    <key>.cls_prob.npy      (N, C), background at column 0   and attr_prob, where the record has them

The key is the image id made safe for WebDataset, which splits a member name at its first dot and
takes a leading ``__`` for metadata: every byte of the id's UTF-8 other than ASCII letters, digits,
``-`` and ``_`` (and a leading ``_``) is written ``%XX``, so ``COCO_val2014_000000000042`` stays as
it is and ``a.b/c`` becomes ``a%2Eb%2Fc``; `decode_key` reverses it. The id is in the JSON too, and an
import checks that the two agree.

Import takes the folder (or tar files). Before any sample is read each shard must end with tar's
end-of-archive blocks (a truncated shard is a `FormatDataError`, nothing imported) and the card, when
there is one, must agree with the shards it lists; samples are then streamed one at a time. A
sample without its JSON, boxes or features, or with an array that is not a plain numeric ``.npy``
(pickled object arrays are refused), is skipped by name.
"""

from __future__ import annotations

import io
import json
import logging
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np

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
    parse_int,
)
from pipeline.formats.card import (
    CARD_VERSION,
    RegionCounts,
    check_same,
    imported_provenance,
    options_license,
    read_card,
    render_card,
)
from pipeline.formats.options import EXPORT, FormatOptions, byte_size, human_size, option, split_name
from pipeline.io import sha256_file
from pipeline.records import OPTIONAL_ARRAYS, PROB_FIELDS, REGION_SCHEMA_VERSION, RegionFeatures
from pipeline.store.manifest import IDENTITY_KEYS

log = logging.getLogger(__name__)
NAME = "webdataset"
CARD = "README.md"
META_MEMBER = "__vlprep__"
DEFAULT_SHARD_BYTES = 10**9
BLOCK = 512
LAYOUT_KEYS = ("backend", "dtype", "feature_dim", "cls_prob", "attr_prob", "regions")  # what an import takes
ARRAYS = ("boxes", "features") + OPTIONAL_ARRAYS
_SAFE = re.compile(rb"[A-Za-z0-9_-]")
WDS_FIELDS = {
    "image_id": "<key>.json image_id (and the key)",
    "image_h": "<key>.json image_h",
    "image_w": "<key>.json image_w",
    "boxes": "<key>.boxes.npy",
    "features": "<key>.features.npy",
    **{name: f"<key>.{name}.npy" for name in OPTIONAL_ARRAYS},
}


@dataclass(frozen=True)
class WdsOptions(FormatOptions):
    shard_bytes: int = option(
        DEFAULT_SHARD_BYTES,
        "the most bytes a tar shard holds (a sample is never split)",
        when=EXPORT,
        parse=byte_size,
        show=human_size,
    )
    dtype: str = option(
        "store",
        "features and tables in the store's dtype, or widened to float32",
        when=EXPORT,
        choices=("store", "float32"),
    )
    split: str = option("train", "the split the card declares (the shards' name prefix)", when=EXPORT, parse=split_name)
    license: Optional[str] = option(
        None,
        "the card's license identifier (default: the store's, or its dataset manifest's)",
        when=EXPORT,
        parse=options_license,
    )


def encode_key(image_id: str) -> str:
    """A WebDataset key for `image_id`: reversible, no dot, no slash, no leading underscore."""
    out = []
    for i, byte in enumerate(image_id.encode("utf-8")):
        char = bytes([byte])
        out.append(char.decode() if _SAFE.fullmatch(char) and not (i == 0 and char == b"_") else f"%{byte:02X}")
    return "".join(out)


def decode_key(key: str) -> str:
    """The image id of a key `encode_key` wrote; ValueError for a key it cannot have written."""
    raw = bytearray()
    i = 0
    while i < len(key):
        if key[i] == "%":
            if not re.fullmatch(r"[0-9A-F]{2}", key[i + 1 : i + 3]):
                raise ValueError(f"key {key!r}: a '%' not followed by two hex digits")
            raw.append(int(key[i + 1 : i + 3], 16))
            i += 3
        else:
            raw += key[i].encode("utf-8")
            i += 1
    return raw.decode("utf-8")


# -- export ---------------------------------------------------------------------------------------


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _members(rec: RegionFeatures, widen: bool) -> list[tuple[str, bytes]]:
    key = encode_key(rec.image_id)
    meta = {"image_id": rec.image_id, "image_h": int(rec.image_h), "image_w": int(rec.image_w)}
    meta["num_boxes"] = rec.num_boxes
    out = [(f"{key}.json", json.dumps(meta, ensure_ascii=False).encode("utf-8"))]
    for name in ARRAYS:
        value = getattr(rec, name)
        if value is None:
            continue
        if widen and name in ("features", *PROB_FIELDS):
            value = np.asarray(value, np.float32)
        out.append((f"{key}.{name}.npy", _npy(value)))
    return out


class _TarShards:
    def __init__(self, folder: Path, options: WdsOptions, meta: bytes):
        self.folder, self.options, self.meta = folder, options, meta
        self.files: list[dict] = []
        self.tar: Optional[tarfile.TarFile] = None
        self.raw = None

    def _open(self) -> None:
        path = self.folder / f"{self.options.split}-{len(self.files):06d}.tar"
        self.raw = open(path, "wb")
        self.tar = tarfile.open(fileobj=self.raw, mode="w", format=tarfile.PAX_FORMAT)
        _add(self.tar, META_MEMBER, self.meta)
        self.files.append({"path": path, "samples": 0})

    def _close(self) -> None:
        if self.tar is not None:
            self.tar.close()
            self.raw.close()
            self.tar = self.raw = None

    def add(self, members: list[tuple[str, bytes]]) -> None:
        size = sum(BLOCK + -(-len(data) // BLOCK) * BLOCK for _, data in members)
        if self.tar is not None and self.files[-1]["samples"] and self.raw.tell() + size > self.options.shard_bytes:
            self._close()
        if self.tar is None:
            self._open()
        for name, data in members:
            _add(self.tar, name, data)
        self.files[-1]["samples"] += 1

    def finish(self) -> list[dict]:
        if not self.files:
            self._open()  # an empty store: one shard of metadata alone
        self._close()
        return [
            {
                "name": f["path"].name,
                "samples": f["samples"],
                "bytes": f["path"].stat().st_size,
                "sha256": sha256_file(f["path"]),
            }
            for f in self.files
        ]


def write_wds(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    options: WdsOptions = ctx.options  # type: ignore[assignment]
    manifest = ctx.manifest
    dest.mkdir(parents=True)
    meta = {"schema_version": REGION_SCHEMA_VERSION, "layout": manifest.layout.to_json()}
    meta["provenance"] = manifest.provenance
    shards = _TarShards(dest, options, json.dumps(meta, sort_keys=True).encode("utf-8"))
    counts = RegionCounts()
    for rec in records:
        shards.add(_members(rec, options.dtype == "float32"))
        counts.add(rec.num_boxes)
    files = shards.finish()
    metadata = {
        "configs": [
            {"config_name": "default", "data_files": [{"split": options.split, "path": f"{options.split}-*.tar"}]}
        ],
        "vlprep": {"files": files},
    }
    name = ctx.store.resolve().name if ctx.store is not None else "features"
    card = render_card(
        manifest,
        name=name,
        export=NAME,
        command=ctx.command,
        metadata=metadata,
        counts=counts,
        license=options.license,
    )
    (dest / CARD).write_text(card, encoding="utf-8")
    return counts.images


# -- import ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    shards: list[Path]
    card: Optional[object]


def _tar_files(paths: Sequence[Path]) -> tuple[list[Path], Optional[Path]]:
    shards: list[Path] = []
    card = None
    for path in paths:
        if path.is_dir():
            shards += sorted(p for p in path.iterdir() if p.suffix == ".tar" and not p.name.startswith("."))
            if (path / CARD).is_file():
                if card is not None:
                    raise ConfigError(f"{NAME}: give one export folder (two cards: {card}, {path / CARD})")
                card = path / CARD
        elif path.suffix == ".tar":
            shards.append(path)
        elif path.name == CARD:
            card = path
        else:
            raise ConfigError(f"{path}: {NAME} reads .tar shards, an export folder, or its README.md card")
    if not shards:
        raise ConfigError(f"{NAME}: no .tar shard among the sources ({', '.join(map(str, paths))})")
    return shards, card


def _check_complete(path: Path) -> None:
    """A FormatDataError unless the shard ends as tar ends an archive: whole 512-byte blocks, the
    last two of them zero (a shard cut short, or not a tar at all, does not)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(size - 2 * BLOCK, 0))
        tail = f.read()
    if size < 2 * BLOCK or size % BLOCK or tail.count(0) != len(tail):
        raise FormatDataError(
            f"{path}: truncated (or not a tar file): {size:,} bytes, without tar's end-of-archive blocks; "
            "nothing imported"
        )


def _inspect(paths: Sequence[Path]) -> _Source:
    shards, card_path = _tar_files(paths)
    for path in shards:
        _check_complete(path)
    card = read_card(card_path) if card_path is not None else None
    if card is not None:
        block = card.vlprep
        check_same(card.path, "card version", block.get("card"), CARD_VERSION)
        check_same(card.path, "format", block.get("format"), NAME)
        listed = block.get("files")
        if not isinstance(listed, list) or not all(isinstance(f, dict) and "name" in f for f in listed):
            raise FormatDataError(f"{card.path}: the card's vlprep block lists no shards")
        check_same(card.path, "the shards", sorted(f["name"] for f in listed), sorted(p.name for p in shards))
        by_name = {p.name: p for p in shards}
        for entry in listed:
            size = by_name[entry["name"]].stat().st_size
            if size != entry.get("bytes"):
                raise FormatDataError(
                    f"{by_name[entry['name']]}: {size:,} bytes on disk, the card says {entry.get('bytes')!r} "
                    "(truncated or changed); nothing imported"
                )
        check_same(card.path, "records", block.get("records"), sum(int(f.get("samples", -1)) for f in listed))
        meta = _shard_meta(shards[0])
        if meta is not None:
            check_same(card.path, "layout", block.get("layout"), meta.get("layout"))
            ident = {k: (meta.get("provenance") or {}).get(k) for k in IDENTITY_KEYS}
            check_same(card.path, "identity (detector, weights sha256, box policy)", block.get("identity"), ident)
    return _Source(shards, card)


def _shard_meta(path: Path) -> Optional[dict]:
    """The ``__vlprep__`` member at the start of a shard (None for a shard of another writer)."""
    try:
        with tarfile.open(path, "r|") as tar:
            first = tar.next()
            if first is None or first.name != META_MEMBER:
                return None
            meta = json.loads(tar.extractfile(first).read())
    except (tarfile.TarError, OSError, ValueError, RecursionError) as err:
        raise FormatDataError(f"{path}: its {META_MEMBER} member is not readable ({err})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("layout"), dict):
        raise FormatDataError(f"{path}: its {META_MEMBER} member holds no layout")
    return meta


def wds_describe(paths: Sequence[Path], opts: ReadOptions) -> Description:
    """Every shard's end (a truncated one is refused) and the card against the shards, before any
    sample; the store settings and provenance the first shard's ``__vlprep__`` member states."""
    source = _inspect(paths)
    meta = _shard_meta(source.shards[0])
    if meta is None:
        return Description(checked=source.card is not None)
    layout = {k: meta["layout"][k] for k in LAYOUT_KEYS if k in meta["layout"]}
    license_ = source.card.metadata.get("license") if source.card is not None else None
    provenance = imported_provenance(meta.get("provenance"), license_)
    return Description(layout=layout, provenance=provenance, checked=source.card is not None)


def _split_name(name: str) -> tuple[Optional[str], str]:
    """(key, extension) as WebDataset splits a member name: at the first dot of its base name."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None, ""
    return (f"{folder}/{stem}" if folder else stem), ext


def _load_npy(name: str, data: bytes) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise RowError("bad npy", f"{name}: {err}") from None
    if array.dtype.kind not in "fiu":
        raise RowError("bad npy", f"{name}: dtype {array.dtype}, expected numbers")
    return array


def _decode(key: str, members: dict[str, bytes]) -> RegionFeatures:
    if "json" not in members:
        raise RowError("missing member", f"no {key}.json")
    try:
        meta = json.loads(members["json"])
    except (ValueError, RecursionError) as err:
        raise RowError("bad json", f"{key}.json: {err}") from None
    if not isinstance(meta, dict):
        raise RowError("bad json", f"{key}.json is not an object")
    try:
        from_key = decode_key(key)
    except (ValueError, UnicodeDecodeError) as err:
        raise RowError("bad key", str(err)) from None
    image_id = meta.get("image_id", from_key)
    if image_id != from_key:
        raise RowError("key mismatch", f"the key says {from_key!r}, {key}.json says {image_id!r}")
    for name in ("boxes", "features"):
        if f"{name}.npy" not in members:
            raise RowError("missing member", f"no {key}.{name}.npy")
    arrays = {
        name: _load_npy(f"{key}.{name}.npy", members[f"{name}.npy"]) for name in ARRAYS if f"{name}.npy" in members
    }
    n = arrays["boxes"].shape[0] if arrays["boxes"].ndim == 2 else -1
    if "num_boxes" in meta and parse_int("num_boxes", meta["num_boxes"]) != n:
        raise RowError("num_boxes mismatch", f"{key}.json says num_boxes={meta['num_boxes']}, boxes has {n} rows")
    return RegionFeatures(
        image_id=str(image_id),
        image_h=parse_int("image_h", meta.get("image_h")),
        image_w=parse_int("image_w", meta.get("image_w")),
        **arrays,
    )


def read_wds(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    source = _inspect(paths)
    for path in source.shards:
        key: Optional[str] = None
        members: dict[str, bytes] = {}
        problem: Optional[str] = None
        try:
            with tarfile.open(path, "r|") as tar:
                for info in tar:
                    if not info.isfile() or (info.name == META_MEMBER):
                        continue
                    name_key, ext = _split_name(info.name)
                    if name_key is None:
                        continue
                    if name_key != key:
                        if key is not None:
                            yield _sample(path, key, members, problem)
                        key, members, problem = name_key, {}, None
                    if ext in members:
                        problem = f"member {info.name} twice"
                    members[ext] = tar.extractfile(info).read()
                if key is not None:
                    yield _sample(path, key, members, problem)
        except (tarfile.TarError, EOFError, OSError) as err:
            raise FormatDataError(
                f"{path}: damaged after the sample {key!r}: {err}; the samples before it were read"
            ) from None


def _sample(path: Path, key: str, members: dict[str, bytes], problem: Optional[str]) -> ReadResult:
    location = f"{path.name}:{key}"
    if problem is not None:
        return Skipped(location, "duplicate member", problem)
    try:
        return Row(location, _decode(key, members))
    except RowError as err:
        return Skipped(location, err.kind, err.detail)
    except (TypeError, ValueError, OverflowError) as err:
        return Skipped(location, "bad value", f"{type(err).__name__}: {err}")
