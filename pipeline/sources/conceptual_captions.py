"""Conceptual Captions (CC3M): the official TSV, no header, ``caption <TAB> url``.

Files: ``Train_GCC-training.tsv`` (3,318,333 rows) and
``Validation_GCC-1.1.0-Validation.tsv`` (15,840 rows), optionally gzipped. An image's id is
``cc3m-<split>-<row>`` (0-based row of the file, 8 digits): stable and collision-free,
unlike the crc32 of the URL older tools used. The split comes from the file name
(`split_of`) unless the caller gives one.

Rows: a line needs exactly two tab-separated fields and a url; an empty line or anything else
is `Malformed` (``Train_GCC-training.tsv:12``). A blank caption is a `Skip` in the row's
`caption` (the image is still an image).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from pipeline.sources.base import Malformed, Skip, base_name, open_text, text_or_skip


@dataclass(frozen=True)
class CcRow:
    image_id: str  # cc3m-<split>-<row>
    url: str
    caption: Union[str, Skip]  # cleaned; a Skip when blank
    split: str


def split_of(path: Path) -> str:
    """'Train_GCC-training.tsv' -> 'train', 'Validation_GCC-1.1.0-Validation.tsv' -> 'val';
    the file's base name when it names neither (nor 'test')."""
    name = base_name(path).lower()
    if "train" in name:
        return "train"
    if "valid" in name or name.startswith("val"):
        return "val"
    if "test" in name:
        return "test"
    return base_name(path)


def read_tsv(path: Path, split: Optional[str] = None) -> Iterator[Union[CcRow, Malformed]]:
    path = Path(path)
    split = split or split_of(path)
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            where = str(lineno)
            if not line.strip():
                yield Malformed(path, where, "empty line")
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                yield Malformed(path, where, f"expected 2 tab-separated fields (caption, url), found {len(fields)}")
                continue
            url = fields[1].strip()
            if not url:
                yield Malformed(path, where, "empty url")
                continue
            image_id = f"cc3m-{split}-{lineno - 1:08d}"
            yield CcRow(image_id, url, text_or_skip(image_id, fields[0]), split)
