"""The words shared by every language template of the shapes world: number words and
spatial relations, phrases naming an object (and which ones name it unambiguously), the
relation test on box centres, and sampling distinct texts from template generators."""

from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

from pipeline.synthetic.scenes import Background, Scene, SceneObject, pick

NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six")
RELATIONS = ("left of", "right of", "above", "below")
RELATION_WORDS = {
    "left of": ("left of", "to the left of"),
    "right of": ("right of", "to the right of"),
    "above": ("above", "over"),
    "below": ("below", "under", "beneath"),
}
ATTRIBUTE_ORDER = ("size", "texture", "color")
# Attribute sets tried, simplest first, to name one object unambiguously.
DESCRIPTIONS = (
    (),
    ("color",),
    ("size",),
    ("texture",),
    ("size", "color"),
    ("texture", "color"),
    ("size", "texture", "color"),
)


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


def matches(obj: SceneObject, other: SceneObject, attrs: Iterable[str]) -> bool:
    return other.shape == obj.shape and all(getattr(other, a) == getattr(obj, a) for a in attrs)


def unique_descriptions(scene: Scene, obj: SceneObject, exclude: Iterable[str] = ()) -> list[tuple[str, ...]]:
    """The attribute sets (simplest first) whose phrase names only `obj` in the scene."""
    exclude = set(exclude)
    return [
        attrs
        for attrs in DESCRIPTIONS
        if not exclude & set(attrs) and sum(matches(obj, o, attrs) for o in scene.objects) == 1
    ]


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


def shape_counts(scene: Scene) -> Counter:
    return Counter(o.shape for o in scene.objects)


def sample_texts(generators: Sequence[Callable], scene, rng: np.random.Generator, k: int, key: Callable) -> list:
    """Up to `k` distinct results of randomly chosen generators (each may return None)."""
    out, seen = [], set()
    for _ in range(4 * k):
        if len(out) == k:
            break
        item = pick(rng, generators)(scene, rng)
        if item is not None and key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


def clear_pairs(scene: Scene, holds: bool = True) -> list[tuple[SceneObject, SceneObject, str]]:
    objs = scene.objects
    return [
        (a, b, rel)
        for a in objs
        for b in objs
        if a is not b
        for rel in RELATIONS
        if relation(a, b, rel, scene.margin) is holds
    ]


def only_related(scene: Scene, ref: SceneObject, rel: str, candidates: Iterable[SceneObject]) -> Optional[SceneObject]:
    """The one candidate clearly `rel` the reference when every other one is clearly not."""
    verdicts = [(o, relation(o, ref, rel, scene.margin)) for o in candidates if o is not ref]
    hits = [o for o, v in verdicts if v]
    return hits[0] if len(hits) == 1 and all(v is not None for _, v in verdicts) else None
