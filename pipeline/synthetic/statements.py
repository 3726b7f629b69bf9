"""NLVR2-style statements about a pair of scenes (more/fewer, both/neither, there is,
exactly n) with their truth labels, drawn about 50/50."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipeline.synthetic.scenes import COLORS, SHAPES, Scene, pick
from pipeline.synthetic.words import article, count_phrase, plural, shape_counts


def _subject(scenes: Sequence[Scene], rng: np.random.Generator, with_color: bool) -> tuple[str, str]:
    """(color or '', shape), mostly taken from the scenes' objects."""
    objs = [o for s in scenes for o in s.objects]
    if rng.random() < 0.7:
        obj = pick(rng, objs)
        return (obj.color if with_color else ""), obj.shape
    return (pick(rng, COLORS) if with_color else ""), pick(rng, SHAPES)


def _has(scene: Scene, color: str, shape: str) -> bool:
    return any(o.shape == shape and color in ("", o.color) for o in scene.objects)


def _sides(rng: np.random.Generator, left: Scene, right: Scene) -> tuple[str, str, Scene, Scene]:
    return ("left", "right", left, right) if rng.random() < 0.5 else ("right", "left", right, left)


def _statement_more(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    side, other, a, b = _sides(rng, left, right)
    word = pick(rng, ("more", "fewer"))
    if rng.random() < 0.3:
        na, nb, things = len(a.objects), len(b.objects), "shapes"
    else:
        shape = _subject((left, right), rng, False)[1]
        na, nb, things = shape_counts(a)[shape], shape_counts(b)[shape], plural(shape)
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
    n = shape_counts(a)[shape]
    claimed = max(1, n + int(pick(rng, (-1, 0, 0, 1))))
    return f"the {side} image contains exactly {count_phrase(claimed, shape)}", claimed == n


STATEMENT_GENERATORS = (_statement_more, _statement_both, _statement_there_is, _statement_exactly)


def pair_statements(left: Scene, right: Scene, rng: np.random.Generator, k: int = 2) -> list[tuple[str, bool]]:
    """`k` distinct (statement, label) pairs about two scenes; labels drawn 50/50 (best effort)."""
    out: list[tuple[str, bool]] = []
    for _ in range(k):
        want, best = rng.random() < 0.5, None
        for _ in range(30):
            text, truth = pick(rng, STATEMENT_GENERATORS)(left, right, rng)
            if text in {t for t, _ in out}:
                continue
            best = best or (text, truth)
            if truth == want:
                best = (text, truth)
                break
        if best:
            out.append(best)
    return out
