"""Visual Genome-style region descriptions of a scene: short phrases, each about one region
of the image and true of it, with the region's box.

Per object, one phrase naming it by its colour and shape, with its size and texture at times
("a large red circle", "striped blue square", "the triangle is yellow"), boxed by the object;
then, when another object is clearly placed relative to it, one relation phrase about it and
its nearest such neighbour ("a red circle left of a blue square"), boxed by both. These are
what LXMERT pretrains on from Visual Genome besides COCO's whole-scene captions.
"""

from __future__ import annotations

import numpy as np

from pipeline.synthetic.scenes import Scene, SceneObject, pick
from pipeline.synthetic.words import RELATION_WORDS, RELATIONS, article, phrase, relation

Box = tuple[float, float, float, float]


def _object_phrase(obj: SceneObject, rng: np.random.Generator) -> str:
    attrs = ["color"] + [
        a for a, p in (("size", 0.4), ("texture", 0.4 if obj.texture == "striped" else 0.1)) if rng.random() < p
    ]
    words = phrase(obj, attrs)
    return pick(rng, (article(words), words, f"the {obj.shape} is {obj.color}", f"{article(words)} in the picture"))


def _nearest_relation(scene: Scene, obj: SceneObject) -> tuple[SceneObject, str] | None:
    """The nearest other object with a relation of `obj` to it that is clear (centres apart
    by more than the scene's margin), and the first such relation."""
    best = None
    for other in scene.objects:
        if other is obj:
            continue
        clear = [rel for rel in RELATIONS if relation(obj, other, rel, scene.margin)]
        if clear:
            d = float(np.hypot(obj.center[0] - other.center[0], obj.center[1] - other.center[1]))
            if best is None or d < best[0]:
                best = (d, other, clear[0])
    return None if best is None else (best[1], best[2])


def _union(a: Box, b: Box) -> Box:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def region_descriptions(scene: Scene, rng: np.random.Generator) -> list[tuple[Box, str]]:
    """(box x1 y1 x2 y2 in pixels, phrase) per region, objects in scene order, each object's
    phrase before its relation phrase."""
    out: list[tuple[Box, str]] = []
    for obj in scene.objects:
        out.append((obj.box, _object_phrase(obj, rng)))
        related = _nearest_relation(scene, obj)
        if related:
            other, rel = related
            a, b = (article(phrase(o, ["color"])) for o in (obj, other))
            text = f"{a} {pick(rng, RELATION_WORDS[rel])} {b}"
            out.append((_union(obj.box, other.box), text))
    return out
