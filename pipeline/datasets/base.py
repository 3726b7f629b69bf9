"""What every dataset reader shares: options, malformed-row reports, the registry entry."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Optional, Sequence, Union

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


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(value: Any) -> Any:
    """`value` (a string, or lists and dicts of them) with every surrogate code point (a
    lone surrogate from JSON, an undecodable file-name byte) replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replace_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    return value


def load_json(text: str) -> Any:
    """`json.loads`, with lone surrogates (``\\ud800`` escapes: text no UTF-8 file can
    hold) replaced by U+FFFD, as undecodable bytes are (`open_text`)."""
    value = json.loads(text)
    return replace_surrogates(value) if _SURROGATE_ESCAPE.search(text) else value


def url_sha1(url: str) -> str:
    """A short, stable URL fingerprint kept beside ids (not an id: crc32-style ids collide)."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:16]


def base_name(path: Path) -> str:
    """File name without .gz and the last suffix: 'Train_GCC-training.tsv.gz' -> 'Train_GCC-training'."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.rsplit(".", 1)[0] if "." in name else name
