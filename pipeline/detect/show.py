"""`vlprep show`: draw a stored image's regions with their labels on the image (decoded by
`pipeline.images.load_rgb`, as the detector saw it); `side_by_side` puts such pictures in a row
(the demo's, `vltrain predict --show`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pipeline.errors import ConfigError
from pipeline.images import load_rgb
from pipeline.records import RegionFeatures

_PALETTE = [
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
    (170, 110, 40),
]


def read_vocab(path: Optional[Path]) -> Optional[list[str]]:
    """One name per line (the bottom-up-attention objects_vocab.txt / attributes_vocab.txt);
    line i names class i of the non-background ids. Comma-separated synonyms: first kept."""
    if path is None:
        return None
    return [line.split(",")[0].strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]


def label(rec: RegionFeatures, i: int, objects: Optional[list[str]], attributes: Optional[list[str]]) -> str:
    parts = []
    if rec.attrs_id is not None and rec.attrs_conf[i] >= 0.1:
        a = int(rec.attrs_id[i])
        parts.append(attributes[a] if attributes and a < len(attributes) else f"attr{a}")
    if rec.objects_id is not None:
        o = int(rec.objects_id[i])
        parts.append(objects[o] if objects and o < len(objects) else f"obj{o}")
        parts.append(f"{float(rec.objects_conf[i]):.2f}")
    return " ".join(parts) or f"region {i}"


def render(
    rec: RegionFeatures,
    image_bytes: bytes,
    max_regions: int = 36,
    min_conf: float = 0.0,
    objects: Optional[list[str]] = None,
    attributes: Optional[list[str]] = None,
) -> Image.Image:
    rgb = load_rgb(image_bytes)
    if rgb.shape[:2] != (rec.image_h, rec.image_w):
        raise ConfigError(
            f"the image is {rgb.shape[1]}x{rgb.shape[0]}, the stored record was extracted from a "
            f"{rec.image_w}x{rec.image_h} image: not the same picture"
        )
    im = Image.fromarray(rgb)
    draw = ImageDraw.Draw(im)
    font = ImageFont.load_default(size=max(11, rec.image_h // 45))
    order = np.argsort(-rec.objects_conf) if rec.objects_conf is not None else np.arange(rec.num_boxes)
    shown = [i for i in order if rec.objects_conf is None or rec.objects_conf[i] >= min_conf][:max_regions]
    width = max(2, rec.image_w // 300)
    for rank, i in enumerate(shown):
        color = _PALETTE[rank % len(_PALETTE)]
        x1, y1, x2, y2 = (float(v) for v in rec.boxes[i])
        draw.rectangle([x1, y1, x2, y2], outline=color, width=width)
        text = label(rec, i, objects, attributes)
        tx, ty = x1 + width, max(0.0, y1 - font.size - 4)
        box = draw.textbbox((tx, ty), text, font=font)
        draw.rectangle([box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2], fill=color)
        draw.text((tx, ty), text, fill=(0, 0, 0) if sum(color) > 400 else (255, 255, 255), font=font)
    return im


def side_by_side(tiles: list[Image.Image], gap: int = 0) -> Image.Image:
    """`tiles` in one row, left to right, `gap` white pixels apart, top-aligned on white."""
    row = Image.new(
        "RGB", (sum(t.width for t in tiles) + gap * max(len(tiles) - 1, 0), max(t.height for t in tiles)), "white"
    )
    x = 0
    for tile in tiles:
        row.paste(tile, (x, 0))
        x += tile.width + gap
    return row
