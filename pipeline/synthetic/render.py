"""Drawing a scene: background pixels (solid, gradient, noise), then each shape in order,
plain or striped, tight inside its box."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from pipeline.synthetic.scenes import BACKGROUNDS, RGB, Background, Scene, SceneObject


def _star(points: int = 5, inner: float = 0.45) -> list[tuple[float, float]]:
    angles = -np.pi / 2 + np.arange(2 * points) * np.pi / points
    radii = np.where(np.arange(2 * points) % 2 == 0, 1.0, inner)
    xy = np.stack([radii * np.cos(angles), radii * np.sin(angles)], 1)
    xy = (xy - xy.min(0)) / (xy.max(0) - xy.min(0))  # stretched to touch all four sides
    return [(float(u), float(v)) for u, v in xy]


# Outlines in the unit square, each touching all four sides (so boxes are tight).
OUTLINES = {
    "square": [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)],
    "triangle": [(0.5, 0.0), (1.0, 1.0), (0.0, 1.0)],
    "diamond": [(0.5, 0.0), (1.0, 0.5), (0.5, 1.0), (0.0, 0.5)],
    "star": _star(),
}


def _background_pixels(bg: Background, width: int, height: int) -> np.ndarray:
    a, b = (np.array(BACKGROUNDS[c], np.float64) for c in bg.colors)
    t = np.zeros((height, width, 1))
    if bg.kind == "vertical":
        t += np.linspace(0.0, 1.0, height)[:, None, None]
    elif bg.kind == "horizontal":
        t += np.linspace(0.0, 1.0, width)[None, :, None]
    pixels = a * (1 - t) + b * t
    if bg.noise:
        pixels = pixels + np.random.default_rng(bg.seed).normal(0.0, bg.noise, pixels.shape)
    return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _draw(image: Image.Image, obj: SceneObject) -> None:
    x, y = int(obj.box[0]), int(obj.box[1])
    side = int(obj.box[2]) - x
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    last = side - 1  # pixel centres 0..side-1 cover [0, side) exactly
    if obj.shape == "circle":
        draw.ellipse((0, 0, last, last), fill=255)
    else:
        draw.polygon([(u * last, v * last) for u, v in OUTLINES[obj.shape]], fill=255)
    patch = Image.new("RGB", (side, side), RGB[obj.color])
    if obj.texture == "striped":
        dark = tuple(int(c * 0.55) for c in RGB[obj.color])
        period = max(6, side // 5)
        stripes = ImageDraw.Draw(patch)
        for k in range(0, 2 * side, period):
            stripes.polygon([(k, 0), (k + period // 2, 0), (k + period // 2 - side, side), (k - side, side)], fill=dark)
    image.paste(patch, (x, y), mask)


def render(scene: Scene) -> Image.Image:
    """The scene as an RGB image: background, then the objects in order."""
    image = Image.fromarray(_background_pixels(scene.background, scene.width, scene.height), "RGB")
    for obj in scene.objects:
        _draw(image, obj)
    return image
