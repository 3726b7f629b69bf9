"""What every dataset reader shares: options, results, the registry entry.

The file-reading rules (malformed rows, texts, JSON, gzip) are `pipeline.sources.base`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

from pipeline.download.source_item import SourceItem
from pipeline.sources.base import Malformed

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


def url_sha1(url: str) -> str:
    """A short, stable URL fingerprint kept beside ids (not an id: crc32-style ids collide)."""
    return hashlib.sha1(url.encode("utf-8")).hexdigest()[:16]


__all__ = ["DatasetReader", "Malformed", "ReaderOptions", "ReaderResult", "url_sha1"]
