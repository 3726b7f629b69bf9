"""Visual Genome: ``image_data.json``, a list of ``{"image_id", "url", "width", "height",
"coco_id", "flickr_id"}``. Ids are the VG image id as a string (as GQA and LXMERT's
vg_gqa features use); ``coco_id`` is kept beside when the image is also in COCO.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult, load_json
from pipeline.errors import ConfigError
from pipeline.records import SourceItem

NAME = "visual_genome"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        try:
            images = load_json(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from err
        if not isinstance(images, list):
            raise ConfigError(f"{path}: expected a list of images (image_data.json)")
        for i, img in enumerate(images):
            where = f"{path.name}[{i}]"
            image_id = img.get("image_id", img.get("id")) if isinstance(img, dict) else None
            if image_id is None or not img.get("url"):
                yield Malformed(where, "needs image_id and url")
                continue
            extra = (("coco_id", str(img["coco_id"])),) if img.get("coco_id") is not None else ()
            yield SourceItem(image_id=str(image_id), url=img["url"], split=opts.split or "", source=NAME, extra=extra)
