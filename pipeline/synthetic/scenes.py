"""The shapes world's vocabulary and its scenes.

The vocabulary (shapes, colours, sizes, textures, background colours and the gradients
between them), the scene types (`Scene`, `SceneObject`, `Background`), random scene sampling
under the occlusion rule (`generate_scene`) and scenes as JSON (the ground-truth files).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

SHAPES = ("circle", "square", "triangle", "diamond", "star")
COLORS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "gray")
SIZES = ("small", "large")
TEXTURES = ("plain", "striped")
RGB = {
    "red": (220, 30, 30),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (240, 220, 30),
    "purple": (140, 50, 180),
    "orange": (245, 140, 20),
    "white": (250, 250, 250),
    "gray": (128, 128, 128),
}
SIZE_RANGE = {"small": (0.11, 0.17), "large": (0.25, 0.375)}  # side of the shape's box / image side
# Background colours, each at least ~95 RGB units from every object colour.
BACKGROUNDS = {
    "beige": (215, 195, 150),
    "light blue": (160, 200, 235),
    "mint": (170, 225, 190),
    "navy": (20, 30, 70),
    "brown": (110, 70, 40),
    "teal": (20, 110, 130),
    "pink": (235, 170, 190),
}
IMAGE_SIZE = 256
MAX_OBJECTS = 6
MAX_COVER = 0.3  # a new object may cover at most this fraction of an earlier object's box
PLACEMENT_TRIES = 100


def _min_distance_to_objects(rgb: np.ndarray) -> float:
    return float(min(np.linalg.norm(rgb - np.array(c, float)) for c in RGB.values()))


# Gradients only between background colours whose every blend stays far from object colours.
GRADIENTS = tuple(
    (a, b)
    for a, b in itertools.combinations(BACKGROUNDS, 2)
    if min(
        _min_distance_to_objects(np.array(BACKGROUNDS[a], float) * (1 - t) + np.array(BACKGROUNDS[b], float) * t)
        for t in np.linspace(0, 1, 21)
    )
    >= 75
)


def object_names() -> list[str]:
    """Detector object classes (objects.txt order)."""
    return list(SHAPES)


def attribute_names() -> list[str]:
    """Detector attribute classes (attributes.txt order)."""
    return [*COLORS, *SIZES, *TEXTURES]


# --------------------------------------------------------------------------- scenes


@dataclass(frozen=True)
class Background:
    kind: str  # "solid" | "vertical" | "horizontal" (gradients, colors[0] at top/left)
    colors: tuple[str, str]  # BACKGROUNDS names; equal for "solid"
    noise: float  # std of the added Gaussian pixel noise (0: none)
    seed: int  # of the noise


@dataclass(frozen=True)
class SceneObject:
    shape: str
    color: str
    size: str
    texture: str
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels, tight around the drawn shape

    @property
    def center(self) -> tuple[float, float]:
        return (self.box[0] + self.box[2]) / 2, (self.box[1] + self.box[3]) / 2


@dataclass(frozen=True)
class Scene:
    width: int
    height: int
    background: Background
    objects: tuple[SceneObject, ...]

    @property
    def margin(self) -> float:
        """Centre distance below which a spatial relation is considered unclear (never stated)."""
        return 0.05 * max(self.width, self.height)


def _area(box: Sequence[float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def _intersection(a: Sequence[float], b: Sequence[float]) -> float:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def occlusion_ok(box: Sequence[float], earlier: Iterable[Sequence[float]]) -> bool:
    """The placement rule: `box` covers at most MAX_COVER of each earlier box and is not inside one."""
    for e in earlier:
        inside = e[0] <= box[0] and e[1] <= box[1] and box[2] <= e[2] and box[3] <= e[3]
        if inside or _intersection(box, e) > MAX_COVER * _area(e):
            return False
    return True


def pick(rng: np.random.Generator, options: Sequence):
    """One of `options`, uniformly: the draw behind every random choice of the world."""
    return options[int(rng.integers(len(options)))]


def _background(rng: np.random.Generator) -> Background:
    kind = pick(rng, ("solid", "solid", "vertical", "horizontal"))
    if kind == "solid":
        name = pick(rng, tuple(BACKGROUNDS))
        colors = (name, name)
    else:
        colors = pick(rng, GRADIENTS)
        colors = colors[::-1] if rng.random() < 0.5 else colors
    noise = float(pick(rng, (0.0, 0.0, 4.0, 8.0)))
    return Background(kind, colors, noise, int(rng.integers(2**31)))


def generate_scene(rng: np.random.Generator, size: int = IMAGE_SIZE, textures: bool = True) -> Scene:
    """A random scene: 1-6 objects placed in drawing order under the occlusion rule."""
    objects: list[SceneObject] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        # Repeat an earlier shape now and then, so counts above one are common.
        shape = pick(rng, [o.shape for o in objects]) if objects and rng.random() < 0.35 else pick(rng, SHAPES)
        color, size_name = pick(rng, COLORS), pick(rng, SIZES)
        texture = pick(rng, TEXTURES) if textures else "plain"
        lo, hi = SIZE_RANGE[size_name]
        for _ in range(PLACEMENT_TRIES):
            side = int(rng.integers(round(lo * size), round(hi * size) + 1))
            x, y = (int(v) for v in rng.integers(0, size - side + 1, 2))
            box = (float(x), float(y), float(x + side), float(y + side))
            if occlusion_ok(box, [o.box for o in objects]):
                objects.append(SceneObject(shape, color, size_name, texture, box))
                break
    return Scene(size, size, _background(rng), tuple(objects))


def scene_to_json(scene: Scene, name: str) -> dict:
    return {
        "image": name,
        "width": scene.width,
        "height": scene.height,
        "background": asdict(scene.background),
        "objects": [
            {"box": list(o.box), "shape": o.shape, "color": o.color, "size": o.size, "texture": o.texture}
            for o in scene.objects
        ],
    }


def scene_from_json(obj: dict) -> Scene:
    bg = obj["background"]
    return Scene(
        int(obj["width"]),
        int(obj["height"]),
        Background(bg["kind"], tuple(bg["colors"]), float(bg["noise"]), int(bg["seed"])),
        tuple(
            SceneObject(o["shape"], o["color"], o["size"], o["texture"], tuple(float(v) for v in o["box"]))
            for o in obj["objects"]
        ),
    )
