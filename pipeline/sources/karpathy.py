"""The Karpathy splits of Flickr30k and COCO captions (``dataset_flickr30k.json``,
``dataset_coco.json``: the image-text retrieval benchmarks), streamed:
``{"images": [{"filename", "filepath" (COCO: "train2014" | "val2014"), "split": "train" |
"val" | "test" | "restval", "imgid", "cocoid" (COCO), "sentences": [{"raw", "tokens",
"sentid", "imgid"}], "sentids"}], "dataset": "flickr30k" | "coco"}``.

An image is named by its file stem (``1000092795``, ``COCO_val2014_000000391895``), as the
Flickr30k and COCO readers name it. Its captions are the sentences' "raw" texts, cleaned
(`pipeline.sources.base.clean_text`); a null or blank one is left out with its sentence id.

Rows: an image needs a filename, a split of `SPLITS` and a list of sentences, each an object
with an integer sentid; anything else is `Malformed` (``dataset_coco.json:images[3]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

from pipeline.sources.base import Malformed, is_int, text_or_skip
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


def read_karpathy(path: Path) -> Iterator[Union[KarpathyImage, Malformed]]:
    """The images of a Karpathy split file, in file order."""
    path = Path(path)
    for i, img in iter_json(path, member="images", array=True):
        if not _well_formed(img):
            yield Malformed(
                path,
                f"images[{i}]",
                f"needs filename, split ({' | '.join(SPLITS)}) and sentences (objects with an integer sentid)",
            )
            continue
        image = img["filename"].rsplit(".", 1)[0]
        texts = [(text_or_skip(image, s.get("raw")), s["sentid"]) for s in img["sentences"]]
        kept = [(text, sentid) for text, sentid in texts if isinstance(text, str)]
        yield KarpathyImage(image, img["split"], tuple(t for t, _ in kept), tuple(s for _, s in kept))
