"""The shapes world: a deterministic synthetic vision-and-language data set (offline demo data).

Scenes of 1-6 coloured shapes on varied backgrounds, drawn with PIL, and language that is
true of each scene, generated from templates: captions, VQA-style question-answer pairs with
10 annotator answers, unambiguous referring expressions with their boxes, and NLVR2-style
statements about pairs of scenes. `write_world` writes it all in the official file formats
our readers take (Conceptual Captions TSVs, COCO captions, VQA v2, NLVR2) plus detector
ground truth. The same seed gives byte-identical files.

Layout written by `write_world` (split s = train | val; image i is 0-based within s):

    images/shapes_<s>_<i:08d>.jpg                   256x256 RGB JPEG, quality 90
    Train_GCC-training.tsv, Validation_GCC-1.1.0-Validation.tsv
                                                    caption<TAB>url, one row per image
    annotations/captions_<s>2014.json               COCO captions, image id i+1
    annotations/v2_OpenEnded_mscoco_<s>2014_questions.json, v2_mscoco_<s>2014_annotations.json
    annotations/refexp_<s>.json                     [{"image", "box", "sentence"}]
    annotations/nlvr2_<train|dev>.json              NLVR2 JSON lines, pairs within the split
    annotations/scenes_<s>.json                     ground truth (see load_scenes)
    image_map.tsv                                   COCO_<s>2014_<i+1:012d><TAB>cc3m-<s>-<i:08d>
    objects.txt, attributes.txt                     detector vocabularies
    summary.json                                    counts, seed, vocab; written last
    .vlprep-output.json                             ownership marker: a later run may replace this folder
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
from PIL import Image, ImageDraw

from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json, replacing_output

SHAPES = ("circle", "square", "triangle", "diamond", "star")
COLORS = ("red", "green", "blue", "yellow", "purple", "orange", "white", "gray")
SIZES = ("small", "large")
TEXTURES = ("plain", "striped")
RGB = {
    "red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 220), "yellow": (240, 220, 30),
    "purple": (140, 50, 180), "orange": (245, 140, 20), "white": (250, 250, 250), "gray": (128, 128, 128),
}
SIZE_RANGE = {"small": (0.11, 0.17), "large": (0.25, 0.375)}  # side of the shape's box / image side
# Background colours, each at least ~95 RGB units from every object colour.
BACKGROUNDS = {
    "beige": (215, 195, 150), "light blue": (160, 200, 235), "mint": (170, 225, 190), "navy": (20, 30, 70),
    "brown": (110, 70, 40), "teal": (20, 110, 130), "pink": (235, 170, 190),
}
IMAGE_SIZE = 256
JPEG_QUALITY = 90
MAX_OBJECTS = 6
MAX_COVER = 0.3  # a new object may cover at most this fraction of an earlier object's box
PLACEMENT_TRIES = 100
NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six")
RELATIONS = ("left of", "right of", "above", "below")
RELATION_WORDS = {"left of": ("left of", "to the left of"), "right of": ("right of", "to the right of"),
                  "above": ("above", "over"), "below": ("below", "under", "beneath")}


def _min_distance_to_objects(rgb: np.ndarray) -> float:
    return float(min(np.linalg.norm(rgb - np.array(c, float)) for c in RGB.values()))


# Gradients only between background colours whose every blend stays far from object colours.
GRADIENTS = tuple(
    (a, b) for a, b in itertools.combinations(BACKGROUNDS, 2)
    if min(_min_distance_to_objects(np.array(BACKGROUNDS[a], float) * (1 - t) + np.array(BACKGROUNDS[b], float) * t)
           for t in np.linspace(0, 1, 21)) >= 75
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


def _pick(rng: np.random.Generator, options: Sequence):
    return options[int(rng.integers(len(options)))]


def _background(rng: np.random.Generator) -> Background:
    kind = _pick(rng, ("solid", "solid", "vertical", "horizontal"))
    if kind == "solid":
        name = _pick(rng, tuple(BACKGROUNDS))
        colors = (name, name)
    else:
        colors = _pick(rng, GRADIENTS)
        colors = colors[::-1] if rng.random() < 0.5 else colors
    noise = float(_pick(rng, (0.0, 0.0, 4.0, 8.0)))
    return Background(kind, colors, noise, int(rng.integers(2**31)))


def generate_scene(rng: np.random.Generator, size: int = IMAGE_SIZE, textures: bool = True) -> Scene:
    """A random scene: 1-6 objects placed in drawing order under the occlusion rule."""
    objects: list[SceneObject] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        # Repeat an earlier shape now and then, so counts above one are common.
        shape = _pick(rng, [o.shape for o in objects]) if objects and rng.random() < 0.35 else _pick(rng, SHAPES)
        color, size_name = _pick(rng, COLORS), _pick(rng, SIZES)
        texture = _pick(rng, TEXTURES) if textures else "plain"
        lo, hi = SIZE_RANGE[size_name]
        for _ in range(PLACEMENT_TRIES):
            side = int(rng.integers(round(lo * size), round(hi * size) + 1))
            x, y = (int(v) for v in rng.integers(0, size - side + 1, 2))
            box = (float(x), float(y), float(x + side), float(y + side))
            if occlusion_ok(box, [o.box for o in objects]):
                objects.append(SceneObject(shape, color, size_name, texture, box))
                break
    return Scene(size, size, _background(rng), tuple(objects))


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


def scene_to_json(scene: Scene, name: str) -> dict:
    return {"image": name, "width": scene.width, "height": scene.height,
            "background": asdict(scene.background),
            "objects": [{"box": list(o.box), "shape": o.shape, "color": o.color, "size": o.size, "texture": o.texture}
                        for o in scene.objects]}


def scene_from_json(obj: dict) -> Scene:
    bg = obj["background"]
    return Scene(int(obj["width"]), int(obj["height"]),
                 Background(bg["kind"], tuple(bg["colors"]), float(bg["noise"]), int(bg["seed"])),
                 tuple(SceneObject(o["shape"], o["color"], o["size"], o["texture"], tuple(float(v) for v in o["box"]))
                       for o in obj["objects"]))


# --------------------------------------------------------------------------- language helpers

ATTRIBUTE_ORDER = ("size", "texture", "color")
# Attribute sets tried, simplest first, to name one object unambiguously.
DESCRIPTIONS = ((), ("color",), ("size",), ("texture",), ("size", "color"), ("texture", "color"),
                ("size", "texture", "color"))


def plural(shape: str) -> str:
    return shape + "s"


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def count_phrase(n: int, shape: str) -> str:
    return f"{NUMBER_WORDS[n]} {shape if n == 1 else plural(shape)}"


def join_words(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def phrase(obj: SceneObject, attrs: Iterable[str]) -> str:
    """'large striped red circle' for attrs (size, texture, color)."""
    attrs = set(attrs)
    return " ".join([getattr(obj, a) for a in ATTRIBUTE_ORDER if a in attrs] + [obj.shape])


def _matches(obj: SceneObject, other: SceneObject, attrs: Iterable[str]) -> bool:
    return other.shape == obj.shape and all(getattr(other, a) == getattr(obj, a) for a in attrs)


def unique_descriptions(scene: Scene, obj: SceneObject, exclude: Iterable[str] = ()) -> list[tuple[str, ...]]:
    """The attribute sets (simplest first) whose phrase names only `obj` in the scene."""
    exclude = set(exclude)
    return [attrs for attrs in DESCRIPTIONS if not exclude & set(attrs)
            and sum(_matches(obj, o, attrs) for o in scene.objects) == 1]


def relation(a: SceneObject, b: SceneObject, rel: str, margin: float) -> Optional[bool]:
    """Is `a` rel `b` (box centres)? None when the centres are within `margin` (unclear)."""
    (ax, ay), (bx, by) = a.center, b.center
    d = {"left of": bx - ax, "right of": ax - bx, "above": by - ay, "below": ay - by}[rel]
    return True if d > margin else False if d < -margin else None


def mention(scene: Scene, obj: SceneObject) -> str:
    """How captions name an object: colour always, size only when another object of its
    shape has the other size, 'striped' when it is."""
    others = [o for o in scene.objects if o is not obj and o.shape == obj.shape]
    attrs = ["color"] + (["size"] if any(o.size != obj.size for o in others) else [])
    return phrase(obj, attrs + (["texture"] if obj.texture == "striped" else []))


def background_words(bg: Background) -> str:
    words = bg.colors[0] if bg.kind == "solid" else f"{bg.colors[0]} to {bg.colors[1]} gradient"
    return ("noisy " if bg.noise >= 8 else "") + words


def _shape_counts(scene: Scene) -> Counter:
    return Counter(o.shape for o in scene.objects)


def _sample_texts(generators: Sequence[Callable], scene, rng: np.random.Generator, k: int, key: Callable) -> list:
    """Up to `k` distinct results of randomly chosen generators (each may return None)."""
    out, seen = [], set()
    for _ in range(4 * k):
        if len(out) == k:
            break
        item = _pick(rng, generators)(scene, rng)
        if item is not None and key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


def _clear_pairs(scene: Scene, holds: bool = True) -> list[tuple[SceneObject, SceneObject, str]]:
    objs = scene.objects
    return [(a, b, rel) for a in objs for b in objs if a is not b for rel in RELATIONS
            if relation(a, b, rel, scene.margin) is holds]


# --------------------------------------------------------------------------- captions


def _caption_relation(scene: Scene, rng: np.random.Generator) -> Optional[str]:
    pairs = _clear_pairs(scene)
    if not pairs:
        return None
    a, b, rel = _pick(rng, pairs)
    text = f"{article(mention(scene, a))} {_pick(rng, RELATION_WORDS[rel])} {article(mention(scene, b))}"
    frame = _pick(rng, ("{}", "a picture with {}", "an image showing {}", "{} on a {bg} background"))
    return frame.format(text, bg=background_words(scene.background))


def _caption_counts(scene: Scene, rng: np.random.Generator) -> str:
    counts = _shape_counts(scene)
    shapes = [str(s) for s in rng.permutation(sorted(counts))][:3]
    parts = [article(mention(scene, next(o for o in scene.objects if o.shape == s))) if counts[s] == 1
             else count_phrase(counts[s], s) for s in shapes]
    listed = join_words(parts)
    verb = "there is" if len(parts) == 1 and counts[shapes[0]] == 1 else "there are"
    return _pick(rng, (f"{verb} {listed}", listed, f"a picture of {listed}",
                       f"{listed} on a {background_words(scene.background)} background"))


def _caption_colors(scene: Scene, rng: np.random.Generator) -> Optional[str]:
    counts = _shape_counts(scene)
    repeated = sorted(s for s, n in counts.items() if n > 1)
    if not repeated:
        return None
    shape = _pick(rng, repeated)
    colors = Counter(o.color for o in scene.objects if o.shape == shape)
    if len(colors) == 1:
        parts = ("both " if counts[shape] == 2 else "all ") + next(iter(colors))
    else:
        by_count = sorted(colors.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = join_words([f"{NUMBER_WORDS[n]} {c}" for c, n in by_count])
    return f"{count_phrase(counts[shape], shape)}, {parts}"


def _caption_unique(scene: Scene, rng: np.random.Generator) -> Optional[str]:
    counts = _shape_counts(scene)
    singles = [o for o in scene.objects if counts[o.shape] == 1]
    if not singles:
        return None
    chosen = [singles[int(i)] for i in sorted(rng.permutation(len(singles))[:2])]
    the = "the only" if len(scene.objects) > 1 and rng.random() < 0.3 else "the"
    return " and ".join(f"{the} {o.shape} is {o.color}" for o in chosen)


def _caption_total(scene: Scene, rng: np.random.Generator) -> str:
    bg = background_words(scene.background)
    if len(scene.objects) == 1:
        obj = mention(scene, scene.objects[0])
        return _pick(rng, (f"a single {obj} on a {bg} background", f"one {obj}",
                           f"{article(bg)} background with {article(obj)}"))
    n = NUMBER_WORDS[len(scene.objects)]
    return _pick(rng, (f"{n} shapes on a {bg} background", f"{n} colorful shapes",
                       f"{article(bg)} background with {n} shapes"))


CAPTION_GENERATORS = (_caption_relation, _caption_relation, _caption_counts, _caption_colors, _caption_unique,
                      _caption_total)


def captions(scene: Scene, rng: np.random.Generator, k: int = 5) -> list[str]:
    """Up to `k` distinct captions (at least one), all true of the scene."""
    out = _sample_texts(CAPTION_GENERATORS, scene, rng, k, key=lambda t: t)
    return out or [_caption_total(scene, rng)]


# --------------------------------------------------------------------------- questions


@dataclass(frozen=True)
class QA:
    question: str
    answer: str
    question_type: str  # the question's opening words, as in VQA
    answer_type: str  # "yes/no" | "number" | "other"


def _yes_no(value: bool) -> str:
    return "yes" if value else "no"


def _named(scene: Scene, obj: SceneObject, rng: np.random.Generator, exclude: Iterable[str] = ()) -> Optional[str]:
    """An unambiguous phrase for `obj` (one of its two simplest), or None."""
    options = unique_descriptions(scene, obj, exclude)[:2]
    return phrase(obj, _pick(rng, options)) if options else None


def _question_color(scene: Scene, rng: np.random.Generator) -> Optional[QA]:
    askable = [o for o in scene.objects if unique_descriptions(scene, o, exclude=("color",))]
    if not askable:
        return None
    obj = _pick(rng, askable)
    name = _named(scene, obj, rng, exclude=("color",))
    frame, qtype = _pick(rng, (("what color is the {}?", "what color is the"),
                               ("what is the color of the {}?", "what is the color of the"),
                               ("which color does the {} have?", "which color")))
    return QA(frame.format(name), obj.color, qtype, "other")


def _question_count(scene: Scene, rng: np.random.Generator) -> QA:
    kind = rng.random()
    if kind < 0.6:
        shape = _pick(rng, [o.shape for o in scene.objects]) if rng.random() < 0.8 else _pick(rng, SHAPES)
        subject, n = plural(shape), _shape_counts(scene)[shape]
    elif kind < 0.85:
        color = _pick(rng, COLORS)
        subject, n = f"{color} shapes", sum(o.color == color for o in scene.objects)
    else:
        subject, n = _pick(rng, ("shapes", "objects")), len(scene.objects)
    frame = _pick(rng, ("how many {} are there?", "how many {} are in the image?", "how many {} can you see?"))
    return QA(frame.format(subject), str(n), "how many", "number")


def _question_exists(scene: Scene, rng: np.random.Generator) -> QA:
    with_color = rng.random() < 0.7
    present = {(o.color if with_color else "", o.shape) for o in scene.objects}
    combos = [(c, s) for c in (COLORS if with_color else ("",)) for s in SHAPES]
    answer = rng.random() < 0.5
    pool = sorted(present) if answer else [c for c in combos if c not in present]
    if not pool:  # every shape is present: this question has to be a yes
        pool, answer = sorted(present), True
    color, shape = _pick(rng, pool)
    what = f"{color} {shape}".strip()
    if rng.random() < 0.7:
        return QA(f"is there {article(what)}{_pick(rng, ('', ' in the image', ' in the picture'))}?",
                  _yes_no(answer), "is there a", "yes/no")
    return QA(f"are there any {plural(what)}?", _yes_no(answer), "are there", "yes/no")


def _question_compare(scene: Scene, rng: np.random.Generator) -> Optional[QA]:
    if rng.random() < 0.5:
        named = [o for o in scene.objects if unique_descriptions(scene, o, exclude=("size",))]
        pairs = [(a, b) for a in named for b in named if a.size != b.size]
        if not pairs:
            return None
        a, b = _pick(rng, pairs)
        name_a, name_b = _named(scene, a, rng, exclude=("size",)), _named(scene, b, rng, exclude=("size",))
        word = _pick(rng, ("larger", "bigger", "smaller"))
        answer = (a.size == "large") == (word != "smaller")
        return QA(f"is the {name_a} {word} than the {name_b}?", _yes_no(answer), "is the", "yes/no")
    counts = _shape_counts(scene)
    pool = sorted(counts) if len(counts) > 1 and rng.random() < 0.7 else SHAPES  # mostly shapes in view
    shapes = [str(s) for s in rng.permutation(pool)[:2]]
    word = _pick(rng, ("more", "fewer"))
    answer = counts[shapes[0]] > counts[shapes[1]] if word == "more" else counts[shapes[0]] < counts[shapes[1]]
    return QA(f"are there {word} {plural(shapes[0])} than {plural(shapes[1])}?", _yes_no(answer), "are there", "yes/no")


def _only_related(scene: Scene, ref: SceneObject, rel: str, candidates: Iterable[SceneObject]) -> Optional[SceneObject]:
    """The one candidate clearly `rel` the reference when every other one is clearly not."""
    verdicts = [(o, relation(o, ref, rel, scene.margin)) for o in candidates if o is not ref]
    hits = [o for o, v in verdicts if v]
    return hits[0] if len(hits) == 1 and all(v is not None for _, v in verdicts) else None


def _question_spatial(scene: Scene, rng: np.random.Generator) -> Optional[QA]:
    if rng.random() < 0.5:
        askable = [(ref, rel, target) for ref in scene.objects if unique_descriptions(scene, ref) for rel in RELATIONS
                   if (target := _only_related(scene, ref, rel, scene.objects)) is not None]
        if not askable:
            return None
        ref, rel, target = _pick(rng, askable)
        ref_name = _named(scene, ref, rng)
        words = _pick(rng, RELATION_WORDS[rel])
        if rng.random() < 0.7:
            frame = _pick(rng, ("what shape is {} the {}?", "which shape is {} the {}?"))
            return QA(frame.format(words, ref_name), target.shape, frame.split(" {}")[0], "other")
        return QA(f"what color is the shape {words} the {ref_name}?", target.color, "what color is the", "other")
    pairs = _clear_pairs(scene, True) + _clear_pairs(scene, False)
    if not pairs:
        return None
    a, b, rel = _pick(rng, pairs)
    name_a, name_b = _named(scene, a, rng), _named(scene, b, rng)
    if name_a is None or name_b is None:
        return None
    answer = _yes_no(bool(relation(a, b, rel, scene.margin)))
    return QA(f"is the {name_a} {_pick(rng, RELATION_WORDS[rel])} the {name_b}?", answer, "is the", "yes/no")


QUESTION_GENERATORS = (_question_color, _question_count, _question_exists, _question_exists, _question_compare,
                       _question_spatial)


def questions(scene: Scene, rng: np.random.Generator, k: int = 6) -> list[QA]:
    """Up to `k` distinct question-answer pairs, answers true of the scene."""
    return _sample_texts(QUESTION_GENERATORS, scene, rng, k, key=lambda qa: qa.question)


def _synonym(answer: str) -> str:
    """A differently written answer that the VQA normalization maps back to `answer`."""
    if answer.isdigit() and int(answer) < len(NUMBER_WORDS):
        return "zero" if answer == "0" else NUMBER_WORDS[int(answer)]
    if answer == "gray":
        return "grey"
    return f"a {answer}" if answer in SHAPES else answer.capitalize()


def _wrong(qa: QA, rng: np.random.Generator) -> str:
    if qa.answer_type == "yes/no":
        return "no" if qa.answer == "yes" else "yes"
    if qa.answer_type == "number":
        return str(int(qa.answer) + 1)
    vocab = COLORS if qa.answer in COLORS else SHAPES
    return _pick(rng, [v for v in vocab if v != qa.answer])


def annotator_answers(qa: QA, rng: np.random.Generator, n: int = 10) -> list[dict]:
    """`n` VQA-style answers: mostly the true one, some written differently, rarely one wrong."""
    wrong = int(rng.integers(n)) if rng.random() < 0.3 else -1
    answers = []
    for i in range(n):
        text = _wrong(qa, rng) if i == wrong else _synonym(qa.answer) if rng.random() < 0.15 else qa.answer
        confidence = "maybe" if i == wrong or rng.random() < 0.05 else "yes"
        answers.append({"answer": text, "answer_confidence": confidence, "answer_id": i + 1})
    return answers


# --------------------------------------------------------------------------- referring expressions

POSITION_WORDS = {"left of": ("on the left", "leftmost"), "right of": ("on the right", "rightmost"),
                  "above": ("at the top", "topmost"), "below": ("at the bottom", "bottommost")}


def _positional(scene: Scene, obj: SceneObject) -> list[str]:
    """'the red circle on the left', 'the leftmost circle': obj is clearly the extreme of its group."""
    out = []
    for attrs in ((), ("color",)):
        group = [o for o in scene.objects if _matches(obj, o, attrs)]
        for rel, (pair_words, extreme) in POSITION_WORDS.items():
            if len(group) > 1 and all(relation(obj, o, rel, scene.margin) for o in group if o is not obj):
                out.append(f"the {phrase(obj, attrs)} {pair_words}" if len(group) == 2
                           else f"the {extreme} {phrase(obj, attrs)}")
    return out


def _relational(scene: Scene, obj: SceneObject) -> list[str]:
    """'the circle left of the blue square': the only object of its shape clearly so placed."""
    same_shape = [o for o in scene.objects if o.shape == obj.shape]
    out = []
    for ref in scene.objects:
        ref_names = unique_descriptions(scene, ref)
        for rel in RELATIONS:
            if ref_names and _only_related(scene, ref, rel, same_shape) is obj:
                out.append(f"the {obj.shape} {RELATION_WORDS[rel][0]} the {phrase(ref, ref_names[0])}")
    return out


def referring_expressions(scene: Scene, rng: np.random.Generator) -> list[tuple[SceneObject, str]]:
    """(target, expression) pairs, each expression naming exactly one object of the scene: per
    object its two simplest descriptions, and when its shape alone is ambiguous, one positional
    and one relational expression."""
    out = []
    for obj in scene.objects:
        out += [(obj, f"the {phrase(obj, attrs)}") for attrs in unique_descriptions(scene, obj)[:2]]
        if sum(o.shape == obj.shape for o in scene.objects) > 1:
            out += [(obj, _pick(rng, texts)) for texts in (_positional(scene, obj), _relational(scene, obj)) if texts]
    return out


# --------------------------------------------------------------------------- NLVR2-style statements


def _subject(scenes: Sequence[Scene], rng: np.random.Generator, with_color: bool) -> tuple[str, str]:
    """(color or '', shape), mostly taken from the scenes' objects."""
    objs = [o for s in scenes for o in s.objects]
    if rng.random() < 0.7:
        obj = _pick(rng, objs)
        return (obj.color if with_color else ""), obj.shape
    return (_pick(rng, COLORS) if with_color else ""), _pick(rng, SHAPES)


def _has(scene: Scene, color: str, shape: str) -> bool:
    return any(o.shape == shape and color in ("", o.color) for o in scene.objects)


def _sides(rng: np.random.Generator, left: Scene, right: Scene) -> tuple[str, str, Scene, Scene]:
    return ("left", "right", left, right) if rng.random() < 0.5 else ("right", "left", right, left)


def _statement_more(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    side, other, a, b = _sides(rng, left, right)
    word = _pick(rng, ("more", "fewer"))
    if rng.random() < 0.3:
        na, nb, things = len(a.objects), len(b.objects), "shapes"
    else:
        shape = _subject((left, right), rng, False)[1]
        na, nb, things = _shape_counts(a)[shape], _shape_counts(b)[shape], plural(shape)
    return f"the {side} image has {word} {things} than the {other} image", na > nb if word == "more" else na < nb


def _statement_both(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    if rng.random() < 0.5:
        color = _subject((left, right), rng, True)[0]
        truth = all(any(o.color == color for o in s.objects) for s in (left, right))
        return f"both images contain {article(color)} shape", truth
    color, shape = _subject((left, right), rng, rng.random() < 0.5)
    what = f"{color} {shape}".strip()
    if rng.random() < 0.5:
        return f"both images contain {article(what)}", _has(left, color, shape) and _has(right, color, shape)
    return f"neither image contains {article(what)}", not (_has(left, color, shape) or _has(right, color, shape))


def _statement_there_is(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    side, _, a, _ = _sides(rng, left, right)
    color, shape = _subject((left, right), rng, rng.random() < 0.5)
    return f"there is {article(f'{color} {shape}'.strip())} in the {side} image", _has(a, color, shape)


def _statement_exactly(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    side, _, a, _ = _sides(rng, left, right)
    shape = _subject((left, right), rng, False)[1]
    n = _shape_counts(a)[shape]
    claimed = max(1, n + int(_pick(rng, (-1, 0, 0, 1))))
    return f"the {side} image contains exactly {count_phrase(claimed, shape)}", claimed == n


STATEMENT_GENERATORS = (_statement_more, _statement_both, _statement_there_is, _statement_exactly)


def pair_statements(left: Scene, right: Scene, rng: np.random.Generator, k: int = 2) -> list[tuple[str, bool]]:
    """`k` distinct (statement, label) pairs about two scenes; labels drawn 50/50 (best effort)."""
    out: list[tuple[str, bool]] = []
    for _ in range(k):
        want, best = rng.random() < 0.5, None
        for _ in range(30):
            text, truth = _pick(rng, STATEMENT_GENERATORS)(left, right, rng)
            if text in {t for t, _ in out}:
                continue
            best = best or (text, truth)
            if truth == want:
                best = (text, truth)
                break
        if best:
            out.append(best)
    return out


# --------------------------------------------------------------------------- the world on disk


@dataclass(frozen=True)
class _Split:
    name: str  # our split name: image names, refexp/scenes files, CC ids
    index: int  # in the seed of every random stream
    coco: str  # COCO/VQA file split
    nlvr2: str  # NLVR2 file split
    tsv: str  # Conceptual Captions file


SPLITS = (_Split("train", 0, "train2014", "train", "Train_GCC-training.tsv"),
          _Split("val", 1, "val2014", "dev", "Validation_GCC-1.1.0-Validation.tsv"))
WORLD_KIND = "shapes world"  # the ownership marker's kind (pipeline.io.replacing_output)
STREAM_SCENE, STREAM_TEXT, STREAM_PAIR = 0, 1, 2


def image_name(split: str, i: int) -> str:
    return f"shapes_{split}_{i:08d}.jpg"


def coco_file_name(coco_split: str, image_id: int) -> str:
    return f"COCO_{coco_split}_{image_id:012d}.jpg"


def _rng(seed: int, split: _Split, index: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, split.index, index, stream])


def _dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj) + "\n", encoding="utf-8")


def _image_url(base_url: str, name: str) -> str:
    return f"{base_url.rstrip('/')}/images/{name}"


def _split_sizes(n_images: int, val_fraction: float) -> dict[str, int]:
    n_val = min(round(n_images * val_fraction), n_images - 1)
    return {"train": n_images - n_val, "val": n_val}


def write_cc_tsvs(world_dir: Path, base_url: str) -> None:
    """(Re)write the two Conceptual Captions TSVs of a world for another image base URL."""
    world_dir = Path(world_dir)
    for split in SPLITS:
        captions_json = json.loads((world_dir / "annotations" / f"captions_{split.coco}.json").read_text())
        first = {}
        for ann in captions_json["annotations"]:
            first.setdefault(ann["image_id"], ann["caption"])
        rows = [f"{first[i + 1]}\t{_image_url(base_url, image_name(split.name, i))}\n"
                for i in range(len(captions_json["images"]))]
        (world_dir / split.tsv).write_text("".join(rows), encoding="utf-8")


def _is_world(path: Path) -> bool:
    """A complete world written before the ownership marker existed: its summary.json says so."""
    try:
        return json.loads((path / "summary.json").read_text()).get("name") == "shapes"
    except (OSError, ValueError, AttributeError):
        return False


def _write_split(out: Path, split: _Split, n: int, seed: int, base_url: str, textures: bool,
                 progress: Optional[Callable[[int], None]]) -> dict:
    names, scenes, caption_anns, q_list, a_list, refexps = [], [], [], [], [], []
    for i in range(n):
        name = image_name(split.name, i)
        scene = generate_scene(_rng(seed, split, i, STREAM_SCENE), IMAGE_SIZE, textures)
        rng = _rng(seed, split, i, STREAM_TEXT)
        render(scene).save(out / "images" / name, "JPEG", quality=JPEG_QUALITY)
        names.append(name)
        scenes.append(scene)
        caption_anns += [{"id": len(caption_anns) + j + 1, "image_id": i + 1, "caption": c}
                         for j, c in enumerate(captions(scene, rng))]
        for j, qa in enumerate(questions(scene, rng)):
            qid = (i + 1) * 1000 + j
            q_list.append({"image_id": i + 1, "question": qa.question, "question_id": qid})
            a_list.append({"question_id": qid, "image_id": i + 1, "question_type": qa.question_type,
                           "answer_type": qa.answer_type, "multiple_choice_answer": qa.answer,
                           "answers": annotator_answers(qa, rng)})
        refexps += [{"image": name, "box": list(obj.box), "sentence": s} for obj, s in referring_expressions(scene, rng)]
        if progress:
            progress(1)
    statements = []
    for p in range(n if n > 1 else 0):
        rng = _rng(seed, split, p, STREAM_PAIR)
        left, right = (int(v) for v in rng.choice(n, 2, replace=False))
        for j, (text, label) in enumerate(pair_statements(scenes[left], scenes[right], rng)):
            statements.append({"identifier": f"{split.nlvr2}-{p}-0-{j}", "sentence": text,
                               "left_url": _image_url(base_url, names[left]),
                               "right_url": _image_url(base_url, names[right]), "label": str(label)})

    info = {"description": f"shapes world ({split.name} split), seed {seed}", "version": "1.0"}
    ann = out / "annotations"
    _dump(ann / f"captions_{split.coco}.json", {
        "info": info,
        "images": [{"id": i + 1, "file_name": coco_file_name(split.coco, i + 1), "width": s.width, "height": s.height,
                    "coco_url": _image_url(base_url, names[i])} for i, s in enumerate(scenes)],
        "annotations": caption_anns})
    _dump(ann / f"v2_OpenEnded_mscoco_{split.coco}_questions.json",
          {"info": info, "task_type": "Open-Ended", "data_type": "mscoco", "data_subtype": split.coco,
           "questions": q_list})
    _dump(ann / f"v2_mscoco_{split.coco}_annotations.json",
          {"info": info, "data_type": "mscoco", "data_subtype": split.coco, "annotations": a_list})
    _dump(ann / f"refexp_{split.name}.json", refexps)
    _dump(ann / f"scenes_{split.name}.json", [scene_to_json(s, names[i]) for i, s in enumerate(scenes)])
    (ann / f"nlvr2_{split.nlvr2}.json").write_text("".join(json.dumps(s) + "\n" for s in statements), encoding="utf-8")
    return {"images": n, "objects": sum(len(s.objects) for s in scenes), "captions": len(caption_anns),
            "questions": len(q_list), "refexps": len(refexps), "nlvr2_statements": len(statements),
            "nlvr2_true": sum(s["label"] == "True" for s in statements)}


def write_world(out: Path, n_images: int, seed: int, val_fraction: float = 0.1, base_url: str = "http://127.0.0.1:8000",
                textures: bool = True, progress: Optional[Callable[[int], None]] = None) -> dict:
    """Write a complete shapes world into `out` (layout in the module docstring); returns the summary.

    The world is built under a temporary name beside `out` and renamed into place when
    complete (`pipeline.io.replacing_output`): an earlier world in `out` is replaced; a
    non-empty folder that is not a world, `.`, a folder above the current one or a symbolic
    link is refused with a ConfigError before anything is written. summary.json is written
    last. `progress(1)` is called after each image.
    """
    if n_images < 1:
        raise ConfigError(f"--n-images must be at least 1 (got {n_images})")
    if not 0.0 <= val_fraction < 1.0:
        raise ConfigError(f"--val-fraction must be in [0, 1) (got {val_fraction})")
    if seed < 0:
        raise ConfigError(f"--seed must be non-negative (got {seed})")
    if not base_url.startswith(("http://", "https://")):
        raise ConfigError(f"--base-url must start with http:// or https:// (got {base_url!r})")
    with replacing_output(Path(out), WORLD_KIND, what="vlprep make-shapes", also_ours=_is_world) as tmp:
        (tmp / "images").mkdir(parents=True)
        (tmp / "annotations").mkdir()
        sizes = _split_sizes(n_images, val_fraction)
        splits = {s.name: _write_split(tmp, s, sizes[s.name], seed, base_url, textures, progress) for s in SPLITS}
        write_cc_tsvs(tmp, base_url)
        (tmp / "image_map.tsv").write_text("".join(
            f"{coco_file_name(s.coco, i + 1)[:-4]}\tcc3m-{s.name}-{i:08d}\n" for s in SPLITS for i in range(sizes[s.name])))
        (tmp / "objects.txt").write_text("".join(f"{n}\n" for n in object_names()))
        (tmp / "attributes.txt").write_text("".join(f"{n}\n" for n in attribute_names()))
        summary = {"name": "shapes", "seed": seed, "n_images": n_images, "val_fraction": val_fraction,
                   "textures": textures, "image_size": IMAGE_SIZE, "base_url": base_url, "splits": splits,
                   "vocab": {"objects": object_names(), "attributes": attribute_names()}}
        atomic_write_json(tmp / "summary.json", summary)
    return summary


def load_scenes(world_dir: Path, split: str) -> dict[str, Scene]:
    """The ground-truth scenes of a split ("train" or "val"), by image name, in image order."""
    path = Path(world_dir) / "annotations" / f"scenes_{split}.json"
    if not path.exists():
        raise ConfigError(f"{path} not found (is {world_dir} a shapes world? splits: train, val)")
    return {entry["image"]: scene_from_json(entry) for entry in json.loads(path.read_text(encoding="utf-8"))}
