"""Referring expressions of a scene: each names exactly one object (by attributes, by
position in its group, or by its relation to another object)."""

from __future__ import annotations

import numpy as np

from pipeline.synthetic.scenes import Scene, SceneObject, pick
from pipeline.synthetic.words import (
    RELATION_WORDS,
    RELATIONS,
    matches,
    only_related,
    phrase,
    relation,
    unique_descriptions,
)

POSITION_WORDS = {
    "left of": ("on the left", "leftmost"),
    "right of": ("on the right", "rightmost"),
    "above": ("at the top", "topmost"),
    "below": ("at the bottom", "bottommost"),
}


def _positional(scene: Scene, obj: SceneObject) -> list[str]:
    """'the red circle on the left', 'the leftmost circle': obj is clearly the extreme of its group."""
    out = []
    for attrs in ((), ("color",)):
        group = [o for o in scene.objects if matches(obj, o, attrs)]
        for rel, (pair_words, extreme) in POSITION_WORDS.items():
            if len(group) > 1 and all(relation(obj, o, rel, scene.margin) for o in group if o is not obj):
                out.append(
                    f"the {phrase(obj, attrs)} {pair_words}"
                    if len(group) == 2
                    else f"the {extreme} {phrase(obj, attrs)}"
                )
    return out


def _relational(scene: Scene, obj: SceneObject) -> list[str]:
    """'the circle left of the blue square': the only object of its shape clearly so placed."""
    same_shape = [o for o in scene.objects if o.shape == obj.shape]
    out = []
    for ref in scene.objects:
        ref_names = unique_descriptions(scene, ref)
        for rel in RELATIONS:
            if ref_names and only_related(scene, ref, rel, same_shape) is obj:
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
            out += [(obj, pick(rng, texts)) for texts in (_positional(scene, obj), _relational(scene, obj)) if texts]
    return out
