"""GQA balanced questions (``train_balanced_questions.json``, ...), streamed:
``{question id: {"imageId", "question", "answer", ...}}``. Images are VG ids.

Rows: a question needs imageId and question; the test files give no "answer" (the
question is kept without one); a null answer, or a null or blank question, is a `Skip`;
anything else is `Malformed` (``train_balanced_questions.json:["02930152"]``).
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
    image: str  # VG id
    text: str  # cleaned, not blank
    answer: Optional[str]  # as given; None: the file gives none (test files)


def read_questions(path: Path) -> Iterator[Union[GqaQuestion, Skip, Malformed]]:
    for qid, q in iter_json(path):
        if not isinstance(q, dict) or not is_id(q.get("imageId")) or "question" not in q:
            yield Malformed(Path(path), f"[{json.dumps(qid)}]", "needs imageId and question")
            continue
        image = str(q["imageId"])
        if "answer" in q and not isinstance(q["answer"], str):
            yield Skip(image, NULL_ANSWER)
            continue
        text = text_or_skip(image, q["question"])
        yield text if isinstance(text, Skip) else GqaQuestion(image, text, q.get("answer"))
