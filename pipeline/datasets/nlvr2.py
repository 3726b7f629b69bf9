"""NLVR2: the JSON-lines files with image URLs (``train.json``, ``dev.json``,
``test1.json`` of the URL release; the format and the image names:
`pipeline.sources.nlvr2`).

Each pair has two images, ``<split>-<set>-<pair>-img0`` (left) and ``-img1`` (right). An
image is yielded once (several sentences share a pair), with the first sentence seen as a
"statement" text (none when null or blank) and the label ("True", "False"; "" when
none). A row without both urls is `Malformed`: there is nothing to fetch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult
from pipeline.download.source_item import SourceItem, Text
from pipeline.sources.nlvr2 import read_nlvr2

NAME = "nlvr2"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    seen: set[str] = set()
    for path in paths:
        for ex in read_nlvr2(path, urls_required=True):
            if isinstance(ex, Malformed):
                yield ex
                continue
            texts = (Text("statement", ex.sentence),) if isinstance(ex.sentence, str) else ()
            label = "" if ex.label is None else str(ex.label)
            for image_id, url in ((ex.left_image, ex.left_url), (ex.right_image, ex.right_url)):
                if image_id in seen:
                    continue
                seen.add(image_id)
                yield SourceItem(
                    image_id=image_id,
                    url=url,
                    texts=texts,
                    split=opts.split or ex.split,
                    source=NAME,
                    extra=(("label", label),),
                )
