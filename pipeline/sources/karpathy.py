"""The Karpathy splits of Flickr30k and COCO captions (``dataset_flickr30k.json``,
``dataset_coco.json``: the image-text retrieval benchmarks), streamed:
``{"images": [{"filename", "filepath" (COCO: "train2014" | "val2014"), "split": "train" |
"val" | "test" | "restval", "imgid", "cocoid" (COCO), "sentences": [{"raw", "tokens",
"sentid", "imgid"}], "sentids"}], "dataset": "flickr30k" | "coco"}``.

An image is named by its file stem (``1000092795``, ``COCO_val2014_000000391895``), as the
Flickr30k and COCO readers name it. Its captions are the sentences' "raw" texts, cleaned
(`pipeline.sources.base.clean_text`); a null or blank one is left out with its sentence id
and counted: a `Skip` ("null text", "empty text") yielded before its image. So is a
sentence whose sentid an earlier sentence of the file has, and every sentence of an image
whose filename an earlier image has ("duplicate id": the first is kept; a duplicate image
is not yielded).

Rows: an image needs a filename, a split of `SPLITS` and a list of sentences, each an object
with an integer sentid; anything else is `Malformed` (``dataset_coco.json:images[3]``), as
is an image holding NaN or Infinity or nested too deep.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

from pipeline.sources.base import DUPLICATE_ID, Malformed, Skip, is_int, text_or_skip
from pipeline.sources.jsonstream import iter_json

SPLITS = ("train", "val", "test", "restval")  # restval: COCO's val2014 images Karpathy left to training


@dataclass(frozen=True)
class KarpathyImage:
    image: str  # the file stem: "1000092795", "COCO_val2014_000000391895"
    split: str  # one of SPLITS
    captions: tuple[str, ...]  # cleaned raw sentences, not blank, in file order
    sentence_ids: tuple[int, ...]  # the captions' sentids, aligned with them


def _well_formed(img) -> bool:
    return (
        isinstance(img, dict)
        and isinstance(img.get("filename"), str)
        and img["filename"] != ""
        and img.get("split") in SPLITS
        and isinstance(img.get("sentences"), list)
        and all(isinstance(s, dict) and is_int(s.get("sentid")) for s in img["sentences"])
    )


def read_karpathy(path: Path) -> Iterator[Union[KarpathyImage, Skip, Malformed]]:
    """The images of a Karpathy split file, in file order, each after the `Skip`s of its
    sentences left out."""
    path = Path(path)
    images: set[str] = set()
    sentences: set[int] = set()
    for i, img in iter_json(path, member="images", array=True):
        if isinstance(img, Malformed):
            yield img
            continue
        if not _well_formed(img):
            yield Malformed(
                path,
                f"images[{i}]",
                f"needs filename, split ({' | '.join(SPLITS)}) and sentences (objects with an integer sentid)",
            )
            continue
        image = img["filename"].rsplit(".", 1)[0]
        if image in images:
            yield from (Skip(image, DUPLICATE_ID) for _ in img["sentences"])
            continue
        images.add(image)
        kept = []
        for s in img["sentences"]:
            text = Skip(image, DUPLICATE_ID) if s["sentid"] in sentences else text_or_skip(image, s.get("raw"))
            sentences.add(s["sentid"])
            if isinstance(text, Skip):
                yield text
            else:
                kept.append((text, s["sentid"]))
        yield KarpathyImage(image, img["split"], tuple(t for t, _ in kept), tuple(s for _, s in kept))
