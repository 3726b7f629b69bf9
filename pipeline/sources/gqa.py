"""GQA questions (``train_balanced_questions.json``, ``testdev_balanced_questions.json``,
``submission_all_questions.json``, ...), streamed: ``{question id: {"imageId", "question",
"answer", ...}}``. Images are VG ids.

A file that is not a JSON object (a list, say) is not a GQA questions file: a ConfigError
naming it. Rows: a question needs imageId and question; anything else is `Malformed`
(``train_balanced_questions.json:["02930152"]``), as is a member holding NaN or
Infinity; a null or blank question is a `Skip`. The
test and submission files give no "answer": such a question is kept with answer None. A
null answer is a `Skip` by default (a training question whose answer is lost: what
`vlprep build-mixture` reads); a task reading files without answers asks
``answers_required=False`` to keep it with answer None too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from pipeline.sources.base import NULL_ANSWER, Malformed, Skip, is_id, text_or_skip
from pipeline.sources.jsonstream import iter_json


@dataclass(frozen=True)
class GqaQuestion:
    image: str  # VG id (imageId)
    text: str  # cleaned, not blank
    answer: Optional[str]  # as given; None: the file gives none (test / submission files)
    question_id: str  # the file's key ("02930152")


def read_questions(path: Path, answers_required: bool = True) -> Iterator[Union[GqaQuestion, Skip, Malformed]]:
    """The questions of `path` in file order; with `answers_required` a null (non-string)
    answer is a `Skip`, without it the question is kept with answer None."""
    for qid, q in iter_json(path, mapping=True):
        if isinstance(q, Malformed):
            yield q
            continue
        if not isinstance(q, dict) or not is_id(q.get("imageId")) or "question" not in q:
            yield Malformed(Path(path), f"[{json.dumps(qid)}]", "needs imageId and question")
            continue
        image = str(q["imageId"])
        if "answer" in q and not isinstance(q["answer"], str) and answers_required:
            yield Skip(image, NULL_ANSWER)
            continue
        answer = q["answer"] if isinstance(q.get("answer"), str) else None
        text = text_or_skip(image, q["question"])
        yield text if isinstance(text, Skip) else GqaQuestion(image, text, answer, str(qid))
