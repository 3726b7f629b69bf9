"""Readers of the text sources of pretraining mixtures, in their official formats.

Each yields `TextItem`s (image id before canonicalization, text, kind, answers) in file
order, and a `Skip` (image, reason) for an annotation that cannot become an item: a null
text ("null text"), a blank one ("empty text"), a question whose answer is null ("null
answer"; in VQA, where ten annotators answer, a null answer is ignored like a blank one).
Image identity: COCO images are named by their file stem
(``COCO_train2014_000000000009``), VG images by their VG id; `ImageIds` maps a VG image
that is also in COCO to the COCO name (through VG's ``coco_id``), as LXMERT does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pipeline.errors import ConfigError
from pipeline.mixture.answers import normalize_answer, soft_scores
from pipeline.mixture.jsonstream import iter_json


@dataclass(frozen=True)
class TextItem:
    image: str  # a COCO stem, a VG id, or another source's image id
    text: str
    kind: str  # "caption" | "question"
    answers: Optional[dict[str, float]] = None  # normalized answer -> soft score (questions)
    vg_id: Optional[str] = None  # set when `image` is a VG id (for COCO mapping)


@dataclass(frozen=True)
class Skip:
    """An annotation left out of the mixture; `reason` is what it is counted under."""

    image: str
    reason: str  # "null text" | "empty text" | "null answer"


Read = Union[TextItem, Skip]


def _item(image: str, text: Any, kind: str, answers: Optional[dict] = None, vg_id: Optional[str] = None,
          collapse: bool = False) -> Read:
    """A TextItem with its text stripped (`collapse`: inner whitespace runs made one space too),
    or a Skip when the text is null, not a string, or blank."""
    if not isinstance(text, str):
        return Skip(image, "null text")
    text = " ".join(text.split()) if collapse else text.strip()
    if not text:
        return Skip(image, "empty text")
    return TextItem(image, text, kind, answers, vg_id)


def _one_answer(answer: str) -> dict[str, float]:
    """A single given answer (GQA, VG-QA) as soft scores; empty when it normalizes away ("the")."""
    key = normalize_answer(answer)
    return {key: 1.0} if key else {}


def _load(path: Path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}") from err


def _need(obj, keys: tuple[str, ...], path: Path, where: str):
    if not isinstance(obj, dict) or any(k not in obj for k in keys):
        raise ConfigError(f"{path}: {where}: needs {', '.join(keys)}")
    return obj


def coco_split(name: str) -> str:
    """'captions_train2014.json' / 'v2_OpenEnded_mscoco_val2014_questions.json' -> 'train2014' / 'val2014'."""
    for split in ("train2014", "val2014", "test2015", "test2014", "train2017", "val2017"):
        if split in name:
            return split
    raise ConfigError(f"{name}: cannot tell the COCO split (train2014, val2014, ...) from the file name")


def coco_stem(split: str, image_id: int) -> str:
    return f"COCO_{split}_{int(image_id):012d}" if split.endswith("2014") or split.endswith("2015") else f"{int(image_id):012d}"


class ImageIds:
    """VG id -> COCO stem for VG images that are also COCO images; then, with an image map
    (``source id <TAB> store key`` lines), annotation ids -> the ids the feature stores use
    (e.g. COCO-style question files over images extracted from a Conceptual-Captions TSV)."""

    def __init__(self, image_data: Optional[Path], coco_files: list[Path], image_map: Optional[Path] = None):
        self.aliases = read_image_map(image_map) if image_map else {}
        stems: dict[int, str] = {}
        for path in coco_files:
            for i, img in enumerate(_load(path).get("images", [])):
                _need(img, ("id", "file_name"), path, f"images[{i}]")
                stems[int(img["id"])] = img["file_name"].rsplit(".", 1)[0]
        self.vg_to_coco: dict[str, str] = {}
        self.unmatched_coco = 0
        if image_data is not None:
            for i, img in iter_json(image_data):
                _need(img, ("coco_id",), image_data, f"[{i}]")
                vg = str(img.get("image_id", img.get("id")))
                if img["coco_id"] is not None:
                    stem = stems.get(int(img["coco_id"]))
                    if stem is None:
                        self.unmatched_coco += 1
                    else:
                        self.vg_to_coco[vg] = stem
        self.coco_images = set(stems.values())

    def canonical(self, item: TextItem) -> str:
        image = self.vg_to_coco.get(item.vg_id, item.image) if item.vg_id is not None else item.image
        return self.aliases.get(image, image)

    def canonical_id(self, image: str) -> str:
        """An id from a held-out or drop list, which may name an image as the annotation files
        do (a VG id, as GQA's lists do, or a COCO file stem) or by its store key."""
        image = self.vg_to_coco.get(image, image)
        return self.aliases.get(image, image)


def read_image_map(path: Path) -> dict[str, str]:
    """``source id<TAB>store key`` lines. A source id mapped twice to different keys is a
    ConfigError naming both lines; the same line repeated is accepted."""
    aliases: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise ConfigError(f"{path}:{lineno}: an image map line is 'source id<TAB>store key'")
        source, key = parts[0].strip(), parts[1].strip()
        if source in aliases and aliases[source] != key:
            raise ConfigError(f"{path}:{lineno}: source id {source!r} maps to {key!r}, but line {first_line[source]} "
                              f"maps it to {aliases[source]!r}; an image id maps to one store key")
        aliases[source] = key
        first_line.setdefault(source, lineno)
    return aliases


def read_coco_captions(path: Path) -> Iterator[Read]:
    data = _load(path)
    _need(data, ("images", "annotations"), path, "top level")
    stems = {}
    for i, img in enumerate(data["images"]):
        stems[_need(img, ("id", "file_name"), path, f"images[{i}]")["id"]] = img["file_name"].rsplit(".", 1)[0]
    for i, ann in enumerate(data["annotations"]):
        _need(ann, ("image_id", "caption"), path, f"annotations[{i}]")
        if ann["image_id"] not in stems:
            raise ConfigError(f"{path}: annotations[{i}]: image {ann['image_id']} is not in images")
        yield _item(stems[ann["image_id"]], ann["caption"], "caption", collapse=True)


def read_vg_regions(path: Path) -> Iterator[Read]:
    """region_descriptions.json: [{"id", "regions": [{"phrase", "image_id", ...}]}] (streamed);
    each phrase describes the whole image (as LXMERT uses them)."""
    for i, entry in iter_json(path):
        _need(entry, ("regions",), path, f"[{i}]")
        vg = str(entry.get("id", entry.get("image_id")))
        for region in entry["regions"]:
            yield _item(vg, region.get("phrase") if isinstance(region, dict) else None, "caption", vg_id=vg,
                        collapse=True)


def read_vqa(questions: Path, annotations: Path) -> Iterator[Read]:
    """VQA v2: questions {"questions": [{"image_id", "question", "question_id"}]} and
    annotations {"annotations": [{"question_id", "answers": [{"answer"}, ...]}]}."""
    split = coco_split(questions.name)
    answers = {}
    for i, ann in iter_json(annotations, member="annotations"):
        _need(ann, ("question_id", "answers"), annotations, f"annotations[{i}]")
        answers[ann["question_id"]] = soft_scores(a["answer"] for a in ann["answers"]
                                                  if isinstance(a, dict) and isinstance(a.get("answer"), str))
    for i, q in iter_json(questions, member="questions"):
        _need(q, ("image_id", "question", "question_id"), questions, f"questions[{i}]")
        if q["question_id"] not in answers:
            raise ConfigError(f"{annotations}: no annotation for question {q['question_id']} ({questions.name})")
        yield _item(coco_stem(split, q["image_id"]), q["question"], "question", answers[q["question_id"]])


def read_gqa(path: Path) -> Iterator[Read]:
    """GQA balanced questions: {qid: {"imageId", "question", "answer", ...}} (streamed); a
    question without an "answer" key (test files) is kept without answers."""
    for qid, q in iter_json(path):
        _need(q, ("imageId", "question"), path, f"question {qid}")
        image = str(q["imageId"])
        if "answer" in q and not isinstance(q["answer"], str):
            yield Skip(image, "null answer")
            continue
        answers = _one_answer(q["answer"]) if "answer" in q else None
        yield _item(image, q["question"], "question", answers, vg_id=image)


def read_vgqa(path: Path) -> Iterator[Read]:
    """VG question_answers.json: [{"id", "qas": [{"question", "answer", "image_id"}]}] (streamed)."""
    for i, entry in iter_json(path):
        _need(entry, ("qas",), path, f"[{i}]")
        for qa in entry["qas"]:
            vg = str(qa.get("image_id", entry.get("id")))
            item, answer = _item(vg, qa.get("question"), "question", vg_id=vg), qa.get("answer")
            if isinstance(item, TextItem):
                item = replace(item, answers=_one_answer(answer)) if isinstance(answer, str) else Skip(vg, "null answer")
            yield item


_LXMERT_CAPTION_SOURCES = {"mscoco", "vg"}


def read_lxmert(path: Path) -> Iterator[tuple[str, Read]]:
    """LXMERT's preprocessed files: [{"img_id", "sentf": {src: [sent]}, "labelf": {src: [{ans: score}]}}].
    Yields (source, item); sources mscoco/vg are captions, vqa/gqa/visual7w questions."""
    for i, datum in iter_json(path):
        _need(datum, ("img_id", "sentf"), path, f"[{i}]")
        labels = datum.get("labelf", {})
        for src, sents in datum["sentf"].items():
            kind = "caption" if src in _LXMERT_CAPTION_SOURCES else "question"
            for j, sent in enumerate(sents):
                answers = None
                if kind == "question" and src in labels and j < len(labels[src]):
                    label = labels[src][j]
                    if not isinstance(label, dict) or not all(isinstance(s, (int, float)) for s in label.values()):
                        yield src, Skip(str(datum["img_id"]), "null answer")
                        continue
                    answers = {}
                    for ans, score in label.items():
                        key = normalize_answer(ans)
                        if key:
                            answers[key] = max(answers.get(key, 0.0), float(score))
                yield src, _item(str(datum["img_id"]), sent, kind, answers)
