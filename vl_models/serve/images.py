"""The images of a store's ids, thumbnails, and the checks an uploaded image passes.

An id's image is looked for only under the ``--images`` roots, never anywhere else:

1. a plain folder root: ``ROOT/<id>.<ext>`` (the folder reader's ids: the path below the
   folder without its suffix), for the image suffixes the folder reader takes;
2. a root of our image shards (`vlprep download`, `extract --keep-images`): the row of the id
   (an index of the shards' ids, built on first use from their id columns);
3. the store's own dataset files (its extraction's recorded ``--dataset`` and ``--input``
   files, or files of the same names in a root): each item's URL path, or its file, under a
   root (the demo's ``cc3m-train-00000000`` is ``<root>/images/shapes_train_00000000.jpg``).

An id with a ``..`` part, an absolute one, one with a NUL or backslash never names a file;
every candidate is resolved (symbolic links followed) and must still lie under its root, be a
regular file within the downloader's size cap and sniff as an image, or it is not served.

Uploads get the downloader's checks (`check_upload`): the byte cap, the content sniffed (the
declared type is never trusted), the pixel count read from the header before decoding
(decompression bombs), a decode.
"""

from __future__ import annotations

import io
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Optional
from urllib.parse import unquote, urlsplit

from pipeline.datasets.folder import IMAGE_SUFFIXES
from pipeline.download.fetch import FetchConfig, FetchError, read_local
from pipeline.images import ImageConfig, ImageError, process_image, sniff
from pipeline.store import FeatureStore

log = logging.getLogger(__name__)

MAX_BYTES = FetchConfig().max_bytes  # the downloader's cap on one image (32 MiB)
MAX_PIXELS = ImageConfig().max_pixels  # its decompression-bomb threshold
THUMB_SIDE = 320  # a gallery thumbnail's longer side
PREVIEW_SIDE = 800  # an uploaded image as the ask page shows it
MEDIA_TYPES = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "gif": "image/gif",
    "bmp": "image/bmp",
    "tiff": "image/tiff",
}
_SUFFIXES = sorted(IMAGE_SUFFIXES) + sorted(s.upper() for s in IMAGE_SUFFIXES)


class UploadError(ValueError):
    """An upload that is no usable image: `kind` is the downloader's reason (``too large``, ``not
    an image``, ``decompression bomb``, ``decode error``, ``empty``)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass(frozen=True)
class Upload:
    data: bytes  # as uploaded
    name: str
    width: int
    height: int
    preview: bytes  # JPEG or PNG, longer side at most PREVIEW_SIDE
    preview_type: str


def check_upload(data: bytes, name: str = "upload") -> Upload:
    """An uploaded image, checked as the downloader checks what it fetches (UploadError)."""
    if not data:
        raise UploadError("empty", "no image was uploaded")
    if len(data) > MAX_BYTES:
        raise UploadError("too large", f"{len(data):,} bytes, more than {MAX_BYTES:,}")
    if sniff(data) is None:
        head = data[:16].decode("latin1").encode("unicode_escape").decode()
        raise UploadError("not an image", f"{len(data):,} bytes starting {head!r} (JPEG, PNG, WebP, GIF, BMP, TIFF)")
    try:
        preview = process_image(data, ImageConfig(max_side=PREVIEW_SIDE))  # header checks, then a decode
    except ImageError as err:
        raise UploadError(err.kind, err.detail) from None
    return Upload(
        data,
        _safe_name(name),
        preview.original_width,
        preview.original_height,
        preview.data,
        MEDIA_TYPES.get(preview.format, "image/jpeg"),
    )


def _safe_name(name: str) -> str:
    """An upload's file name as shown: its last part, printable, at most 80 characters."""
    base = PurePosixPath(str(name).replace("\\", "/")).name
    return "".join(c for c in base if c.isprintable())[:80] or "upload"


def safe_id(image_id: str) -> Optional[PurePosixPath]:
    """`image_id` as a relative path that stays below a folder, or None (an absolute id, a
    ``..`` or ``.`` part, an empty part, a NUL, a backslash, a drive-like colon)."""
    if not image_id or "\0" in image_id or "\\" in image_id or ":" in image_id or image_id.startswith("/"):
        return None
    path = PurePosixPath(image_id)
    if any(part in ("", ".", "..") for part in image_id.split("/")):
        return None
    return path


def contained(path: Path, root: Path) -> Optional[Path]:
    """`path` resolved (links followed) when it is a regular file under `root` (resolved), else None."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    if not real.is_relative_to(root) or not real.is_file():
        return None
    return real


def read_image(path: Path) -> tuple[bytes, str]:
    """The bytes of an image file found for an id, with their media type; LookupError for
    anything else (too large, unreadable, not an image)."""
    try:
        data = read_local(str(path), MAX_BYTES).data
    except FetchError as err:
        raise LookupError(f"{err.kind}: {err.detail}") from None
    fmt = sniff(data)
    if fmt is None:
        raise LookupError(f"{path.name} is not an image file")
    return data, MEDIA_TYPES[fmt]


class StoreImages:
    """Where a store's images are (see the module's docstring); each lookup is cached."""

    def __init__(self, store: FeatureStore, roots: tuple[Path, ...], cache: int = 4096):
        self.store, self.roots = store, roots
        self.folders = [r for r in roots if r.is_dir()]
        self._lock = threading.Lock()
        self._found: OrderedDict = OrderedDict()
        self._cache = cache
        self._shards: Optional[dict] = None
        self._groups: OrderedDict = OrderedDict()  # (parquet file, row group) -> its ids and images
        self._dataset: Optional[dict] = None
        config = store.manifest.provenance.get("config")
        self.config = config if isinstance(config, dict) else {}

    @property
    def recorded_source(self) -> Optional[str]:
        """The image folder or shards the store's extraction read (``--images``), if any."""
        source = self.config.get("images")
        return source if isinstance(source, str) else None

    def load(self, image_id: str) -> tuple[bytes, str, tuple]:
        """The image of `image_id` (bytes, media type, a cache key); LookupError when no root
        has it (or what a root has is no image within the size cap)."""
        path = self.find(image_id)
        if path is not None:
            data, media_type = read_image(path)
            stat = path.stat()
            return data, media_type, (str(path), stat.st_mtime_ns, stat.st_size)
        data = self.shard_bytes(image_id) if self.folders else None  # an id is a key there, never a path
        fmt = sniff(data) if data else None
        if fmt is not None:
            return data, MEDIA_TYPES[fmt], ("shard", id(self), image_id)
        raise LookupError(f"no image file of {image_id!r} under the --images roots")

    def find(self, image_id: str) -> Optional[Path]:
        """The image file of `image_id` under a root, or None."""
        with self._lock:
            if image_id in self._found:
                self._found.move_to_end(image_id)
                return self._found[image_id]
        found = self._find(image_id)
        with self._lock:
            self._found[image_id] = found
            while len(self._found) > self._cache:
                self._found.popitem(last=False)
        return found

    def _find(self, image_id: str) -> Optional[Path]:
        if not self.folders:
            return None
        rel = safe_id(image_id)  # None: the id never names a path (the dataset's items may still name its file)
        for root in self.folders if rel is not None else ():
            for suffix in ("", *_SUFFIXES):
                if suffix == "" and rel.suffix.lower() not in IMAGE_SUFFIXES:
                    continue
                candidate = root.joinpath(*rel.parts[:-1], rel.name + suffix)
                if candidate.is_file():
                    real = contained(candidate, root)
                    if real is not None:
                        return real
        return self._from_dataset(image_id)

    def shard_bytes(self, image_id: str) -> Optional[bytes]:
        """The stored bytes of `image_id` in our image shards under a root, or None."""
        index = self._shard_index()
        where = index.get(image_id)
        if where is None:
            return None
        import pyarrow.parquet as pq

        path, row_group, row = where
        with self._lock:
            table = self._groups.get((path, row_group))
        if table is None:  # a row group is read whole (Parquet has no row access): the last few are kept
            table = pq.ParquetFile(path).read_row_group(row_group, columns=["image_id", "image"])
            with self._lock:
                self._groups[(path, row_group)] = table
                while len(self._groups) > 4:
                    self._groups.popitem(last=False)
        if table.column("image_id")[row].as_py() != image_id:
            return None
        data = table.column("image")[row].as_py()
        return data if data and len(data) <= MAX_BYTES else None

    def _shard_index(self) -> dict:
        """id -> (parquet file, row group, row) over the complete image shards in the roots (their
        id and status columns only), built once."""
        with self._lock:
            if self._shards is not None:
                return self._shards
        import pyarrow.parquet as pq

        from pipeline.distribute import STATS_SUFFIX

        index: dict = {}
        for root in self.folders:
            for path in sorted(root.glob("*.parquet")):
                try:
                    marked = b"vlprep.image_shard_version" in (pq.read_schema(path).metadata or {})
                    if not marked or not (path.parent / f"{path.stem}{STATS_SUFFIX}").is_file():
                        continue  # not a complete shard of ours
                    index.update(_shard_ids(path))
                except Exception as err:  # a damaged file: its images are not shown, the rest are
                    log.warning("%s: cannot read its ids (%s)", path, err)
        with self._lock:
            self._shards = index
        return index

    def _from_dataset(self, image_id: str) -> Optional[Path]:
        items = self._dataset_items()
        target = items.get(image_id)
        if target is None:
            return None
        for root in self.folders:
            for candidate in _candidates(target, root):
                real = contained(candidate, root)
                if real is not None:
                    return real
        return None

    def _dataset_items(self) -> dict:
        """id -> URL or path of the items of the store's dataset files (read once)."""
        with self._lock:
            if self._dataset is not None:
                return self._dataset
        items: dict = {}
        dataset, inputs = self.config.get("dataset"), self.config.get("inputs") or []
        if isinstance(dataset, str) and isinstance(inputs, list) and self.folders:
            paths = [self._input(Path(p)) for p in inputs if isinstance(p, str)]
            if all(p is not None for p in paths) and paths:
                items = _read_dataset(dataset, paths, self.config.get("reader") or {})
        with self._lock:
            self._dataset = items
        return items

    def _input(self, recorded: Path) -> Optional[Path]:
        """A recorded dataset file, or the file of its name in a root (a moved folder)."""
        if recorded.is_file():
            return recorded
        for root in self.folders:
            candidate = contained(root / recorded.name, root)
            if candidate is not None:
                return candidate
        return None


def _shard_ids(path: Path) -> dict:
    import pyarrow.parquet as pq

    out, handle = {}, pq.ParquetFile(path)
    for group in range(handle.num_row_groups):
        table = handle.read_row_group(group, columns=["image_id", "status"])
        for row, (image_id, status) in enumerate(
            zip(table.column("image_id").to_pylist(), table.column("status").to_pylist())
        ):
            if status == "ok":
                out[image_id] = (path, group, row)
    return out


def _read_dataset(dataset: str, paths: list[Path], reader: dict) -> dict:
    from pipeline.datasets import ReaderOptions, read_items

    known = {f.name for f in fields(ReaderOptions)}
    options = {k: v for k, v in reader.items() if k in known}
    if options.get("images_root"):
        options["images_root"] = Path(options["images_root"])
    items = {}
    try:
        for item in read_items(dataset, paths, ReaderOptions(**options)):
            target = getattr(item, "url", None) or getattr(item, "path", None)
            if getattr(item, "image_id", None) and target:
                items[item.image_id] = target
    except Exception as err:  # the page shows no image rather than fail
        log.warning("reading the dataset files %s: %s", ", ".join(map(str, paths)), err)
    return items


def _candidates(target: str, root: Path) -> list[Path]:
    """Where under `root` the item of a URL or file may be: the URL's path below the root, its
    last parts; a file's path's last parts."""
    if "://" in target:
        try:
            path = unquote(urlsplit(target).path)
        except ValueError:
            return []
    else:
        path = target
    parts = [p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("/", "", ".", "..")]
    return [root.joinpath(*parts[i:]) for i in range(len(parts))][-6:]


class Thumbnails:
    """JPEG thumbnails (longer side `THUMB_SIDE`) made under the downloader's image checks, the
    newest `size` kept in memory."""

    def __init__(self, size: int = 512):
        self._lock = threading.Lock()
        self._cache: OrderedDict = OrderedDict()
        self._size = size

    def get(self, key, data: bytes) -> tuple[bytes, str]:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            small = process_image(data, ImageConfig(max_side=THUMB_SIDE, quality=85))
        except ImageError as err:
            raise LookupError(f"{err.kind}: {err.detail}") from None
        value = (small.data, MEDIA_TYPES.get(small.format, "image/jpeg"))
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return value


def data_url(data: bytes, media_type: str) -> str:
    import base64

    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def blank_png(width: int, height: int) -> bytes:
    """A grey picture of an image's size (no file found): the regions are drawn on it."""
    from PIL import Image

    scale = min(1.0, THUMB_SIDE / max(width, height, 1))
    im = Image.new("RGB", (max(1, round(width * scale)), max(1, round(height * scale))), (225, 225, 228))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()
