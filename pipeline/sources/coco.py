"""MS COCO captions files: ``captions_train2014.json`` / ``captions_val2014.json`` (and 2017).

``{"images": [{"id", "file_name", "coco_url", "flickr_url", "height", "width"}, ...],
"annotations": [{"id", "image_id", "caption"}, ...]}``. A COCO image is named by its file
stem (``COCO_train2014_000000000009``: the key LXMERT's features use); `coco_stem` makes
that name from a split and a numeric id (VQA's questions give only the id).

Rows: an image needs an integer ``id`` and a ``file_name``; an annotation needs an
``image_id`` of one of the file's images and a ``caption`` key (a null or blank caption is a
`Skip`). Anything else is `Malformed` (``captions_train2014.json:annotations[3]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from pipeline.errors import ConfigError
from pipeline.sources.base import Malformed, Skip, is_int, load_json_file, text_or_skip

SPLITS = ("train2014", "val2014", "test2015", "test2014", "train2017", "val2017")


@dataclass(frozen=True)
class CocoImage:
    id: int
    stem: str  # the file name without its suffix: the image's name
    url: Optional[str]  # coco_url, else flickr_url; None when the file gives neither
    index: int  # position in the file's "images"


@dataclass(frozen=True)
class CocoCaption:
    image: str  # the image's stem
    text: str  # cleaned, not blank


@dataclass
class CocoCaptions:
    """One captions file, read: its images (file order), its captions and skips
    (annotation order), and its malformed rows (images', then annotations')."""

    images: list[CocoImage] = field(default_factory=list)
    captions: list[Union[CocoCaption, Skip]] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)


def read_captions(path: Path) -> CocoCaptions:
    """Read a COCO captions file (whole: the official ones are tens of MB); ConfigError when
    it is not JSON or has no "images" and "annotations" lists."""
    path = Path(path)
    data = load_json_file(path)
    if not isinstance(data, dict) or not all(isinstance(data.get(key), list) for key in ("images", "annotations")):
        raise ConfigError(f'{path}: not a COCO captions file (needs top-level "images" and "annotations" lists)')
    out = CocoCaptions()
    stems: dict[int, str] = {}
    for i, img in enumerate(data["images"]):
        if (
            not isinstance(img, dict)
            or not is_int(img.get("id"))
            or not isinstance(img.get("file_name"), str)
            or not img["file_name"]
        ):
            out.malformed.append(Malformed(path, f"images[{i}]", "needs an integer id and a file_name"))
            continue
        url = img.get("coco_url") or img.get("flickr_url")
        image = CocoImage(img["id"], img["file_name"].rsplit(".", 1)[0], url if isinstance(url, str) else None, i)
        stems[image.id] = image.stem
        out.images.append(image)
    for i, ann in enumerate(data["annotations"]):
        where = f"annotations[{i}]"
        if not isinstance(ann, dict) or "image_id" not in ann or "caption" not in ann:
            out.malformed.append(Malformed(path, where, "needs image_id and caption"))
            continue
        stem = stems.get(ann["image_id"]) if is_int(ann["image_id"]) else None
        if stem is None:
            out.malformed.append(Malformed(path, where, f"image {ann['image_id']!r} is not in images"))
            continue
        text = text_or_skip(stem, ann["caption"])
        out.captions.append(text if isinstance(text, Skip) else CocoCaption(stem, text))
    return out


def coco_split(name: str) -> Optional[str]:
    """The split of the images a file is about: 'captions_train2014.json' /
    'v2_OpenEnded_mscoco_val2014_questions.json' -> 'train2014' / 'val2014'; test-dev2015
    (VQA's test-dev questions) -> 'test2015', whose images test-dev's are; None when the name
    holds none of `SPLITS`."""
    name = name.replace("test-dev2015", "test2015")
    return next((split for split in SPLITS if split in name), None)


def coco_stem(split: str, image_id: int) -> str:
    """The file stem of COCO image `image_id` of `split` (2014/2015 names carry the split)."""
    number = f"{int(image_id):012d}"
    return f"COCO_{split}_{number}" if split.endswith(("2014", "2015")) else number
