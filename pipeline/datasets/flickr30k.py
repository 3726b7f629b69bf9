"""Flickr30k: ``results_20130124.token`` (``<file>.jpg#<n> <TAB> caption``, five lines
per image) plus the image folder users obtain from the dataset's request form.

Items are local files: ``<images_root>/<file>`` as an absolute path (Ray workers on other
nodes read it); ``images_root`` defaults to ``flickr30k-images`` beside the token file.
Ids are the file stem (``1000092795``); captions are whitespace-normalized
(`pipeline.sources.base.clean_text`; a blank one is left out).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult
from pipeline.download.source_item import SourceItem, Text
from pipeline.sources.base import clean_text, open_text

NAME = "flickr30k"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        root = Path(os.path.abspath(opts.images_root or path.parent / "flickr30k-images"))
        current, captions = None, []

        def flush():
            return SourceItem(
                image_id=current.rsplit(".", 1)[0],
                path=str(root / current),
                split=opts.split or "",
                source=NAME,
                texts=tuple(Text("caption", c) for c in captions),
            )

        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                key, sep, caption = line.partition("\t")
                name, hash_, _ = key.partition("#")
                if not sep or not hash_ or not name or "/" in name or name.startswith("."):
                    yield Malformed(path, str(lineno), "expected '<file>.jpg#<n>\\t<caption>'")
                    continue
                if name != current:
                    if current is not None:
                        yield flush()
                    current, captions = name, []
                captions.append(clean_text(caption))
        if current is not None:
            yield flush()
