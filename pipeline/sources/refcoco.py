"""RefCOCO, RefCOCO+ and RefCOCOg (the refer toolkit's release): a refs pickle and the COCO
instances file beside it.

* ``refs(unc).p`` / ``refs(umd).p`` / ``refs(google).p``: a pickled list of refs
  ``{"ref_id", "ann_id", "image_id", "split": "train" | "val" | "testA" | "testB" | "test",
  "sentences": [{"sent", "raw", "tokens", "sent_id"}], "sent_ids", "category_id",
  "file_name"}``. Loaded only through `pipeline.safe_pickle` (plain values, nothing else): a
  pickle asking for anything more raises `UnsafePickleError` naming the file.
* ``instances.json`` (COCO's format, streamed): ``{"images": [{"id", "file_name", "width",
  "height"}], "annotations": [{"id", "image_id", "bbox": [x, y, w, h], "category_id", ...}],
  "categories": [...]}``: the referred object's box and its image's name and size.

One `RefExpression` per sentence, in refs order; its text is the sentence's ``raw`` (as the
annotator wrote it, case and punctuation kept), which vilbert-multi-task (and vilbert_beta)
tokenize, not the refer toolkit's lower-cased ``sent``. Rows: a ref needs integer ref_id, ann_id and
image_id, a split and a list of sentences, each an object with an integer sent_id; its
ann_id must be an annotation of its image_id in instances.json. Anything else is
`Malformed` (``refs(unc).p:[12]``), as are instances' images without an integer id,
file_name, width and height and annotations without an integer id and image_id and a bbox of
four numbers (``instances.json:annotations[3]``, yielded first), and a ref or an instances
member holding a non-finite number (NaN, Infinity, or a box number too large for a float:
a box of them would train on nothing).
A null or blank ``raw`` is a `Skip`. A refs file that is not a list is a ConfigError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Union

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.safe_pickle import safe_loads
from pipeline.sources.base import (
    NON_FINITE,
    Malformed,
    Skip,
    all_finite,
    finite_numbers,
    is_int,
    reading,
    text_or_skip,
)
from pipeline.sources.jsonstream import iter_json

_REF_SHAPE = "needs integer ref_id, ann_id and image_id, a split and sentences (objects with an integer sent_id)"


@dataclass(frozen=True)
class RefExpression:
    ref_id: int
    sent_id: int
    split: str  # train | val | testA | testB | test, as given
    image: str  # the COCO file stem of the image, from instances.json ("COCO_train2014_000000581857")
    image_id: int
    ann_id: int  # the referred object's annotation
    sentence: str  # the cleaned "raw" (as written; vilbert-multi-task's text), not blank
    box: tuple[float, float, float, float]  # the referred object: x1, y1, x2, y2 in pixels
    width: int  # the image's
    height: int


@dataclass(frozen=True)
class _Image:
    stem: str
    width: int
    height: int


def _number(value: Any) -> bool:
    """A JSON number (not a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def load_refs(path: Path) -> list:
    """The refs list of a refs pickle, through the restricted unpickler; UnsafePickleError
    naming the file when it asks for anything but plain values (or is no pickle at all),
    ConfigError when it holds something else than a list."""
    path = Path(path)
    with reading(str(path)):
        data = path.read_bytes()
    try:
        refs = safe_loads(data, encoding="utf-8")
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{path}: {err}") from err
    if not isinstance(refs, list):
        raise ConfigError(f"{path}: not a refs file (needs a pickled list of refs, found {type(refs).__name__})")
    return refs


def _well_formed(ref: Any) -> bool:
    return (
        isinstance(ref, dict)
        and all(is_int(ref.get(key)) for key in ("ref_id", "ann_id", "image_id"))
        and isinstance(ref.get("split"), str)
        and ref["split"] != ""
        and isinstance(ref.get("sentences"), list)
        and all(isinstance(s, dict) and is_int(s.get("sent_id")) for s in ref["sentences"])
        and all_finite(ref)
    )


def _instances(
    path: Path,
    image_ids: set[int],
    ann_ids: set[int],
    images: dict[int, _Image],
    boxes: dict[int, tuple[int, tuple[float, ...]]],
) -> Iterator[Malformed]:
    """Fill `images` and `boxes` (annotation id -> (image id, x, y, w, h)) with the wanted
    ids' entries of instances.json; yield its malformed rows."""
    for i, img in iter_json(path, member="images", array=True):
        if isinstance(img, Malformed):
            yield img
        elif (
            not isinstance(img, dict)
            or not is_int(img.get("id"))
            or not isinstance(img.get("file_name"), str)
            or not is_int(img.get("width"))
            or not is_int(img.get("height"))
        ):
            yield Malformed(path, f"images[{i}]", "needs an integer id, file_name, width and height")
        elif img["id"] in image_ids:
            images[img["id"]] = _Image(img["file_name"].rsplit(".", 1)[0], img["width"], img["height"])
    for i, ann in iter_json(path, member="annotations", array=True):
        bbox = ann.get("bbox") if isinstance(ann, dict) else None
        if isinstance(ann, Malformed):
            yield ann
        elif (
            not isinstance(ann, dict)
            or not is_int(ann.get("id"))
            or not is_int(ann.get("image_id"))
            or not isinstance(bbox, list)
            or len(bbox) != 4
            or not all(_number(v) for v in bbox)
        ):
            yield Malformed(path, f"annotations[{i}]", "needs an integer id and image_id and a bbox [x, y, w, h]")
        elif not finite_numbers(bbox):  # 1e400: valid JSON, read as infinity
            yield Malformed(path, f"annotations[{i}]", NON_FINITE)
        elif ann["id"] in ann_ids:
            boxes[ann["id"]] = (ann["image_id"], tuple(float(v) for v in bbox))


def read_refs(refs: Path, instances: Path) -> Iterator[Union[RefExpression, Skip, Malformed]]:
    """The referring expressions of a refs pickle, one per sentence, with their boxes from
    `instances`; instances' malformed rows first."""
    refs, instances = Path(refs), Path(instances)
    rows = load_refs(refs)
    wanted = [ref for ref in rows if _well_formed(ref)]
    images: dict[int, _Image] = {}
    boxes: dict[int, tuple[int, tuple[float, ...]]] = {}
    yield from _instances(instances, {r["image_id"] for r in wanted}, {r["ann_id"] for r in wanted}, images, boxes)
    for i, ref in enumerate(rows):
        where = f"[{i}]"
        if not _well_formed(ref):
            reason = NON_FINITE if isinstance(ref, dict) and not all_finite(ref) else _REF_SHAPE
            yield Malformed(refs, where, reason)
            continue
        image, found = images.get(ref["image_id"]), boxes.get(ref["ann_id"])
        if image is None or found is None or found[0] != ref["image_id"]:
            yield Malformed(
                refs, where, f"annotation {ref['ann_id']} of image {ref['image_id']} is not in {instances.name}"
            )
            continue
        x, y, w, h = found[1]
        for s in ref["sentences"]:
            text = text_or_skip(image.stem, s.get("raw"))
            yield (
                text
                if isinstance(text, Skip)
                else RefExpression(
                    ref["ref_id"],
                    s["sent_id"],
                    ref["split"],
                    image.stem,
                    ref["image_id"],
                    ref["ann_id"],
                    text,
                    (x, y, x + w, y + h),
                    image.width,
                    image.height,
                )
            )


def annotation_boxes(instances: Path, images: set[str]) -> dict[str, list[list[float]]]:
    """Every annotation's box (x1, y1, x2, y2, pixels) on the named images (COCO file stems),
    in file order: the ground-truth region candidates, as `vlprep extract --given-boxes`
    reads them. Malformed entries are left out (`read_refs` names them)."""
    instances = Path(instances)
    ids = {}
    for _, img in iter_json(instances, member="images", array=True):
        if isinstance(img, dict) and is_int(img.get("id")) and isinstance(img.get("file_name"), str):
            stem = img["file_name"].rsplit(".", 1)[0]
            if stem in images:
                ids[img["id"]] = stem
    out: dict[str, list[list[float]]] = {}
    for _, ann in iter_json(instances, member="annotations", array=True):
        bbox = ann.get("bbox") if isinstance(ann, dict) else None
        if isinstance(bbox, list) and len(bbox) == 4 and finite_numbers(bbox) and ann.get("image_id") in ids:
            x, y, w, h = (float(v) for v in bbox)
            out.setdefault(ids[ann["image_id"]], []).append([x, y, x + w, y + h])
    return out
