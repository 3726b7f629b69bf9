"""Visual Genome ``image_data.json`` (the format: `pipeline.sources.visual_genome`). Ids
are the VG image id as a string (as GQA and LXMERT's vg_gqa features use); ``coco_id`` is
kept beside when the image is also in COCO.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult
from pipeline.download.source_item import SourceItem
from pipeline.sources.visual_genome import read_image_data

NAME = "visual_genome"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        for img in read_image_data(path):
            if isinstance(img, Malformed):
                yield img
                continue
            extra = (("coco_id", str(img.coco_id)),) if img.coco_id is not None else ()
            yield SourceItem(image_id=img.id, url=img.url, split=opts.split or "", source=NAME, extra=extra)
