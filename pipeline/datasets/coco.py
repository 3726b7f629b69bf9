"""MS COCO captions (``captions_train2014.json``, ...; the format: `pipeline.sources.coco`).

One item per image, with all its captions; the id is the file-name stem
(``COCO_train2014_000000000009``), the URL its ``coco_url`` (else ``flickr_url``; an image
with neither is malformed here), ``coco_id`` kept beside. The split is taken from the file
name (train2014, val2014, ...).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult
from pipeline.download.source_item import SourceItem, Text
from pipeline.sources.base import base_name
from pipeline.sources.coco import CocoCaption, coco_split, read_captions

NAME = "coco"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        coco = read_captions(path)
        split = opts.split or coco_split(path.name) or base_name(path).replace("captions_", "")
        yield from coco.malformed
        texts = defaultdict(list)
        for caption in coco.captions:
            if isinstance(caption, CocoCaption):
                texts[caption.image].append(Text("caption", caption.text))
        for img in coco.images:
            if img.url is None:
                yield Malformed(path, f"images[{img.index}]", "no coco_url or flickr_url")
                continue
            yield SourceItem(
                image_id=img.stem,
                url=img.url,
                split=split,
                source=NAME,
                texts=tuple(texts[img.stem]),
                extra=(("coco_id", str(img.id)),),
            )
