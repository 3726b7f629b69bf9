"""NLVR2: the JSON-lines files with image URLs (``train.json``, ``dev.json``,
``test1.json`` of the URL release): ``{"identifier": "train-10171-0-0", "sentence",
"left_url", "right_url", "label", ...}``.

Each pair has two images, named as in the released image folders:
``<split>-<set>-<pair>-img0`` (left) and ``-img1`` (right). An image is yielded once
(several sentences share a pair), with the first sentence seen as a "statement" text
(whitespace-normalized: `pipeline.sources.base.clean_text`; none when null or blank).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets.base import Malformed, ReaderOptions, ReaderResult
from pipeline.records import SourceItem, Text
from pipeline.sources.base import load_json, open_text, text_or_skip

NAME = "nlvr2"


def read(paths: Sequence[Path], opts: ReaderOptions) -> Iterator[ReaderResult]:
    seen: set[str] = set()
    for path in paths:
        with open_text(path) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = str(lineno)
                try:
                    obj = load_json(line)
                except json.JSONDecodeError as err:
                    yield Malformed(path, where, f"invalid JSON: {err.msg}")
                    continue
                ident = obj.get("identifier") if isinstance(obj, dict) else None
                parts = ident.rsplit("-", 1) if isinstance(ident, str) else []
                if len(parts) != 2 or not obj.get("left_url") or not obj.get("right_url"):
                    yield Malformed(path, where, "needs identifier (split-set-pair-sentence), left_url and right_url")
                    continue
                pair = parts[0]
                split = opts.split or pair.split("-", 1)[0]
                sentence = text_or_skip(pair, obj.get("sentence"))
                texts = (Text("statement", sentence),) if isinstance(sentence, str) else ()
                for side, key in (("img0", "left_url"), ("img1", "right_url")):
                    image_id = f"{pair}-{side}"
                    if image_id in seen:
                        continue
                    seen.add(image_id)
                    yield SourceItem(image_id=image_id, url=obj[key], texts=texts, split=split, source=NAME,
                                     extra=(("label", str(obj.get("label", ""))),))
