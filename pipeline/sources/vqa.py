"""VQA v2: a questions file, with its annotations file when the split has one (streamed).

``v2_OpenEnded_mscoco_<split>_questions.json``: ``{"questions": [{"image_id", "question",
"question_id"}]}``; ``v2_mscoco_<split>_annotations.json``: ``{"annotations":
[{"question_id", "answers": [{"answer", ...}, ...], "multiple_choice_answer",
"question_type", "answer_type", ...}]}``. train2014 and val2014 come in pairs (`read_vqa`);
test-dev2015 and test2015 have questions only (`read_vqa_questions`). The COCO split of the
images is read from the questions file's name (test-dev's images are test2015's); images are
named by their COCO file stem (`coco_stem`).

Rows: an annotation needs an integer question_id and a list of answers (an answer that is
not a string is left out: one null among ten annotators' answers is ignored like a blank
one); a question needs an integer image_id, its question text, an integer question_id and,
when read with annotations, an annotation. Anything else is `Malformed`, as is a member
holding NaN or Infinity; a null or blank question is a `Skip`, and so is a question (or
an annotation) whose question_id an earlier one of its file has ("duplicate id": the first
is kept).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pipeline.errors import ConfigError
from pipeline.sources.base import DUPLICATE_ID, Malformed, Skip, is_int, text_or_skip
from pipeline.sources.coco import coco_split, coco_stem
from pipeline.sources.jsonstream import iter_json


@dataclass(frozen=True)
class VqaQuestion:
    image: str  # COCO file stem
    text: str  # cleaned, not blank
    answers: tuple[str, ...]  # the annotators' answers as given; () without annotations (test files)
    question_id: int
    question_type: str  # the annotation's, as given ("what color is the"); "" when absent
    answer_type: str  # the annotation's: "yes/no" | "number" | "other"; "" when absent
    multiple_choice_answer: str  # the annotation's most common answer; "" when absent


@dataclass(frozen=True)
class _Annotation:
    answers: tuple[str, ...] = ()
    question_type: str = ""
    answer_type: str = ""
    multiple_choice_answer: str = ""


def _interned(value: Any) -> str:
    """`value` when it is a string, else ""; interned (a few thousand distinct answers and
    types over millions of annotations)."""
    return sys.intern(value) if isinstance(value, str) else ""


def _annotation(ann: dict) -> _Annotation:
    return _Annotation(
        tuple(
            _interned(a["answer"]) for a in ann["answers"] if isinstance(a, dict) and isinstance(a.get("answer"), str)
        ),
        _interned(ann.get("question_type")),
        _interned(ann.get("answer_type")),
        _interned(ann.get("multiple_choice_answer")),
    )


def read_vqa(questions: Path, annotations: Path) -> Iterator[Union[VqaQuestion, Skip, Malformed]]:
    """The questions of a VQA pair with their annotations, in question order (the
    annotations file's malformed rows first); ConfigError when the questions file's name
    holds no COCO split."""
    questions, annotations = Path(questions), Path(annotations)
    split = _split(questions)
    found: dict[Any, _Annotation] = {}
    for i, ann in iter_json(annotations, member="annotations", array=True):
        if isinstance(ann, Malformed):
            yield ann
        elif (
            not isinstance(ann, dict) or not is_int(ann.get("question_id")) or not isinstance(ann.get("answers"), list)
        ):
            yield Malformed(annotations, f"annotations[{i}]", "needs an integer question_id and answers (a list)")
        elif ann["question_id"] in found:
            image_id = ann.get("image_id")
            yield Skip(coco_stem(split, image_id) if is_int(image_id) else "", DUPLICATE_ID)
        else:
            found[ann["question_id"]] = _annotation(ann)
    yield from _read_questions(questions, split, (annotations, found))


def read_vqa_questions(questions: Path) -> Iterator[Union[VqaQuestion, Skip, Malformed]]:
    """The questions of a file that has no annotations (test-dev2015, test2015), in file
    order, with answers () and the annotation's fields ""; ConfigError when the file's name
    holds no COCO split."""
    questions = Path(questions)
    yield from _read_questions(questions, _split(questions), None)


def _split(questions: Path) -> str:
    """The COCO split of the images of a questions file; ConfigError when its name has none."""
    split = coco_split(questions.name)
    if split is None:
        raise ConfigError(
            f"{questions.name}: cannot tell the COCO split (train2014, val2014, test-dev2015, ...) from the file name"
        )
    return split


def _read_questions(
    path: Path, split: str, annotations: Optional[tuple[Path, dict[Any, _Annotation]]]
) -> Iterator[Union[VqaQuestion, Skip, Malformed]]:
    """The questions of `path` about images of `split`, each with its annotation from
    (annotations file, its annotations by question_id), or none when that is None."""
    seen: set[int] = set()
    for i, q in iter_json(path, member="questions", array=True):
        where = f"questions[{i}]"
        if isinstance(q, Malformed):
            yield q
            continue
        if (
            not isinstance(q, dict)
            or not is_int(q.get("image_id"))
            or "question" not in q
            or not is_int(q.get("question_id"))
        ):
            yield Malformed(path, where, "needs an integer image_id, question and an integer question_id")
            continue
        qid = q["question_id"]
        ann = _Annotation() if annotations is None else annotations[1].get(qid)
        if ann is None:
            yield Malformed(path, where, f"question {qid!r} has no annotation in {annotations[0].name}")
            continue
        image = coco_stem(split, q["image_id"])
        if qid in seen:
            yield Skip(image, DUPLICATE_ID)
            continue
        seen.add(qid)
        text = text_or_skip(image, q["question"])
        yield (
            text
            if isinstance(text, Skip)
            else VqaQuestion(
                image, text, ann.answers, qid, ann.question_type, ann.answer_type, ann.multiple_choice_answer
            )
        )
