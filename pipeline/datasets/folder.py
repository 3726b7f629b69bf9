"""Plain local folders of images (any depth). Ids are the path relative to the folder,
without the suffix (``cats/001``); files are listed in sorted order."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import ReaderOptions, ReaderResult
from pipeline.download.source_item import SourceItem
from pipeline.errors import ConfigError

NAME = "folder"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}


def image_files(root: Path) -> Iterator[Path]:
    """Image files under `root`, sorted, hidden ones skipped."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not any(p.startswith(".") for p in rel.parts):
            yield path


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for root in paths:
        if not root.is_dir():
            raise ConfigError(f"{root}: the folder reader takes directories of images")
        for path in image_files(root):
            rel = path.relative_to(root).with_suffix("").as_posix()
            yield SourceItem(image_id=rel, path=str(path.resolve()), split=opts.split or "", source=NAME)
