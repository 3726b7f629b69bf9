"""What every dataset reader shares: options, malformed-row reports, the registry entry."""

from __future__ import annotations

import gzip
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Sequence, Union

from pipeline.records import SourceItem


@dataclass(frozen=True)
class Malformed:
    """A source row that could not be read, and where."""

    location: str  # "file.tsv:12"
    reason: str

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


ReaderResult = Union[SourceItem, Malformed]


@dataclass(frozen=True)
class ReaderOptions:
    split: Optional[str] = None  # overrides the split a reader infers from file names
    url_col: str = "url"  # url_list
    caption_col: Optional[str] = "caption"  # url_list; None: no texts
    id_col: Optional[str] = None  # url_list; None: "<file stem>-<row>"
    images_root: Optional[Path] = None  # flickr30k: the folder holding the images


@dataclass(frozen=True)
class DatasetReader:
    name: str
    summary: str
    read: Callable[[Sequence[Path], ReaderOptions], Iterator[ReaderResult]]


def open_text(path: Path) -> IO[str]:
    """A text file, transparently gunzipped when it ends in .gz; bad bytes are replaced."""
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")


def url_sha1(url: str) -> str:
    """A short, stable URL fingerprint kept beside ids (not an id: crc32-style ids collide)."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:16]


def base_name(path: Path) -> str:
    """File name without .gz and the last suffix: 'Train_GCC-training.tsv.gz' -> 'Train_GCC-training'."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.rsplit(".", 1)[0] if "." in name else name
