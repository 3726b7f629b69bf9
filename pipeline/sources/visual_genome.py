"""Visual Genome files, streamed (region descriptions and QA are GBs). A VG image is named
by its VG id as a string (``"2354786"``, as GQA and LXMERT's vg_gqa features do).

* ``image_data.json``: ``[{"image_id" (v1.0: "id"), "url", "width", "height", "coco_id",
  "flickr_id"}]`` -> `VgImage`; a row needs the id, a url and ``coco_id`` (null when the
  image is not in COCO).
* ``region_descriptions.json``: ``[{"id", "regions": [{"phrase", "image_id", ...}]}]`` ->
  `VgText` per phrase (each describes the whole image, as LXMERT uses them).
* ``question_answers.json``: ``[{"id", "qas": [{"question", "answer", "image_id"}]}]`` ->
  `VgQuestion` (a null answer is a `Skip`).

Rows without that shape are `Malformed` (``image_data.json:[5]``); null and blank texts are
`Skip`s (`pipeline.sources.base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from pipeline.sources.base import NULL_ANSWER, Malformed, Skip, is_id, is_int, text_or_skip
from pipeline.sources.jsonstream import iter_json


@dataclass(frozen=True)
class VgImage:
    id: str
    url: str
    coco_id: Optional[int]  # the COCO id of the same image; None when it is not in COCO


@dataclass(frozen=True)
class VgText:
    image: str  # VG id
    text: str  # cleaned, not blank


@dataclass(frozen=True)
class VgQuestion:
    image: str  # VG id
    text: str
    answer: str  # as given


def read_image_data(path: Path) -> Iterator[Union[VgImage, Malformed]]:
    for i, img in iter_json(path, array=True):
        if isinstance(img, Malformed):
            yield img
            continue
        image_id = img.get("image_id", img.get("id")) if isinstance(img, dict) else None
        url, coco_id = (img.get("url"), img.get("coco_id", False)) if isinstance(img, dict) else (None, False)
        if not is_id(image_id) or not isinstance(url, str) or not url or not (coco_id is None or is_int(coco_id)):
            yield Malformed(
                Path(path), f"[{i}]", "needs image_id, url and coco_id (an integer, or null when not in COCO)"
            )
            continue
        yield VgImage(str(image_id), url, coco_id)


def read_region_descriptions(path: Path) -> Iterator[Union[VgText, Skip, Malformed]]:
    for i, entry in iter_json(path, array=True):
        if isinstance(entry, Malformed):
            yield entry
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("regions"), list):
            yield Malformed(Path(path), f"[{i}]", "needs regions (a list)")
            continue
        image = entry.get("id", entry.get("image_id"))
        if not is_id(image):
            yield Malformed(Path(path), f"[{i}]", "needs id")
            continue
        for region in entry["regions"]:
            text = text_or_skip(str(image), region.get("phrase") if isinstance(region, dict) else None)
            yield text if isinstance(text, Skip) else VgText(str(image), text)


def read_question_answers(path: Path) -> Iterator[Union[VgQuestion, Skip, Malformed]]:
    for i, entry in iter_json(path, array=True):
        if isinstance(entry, Malformed):
            yield entry
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("qas"), list):
            yield Malformed(Path(path), f"[{i}]", "needs qas (a list)")
            continue
        for j, qa in enumerate(entry["qas"]):
            image = qa.get("image_id", entry.get("id")) if isinstance(qa, dict) else None
            if not is_id(image):
                yield Malformed(Path(path), f"[{i}].qas[{j}]", "needs image_id (or the entry's id)")
                continue
            image = str(image)
            text = text_or_skip(image, qa.get("question"))
            if isinstance(text, Skip):
                yield text
            elif not isinstance(qa.get("answer"), str):
                yield Skip(image, NULL_ANSWER)
            else:
                yield VgQuestion(image, text, qa["answer"])
