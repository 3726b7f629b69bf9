"""Captions of a scene (COCO-style): relations, counts, colours, unique objects, totals —
every caption true of the scene."""

from __future__ import annotations

from collections import Counter
from typing import Optional

import numpy as np

from pipeline.synthetic.scenes import Scene, pick
from pipeline.synthetic.words import (
    NUMBER_WORDS,
    RELATION_WORDS,
    article,
    background_words,
    clear_pairs,
    count_phrase,
    join_words,
    mention,
    sample_texts,
    shape_counts,
)


def _caption_relation(scene: Scene, rng: np.random.Generator) -> Optional[str]:
    pairs = clear_pairs(scene)
    if not pairs:
        return None
    a, b, rel = pick(rng, pairs)
    text = f"{article(mention(scene, a))} {pick(rng, RELATION_WORDS[rel])} {article(mention(scene, b))}"
    frame = pick(rng, ("{}", "a picture with {}", "an image showing {}", "{} on a {bg} background"))
    return frame.format(text, bg=background_words(scene.background))


def _caption_counts(scene: Scene, rng: np.random.Generator) -> str:
    counts = shape_counts(scene)
    shapes = [str(s) for s in rng.permutation(sorted(counts))][:3]
    parts = [
        article(mention(scene, next(o for o in scene.objects if o.shape == s)))
        if counts[s] == 1
        else count_phrase(counts[s], s)
        for s in shapes
    ]
    listed = join_words(parts)
    verb = "there is" if len(parts) == 1 and counts[shapes[0]] == 1 else "there are"
    return pick(
        rng,
        (
            f"{verb} {listed}",
            listed,
            f"a picture of {listed}",
            f"{listed} on a {background_words(scene.background)} background",
        ),
    )


def _caption_colors(scene: Scene, rng: np.random.Generator) -> Optional[str]:
    counts = shape_counts(scene)
    repeated = sorted(s for s, n in counts.items() if n > 1)
    if not repeated:
        return None
    shape = pick(rng, repeated)
    colors = Counter(o.color for o in scene.objects if o.shape == shape)
    if len(colors) == 1:
        parts = ("both " if counts[shape] == 2 else "all ") + next(iter(colors))
    else:
        by_count = sorted(colors.items(), key=lambda kv: (-kv[1], kv[0]))
        parts = join_words([f"{NUMBER_WORDS[n]} {c}" for c, n in by_count])
    return f"{count_phrase(counts[shape], shape)}, {parts}"


def _caption_unique(scene: Scene, rng: np.random.Generator) -> Optional[str]:
    counts = shape_counts(scene)
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
        return pick(
            rng, (f"a single {obj} on a {bg} background", f"one {obj}", f"{article(bg)} background with {article(obj)}")
        )
    n = NUMBER_WORDS[len(scene.objects)]
    return pick(
        rng, (f"{n} shapes on a {bg} background", f"{n} colorful shapes", f"{article(bg)} background with {n} shapes")
    )


CAPTION_GENERATORS = (
    _caption_relation,
    _caption_relation,
    _caption_counts,
    _caption_colors,
    _caption_unique,
    _caption_total,
)


def captions(scene: Scene, rng: np.random.Generator, k: int = 5) -> list[str]:
    """Up to `k` distinct captions (at least one), all true of the scene."""
    out = sample_texts(CAPTION_GENERATORS, scene, rng, k, key=lambda t: t)
    return out or [_caption_total(scene, rng)]
