"""VQA-style questions of a scene with their answers (colour, count, existence, comparison,
spatial) and the 10 annotator answers each (some written differently, rarely one wrong)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from pipeline.synthetic.scenes import COLORS, SHAPES, Scene, SceneObject, pick
from pipeline.synthetic.words import (
    NUMBER_WORDS,
    RELATION_WORDS,
    RELATIONS,
    article,
    clear_pairs,
    only_related,
    phrase,
    plural,
    relation,
    sample_texts,
    shape_counts,
    unique_descriptions,
)


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
    return phrase(obj, pick(rng, options)) if options else None


def _question_color(scene: Scene, rng: np.random.Generator) -> Optional[QA]:
    askable = [o for o in scene.objects if unique_descriptions(scene, o, exclude=("color",))]
    if not askable:
        return None
    obj = pick(rng, askable)
    name = _named(scene, obj, rng, exclude=("color",))
    frame, qtype = pick(
        rng,
        (
            ("what color is the {}?", "what color is the"),
            ("what is the color of the {}?", "what is the color of the"),
            ("which color does the {} have?", "which color"),
        ),
    )
    return QA(frame.format(name), obj.color, qtype, "other")


def _question_count(scene: Scene, rng: np.random.Generator) -> QA:
    kind = rng.random()
    if kind < 0.6:
        shape = pick(rng, [o.shape for o in scene.objects]) if rng.random() < 0.8 else pick(rng, SHAPES)
        subject, n = plural(shape), shape_counts(scene)[shape]
    elif kind < 0.85:
        color = pick(rng, COLORS)
        subject, n = f"{color} shapes", sum(o.color == color for o in scene.objects)
    else:
        subject, n = pick(rng, ("shapes", "objects")), len(scene.objects)
    frame = pick(rng, ("how many {} are there?", "how many {} are in the image?", "how many {} can you see?"))
    return QA(frame.format(subject), str(n), "how many", "number")


def _question_exists(scene: Scene, rng: np.random.Generator) -> QA:
    with_color = rng.random() < 0.7
    present = {(o.color if with_color else "", o.shape) for o in scene.objects}
    combos = [(c, s) for c in (COLORS if with_color else ("",)) for s in SHAPES]
    answer = rng.random() < 0.5
    pool = sorted(present) if answer else [c for c in combos if c not in present]
    if not pool:  # every shape is present: this question has to be a yes
        pool, answer = sorted(present), True
    color, shape = pick(rng, pool)
    what = f"{color} {shape}".strip()
    if rng.random() < 0.7:
        return QA(
            f"is there {article(what)}{pick(rng, ('', ' in the image', ' in the picture'))}?",
            _yes_no(answer),
            "is there a",
            "yes/no",
        )
    return QA(f"are there any {plural(what)}?", _yes_no(answer), "are there", "yes/no")


def _question_compare(scene: Scene, rng: np.random.Generator) -> Optional[QA]:
    if rng.random() < 0.5:
        named = [o for o in scene.objects if unique_descriptions(scene, o, exclude=("size",))]
        pairs = [(a, b) for a in named for b in named if a.size != b.size]
        if not pairs:
            return None
        a, b = pick(rng, pairs)
        name_a, name_b = _named(scene, a, rng, exclude=("size",)), _named(scene, b, rng, exclude=("size",))
        word = pick(rng, ("larger", "bigger", "smaller"))
        answer = (a.size == "large") == (word != "smaller")
        return QA(f"is the {name_a} {word} than the {name_b}?", _yes_no(answer), "is the", "yes/no")
    counts = shape_counts(scene)
    pool = sorted(counts) if len(counts) > 1 and rng.random() < 0.7 else SHAPES  # mostly shapes in view
    shapes = [str(s) for s in rng.permutation(pool)[:2]]
    word = pick(rng, ("more", "fewer"))
    answer = counts[shapes[0]] > counts[shapes[1]] if word == "more" else counts[shapes[0]] < counts[shapes[1]]
    return QA(f"are there {word} {plural(shapes[0])} than {plural(shapes[1])}?", _yes_no(answer), "are there", "yes/no")


def _question_spatial(scene: Scene, rng: np.random.Generator) -> Optional[QA]:
    if rng.random() < 0.5:
        askable = [
            (ref, rel, target)
            for ref in scene.objects
            if unique_descriptions(scene, ref)
            for rel in RELATIONS
            if (target := only_related(scene, ref, rel, scene.objects)) is not None
        ]
        if not askable:
            return None
        ref, rel, target = pick(rng, askable)
        ref_name = _named(scene, ref, rng)
        words = pick(rng, RELATION_WORDS[rel])
        if rng.random() < 0.7:
            frame = pick(rng, ("what shape is {} the {}?", "which shape is {} the {}?"))
            return QA(frame.format(words, ref_name), target.shape, frame.split(" {}")[0], "other")
        return QA(f"what color is the shape {words} the {ref_name}?", target.color, "what color is the", "other")
    pairs = clear_pairs(scene, True) + clear_pairs(scene, False)
    if not pairs:
        return None
    a, b, rel = pick(rng, pairs)
    name_a, name_b = _named(scene, a, rng), _named(scene, b, rng)
    if name_a is None or name_b is None:
        return None
    answer = _yes_no(bool(relation(a, b, rel, scene.margin)))
    return QA(f"is the {name_a} {pick(rng, RELATION_WORDS[rel])} the {name_b}?", answer, "is the", "yes/no")


QUESTION_GENERATORS = (
    _question_color,
    _question_count,
    _question_exists,
    _question_exists,
    _question_compare,
    _question_spatial,
)


def questions(scene: Scene, rng: np.random.Generator, k: int = 6) -> list[QA]:
    """Up to `k` distinct question-answer pairs, answers true of the scene."""
    return sample_texts(QUESTION_GENERATORS, scene, rng, k, key=lambda qa: qa.question)


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
    return pick(rng, [v for v in vocab if v != qa.answer])


def annotator_answers(qa: QA, rng: np.random.Generator, n: int = 10) -> list[dict]:
    """`n` VQA-style answers: mostly the true one, some written differently, rarely one wrong."""
    wrong = int(rng.integers(n)) if rng.random() < 0.3 else -1
    answers = []
    for i in range(n):
        text = _wrong(qa, rng) if i == wrong else _synonym(qa.answer) if rng.random() < 0.15 else qa.answer
        confidence = "maybe" if i == wrong or rng.random() < 0.05 else "yes"
        answers.append({"answer": text, "answer_confidence": confidence, "answer_id": i + 1})
    return answers
