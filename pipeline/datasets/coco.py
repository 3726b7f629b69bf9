"""MS COCO captions: ``captions_train2014.json`` / ``captions_val2014.json`` (and 2017).

``{"images": [{"id", "file_name", "coco_url", "height", "width"}, ...],
"annotations": [{"image_id", "caption"}, ...]}``. One item per image, with all its
captions; the id is the file-name stem (``COCO_train2014_000000000009``, the key LXMERT's
features use). The split is taken from the file name (train2014, val2014, ...).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult, base_name, load_json
from pipeline.errors import ConfigError
from pipeline.records import SourceItem, Text

NAME = "coco"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    for path in paths:
        try:
            data = load_json(path.read_text(encoding="utf-8"))
            images, annotations = data["images"], data["annotations"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError(f"{path}: not a COCO captions file ({type(err).__name__}: {err})") from err
        split = opts.split or base_name(path).replace("captions_", "")
        captions = defaultdict(list)
        for i, ann in enumerate(annotations):
            if not isinstance(ann, dict) or "image_id" not in ann or not isinstance(ann.get("caption"), str):
                yield Malformed(f"{path.name}:annotations[{i}]", "needs image_id and a caption string")
                continue
            captions[ann["image_id"]].append(ann["caption"].strip())
        for i, img in enumerate(images):
            where = f"{path.name}:images[{i}]"
            if not isinstance(img, dict) or "id" not in img or not img.get("file_name"):
                yield Malformed(where, "needs id and file_name")
                continue
            url = img.get("coco_url") or img.get("flickr_url")
            if not url:
                yield Malformed(where, "no coco_url or flickr_url")
                continue
            yield SourceItem(
                image_id=img["file_name"].rsplit(".", 1)[0], url=url, split=split, source=NAME,
                texts=tuple(Text("caption", c) for c in captions.get(img["id"], [])),
                extra=(("coco_id", str(img["id"])),),
            )
