"""VQA v2: a questions file and its annotations file, read as a pair (streamed).

``v2_OpenEnded_mscoco_<split>_questions.json``: ``{"questions": [{"image_id", "question",
"question_id"}]}``; ``v2_mscoco_<split>_annotations.json``: ``{"annotations":
[{"question_id", "answers": [{"answer", ...}, ...]}]}``. The COCO split is read from the
questions file's name; images are named by their COCO file stem (`coco_stem`).

Rows: an annotation needs a question_id and a list of answers (an answer that is not a
string is left out: one null among ten annotators' answers is ignored like a blank one); a
question needs an integer image_id, its question text and a question_id that has an
annotation. Anything else is `Malformed`; a null or blank question is a `Skip`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

from pipeline.errors import ConfigError
from pipeline.sources.base import Malformed, Skip, is_int, text_or_skip
from pipeline.sources.coco import coco_split, coco_stem
from pipeline.sources.jsonstream import iter_json


@dataclass(frozen=True)
class VqaQuestion:
    image: str  # COCO file stem
    text: str  # cleaned, not blank
    answers: tuple[str, ...]  # the annotators' answers as given


def read_vqa(questions: Path, annotations: Path) -> Iterator[Union[VqaQuestion, Skip, Malformed]]:
    """The questions of a VQA pair with their annotators' answers, in question order;
    ConfigError when the questions file's name holds no COCO split."""
    questions, annotations = Path(questions), Path(annotations)
    split = coco_split(questions.name)
    if split is None:
        raise ConfigError(f"{questions.name}: cannot tell the COCO split (train2014, val2014, ...) from the file name")
    answers: dict = {}
    for i, ann in iter_json(annotations, member="annotations", array=True):
        if not isinstance(ann, dict) or "question_id" not in ann or not isinstance(ann.get("answers"), list):
            yield Malformed(annotations, f"annotations[{i}]", "needs question_id and answers (a list)")
            continue
        # interned: a few thousand distinct answers over millions of annotators
        answers[ann["question_id"]] = tuple(sys.intern(a["answer"]) for a in ann["answers"]
                                            if isinstance(a, dict) and isinstance(a.get("answer"), str))
    for i, q in iter_json(questions, member="questions", array=True):
        where = f"questions[{i}]"
        if not isinstance(q, dict) or not is_int(q.get("image_id")) or "question" not in q or "question_id" not in q:
            yield Malformed(questions, where, "needs an integer image_id, question and question_id")
            continue
        if q["question_id"] not in answers:
            yield Malformed(questions, where, f"question {q['question_id']!r} has no annotation in {annotations.name}")
            continue
        image = coco_stem(split, q["image_id"])
        text = text_or_skip(image, q["question"])
        yield text if isinstance(text, Skip) else VqaQuestion(image, text, answers[q["question_id"]])
