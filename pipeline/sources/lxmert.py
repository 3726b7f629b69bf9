"""LXMERT's preprocessed pretraining files (``mscoco_train.json``, ``vgnococo.json``, ...),
streamed: ``[{"img_id", "sentf": {source: [sentence]}, "labelf": {source: [{answer: score}]}}]``.

One file holds several sources: ``mscoco`` and ``vg`` sentences are captions, ``vqa``,
``gqa`` and ``visual7w`` ones questions, whose j-th label (when given) is the j-th
sentence's. Rows: a datum needs img_id and sentf (sources to lists of sentences), labelf
(when given) sources to lists; anything else is `Malformed`. A label that is not an object
of finite numeric scores is a null answer, and a null or blank sentence a null or empty text:
`Skip`s naming their source.

LXMERT's VQA / GQA split files (``data/vqa/minival.json``, ``nominival.json``, ...) are
read by `read_question_ids`: ``[{"question_id", "img_id", "sent", "label", ...}]``; only
the question ids are used (a split is the questions it lists).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Union

from pipeline.sources.base import NULL_ANSWER, Malformed, Skip, finite_numbers, is_id, text_or_skip
from pipeline.sources.jsonstream import iter_json

CAPTION_SOURCES = frozenset({"mscoco", "vg"})


@dataclass(frozen=True)
class LxmertSentence:
    image: str  # LXMERT's img_id: a COCO file stem or a VG id
    source: str  # mscoco, vg, vqa, gqa, visual7w, ...
    kind: str  # "caption" | "question"
    text: str  # cleaned, not blank
    label: Optional[dict[str, float]] = None  # questions: answer (as given) -> score; None: no label


def _lists(value) -> bool:
    return isinstance(value, dict) and all(isinstance(v, list) for v in value.values())


def _scores(label) -> bool:
    return isinstance(label, dict) and finite_numbers(label.values())


def read_lxmert(path: Path) -> Iterator[Union[LxmertSentence, Skip, Malformed]]:
    for i, datum in iter_json(path, array=True):
        if isinstance(datum, Malformed):
            yield datum
            continue
        if (
            not isinstance(datum, dict)
            or not is_id(datum.get("img_id"))
            or not _lists(datum.get("sentf"))
            or not _lists(datum.get("labelf", {}))
        ):
            yield Malformed(
                Path(path),
                f"[{i}]",
                "needs img_id, sentf (sources to lists of sentences) and, when "
                "given, labelf (sources to lists of labels)",
            )
            continue
        image, labels = str(datum["img_id"]), datum.get("labelf", {})
        for source, sentences in datum["sentf"].items():
            kind = "caption" if source in CAPTION_SOURCES else "question"
            for j, sentence in enumerate(sentences):
                labelled = kind == "question" and j < len(labels.get(source, ()))
                label = labels[source][j] if labelled else None
                if labelled and not _scores(label):
                    yield Skip(image, NULL_ANSWER, source)
                    continue
                text = text_or_skip(image, sentence, source)
                yield text if isinstance(text, Skip) else LxmertSentence(image, source, kind, text, label)


def read_question_ids(path: Path) -> Iterator[Union[str, Malformed]]:
    """The question ids of an LXMERT VQA / GQA split file (``minival.json``), as strings,
    in file order; an entry that is no object with a ``question_id`` (integer or string)
    is `Malformed`."""
    for i, entry in iter_json(path, array=True):
        if isinstance(entry, Malformed):
            yield entry
            continue
        if isinstance(entry, dict) and is_id(entry.get("question_id")):
            yield str(entry["question_id"])
        else:
            yield Malformed(Path(path), f"[{i}]", "needs a question_id")
