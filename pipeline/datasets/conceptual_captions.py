"""Conceptual Captions (CC3M): the official TSV (the format and the ``cc3m-<split>-<row>``
ids: `pipeline.sources.conceptual_captions`). One item per row, with its caption (none when
blank); the URL's sha1 prefix is kept beside as ``url_sha1``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult, url_sha1
from pipeline.download.source_item import SourceItem, Text
from pipeline.sources.conceptual_captions import read_tsv

NAME = "conceptual_captions"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        for row in read_tsv(path, opts.split):
            if isinstance(row, Malformed):
                yield row
                continue
            yield SourceItem(
                image_id=row.image_id,
                url=row.url,
                split=row.split,
                source=NAME,
                texts=(Text("caption", row.caption),) if isinstance(row.caption, str) else (),
                extra=(("url_sha1", url_sha1(row.url)),),
            )
