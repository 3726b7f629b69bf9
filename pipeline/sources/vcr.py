"""VCR (Visual Commonsense Reasoning): the JSON-lines files ``train.jsonl``, ``val.jsonl``,
``test.jsonl`` (streamed) and the per-image metadata JSON.

* A line: ``{"annot_id": "val-0", "objects": ["person", "person", "car"], "img_fn":
  "lsmdc_<movie>/<clip>@0.jpg", "metadata_fn": "lsmdc_<movie>/<clip>@0.json", "question":
  tokens, "answer_choices": [tokens] * 4, "rationale_choices": [tokens] * 4,
  "answer_label": 0-3, "rationale_label": 0-3, ...}`` (no labels in test). Tokens are words
  (strings) and tags: lists of indices into ``objects`` (``[0]``, ``[1, 2]``).
* Metadata (``read_vcr_metadata``): ``{"boxes": [[x1, y1, x2, y2, score]], "names",
  "width", "height", "segms"}``: the detections the tags index, in pixels.

Texts are rendered in one of two styles (`Rendering`), the tokens joined with spaces
(punctuation stays a token) and cleaned (`pipeline.sources.base.clean_text`):

* `R2C` (R2C, VL-BERT; `read_vcr`'s default): a tagged person becomes a gender-neutral name,
  `NAMES`[index % len(NAMES)], any other object its class name; the objects of one tag are
  joined with " and ".
* `MT` (vilbert-multi-task's `vcr_dataset.py`, ``replace_det_with_name``): the objects of one
  tag are written one after the other (no "and"), any other object as its class name, and a
  tagged person as a mark (`person_mark`: its object index between two private-use
  characters) that `name_people` later replaces by a name: the reference draws one name per
  person per example at random from a names table (`read_names_table`), so the name is a
  choice of the trainer (seeded), not of the file.

Rows: a line needs annot_id, img_fn, a list of object names, a question and four answer
and four rationale choices, each a non-empty list of tokens whose tags index ``objects``,
and labels, when given, in 0-3. Anything else is `Malformed` (``val.jsonl:12``), as is a
line holding NaN or Infinity or nested too deep. A question or choice whose rendering
is blank (tokens of whitespace alone) is a `Skip` ("empty text"), and so is a line whose
annot_id an earlier line of the file has ("duplicate id": the first is kept); both name the
image.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterator, NamedTuple, Optional, Union

import numpy as np

from pipeline.errors import ConfigError
from pipeline.sources.base import (
    DUPLICATE_ID,
    EMPTY_TEXT,
    Malformed,
    Skip,
    clean_text,
    finite_numbers,
    is_int,
    load_json_file,
    open_text,
    reading,
    shown,
)
from pipeline.sources.jsonlines import iter_json_lines

CHOICES = 4
# The gender-neutral names R2C and VL-BERT give tagged people, by object index (cycled).
NAMES = (
    "Casey",
    "Riley",
    "Jessie",
    "Jackie",
    "Avery",
    "Jaime",
    "Peyton",
    "Kerry",
    "Jody",
    "Kendall",
    "Peyton",
    "Skyler",
    "Frankie",
    "Pat",
    "Quinn",
)
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
_MARK = "\ue000"  # private use: around a person's object index in an `MT` rendering
_MARKED = re.compile(f"{_MARK}([0-9]+){_MARK}")


@dataclass(frozen=True)
class VcrQuestion:
    annot_id: str  # "val-0"
    image: str  # img_fn without its extension, its folder kept: "lsmdc_<movie>/<clip>@0"
    metadata_fn: str  # as given ("" when absent): the metadata JSON, relative to the images' root
    objects: tuple[str, ...]  # the detections' class names, as the tags index them
    question: str  # rendered
    answers: tuple[str, ...]  # the 4 answer choices, rendered
    rationales: tuple[str, ...]  # the 4 rationale choices, rendered
    answer_label: Optional[int]  # 0-3; None when the file gives none (test)
    rationale_label: Optional[int]


class VcrMetadata(NamedTuple):
    boxes: np.ndarray  # (N, 4) float32, x1, y1, x2, y2 in pixels (the detector's score dropped)
    names: tuple[str, ...]  # the boxes' class names (the question's `objects`)
    width: int
    height: int


class _Bad(ValueError):
    """A line without VCR's shape; the message says why."""


def person_mark(index: int) -> str:
    """The mark an `MT` rendering writes for tagged person `index` (`name_people` replaces it)."""
    return f"{_MARK}{index}{_MARK}"


class Rendering(NamedTuple):
    """How a tag becomes words: `person` (object index -> text) for a person, the class name
    for any other object; the objects of one tag joined by `join`."""

    person: Callable[[int], str]
    join: str


R2C = Rendering(lambda index: NAMES[index % len(NAMES)], " and ")
MT = Rendering(person_mark, " ")


def name_people(text: str, name: Callable[[int], str]) -> str:
    """`text` (an `MT` rendering) with each person mark replaced by ``name(object index)``."""
    return _MARKED.sub(lambda m: name(int(m.group(1))), text)


def read_names_table(path: Path) -> tuple[str, ...]:
    """The names of a names table as vilbert-multi-task reads its ``unisex_names_table.csv``:
    the second column of each CSV row, the rows whose second column is ``name`` (the header)
    left out; ConfigError naming the file when it has no such names."""
    path = Path(path)
    try:
        with reading(str(path)), open_text(path) as f:
            rows = list(csv.reader(f))
    except csv.Error as err:
        raise ConfigError(f"{path}: not a names table ({err})") from err
    if not rows or any(len(row) < 2 for row in rows):
        raise ConfigError(f"{path}: not a names table (needs CSV rows with the name in the second column)")
    names = tuple(row[1] for row in rows if row[1] != "name")
    if not names or not all(n.strip() for n in names):
        raise ConfigError(f"{path}: not a names table (a row has no name in its second column)")
    return names


def _name(objects: tuple[str, ...], index: Any, style: Rendering) -> str:
    if not is_int(index) or not 0 <= index < len(objects):
        raise _Bad(f"tag {shown(index)} is not an index of the {len(objects)} objects")
    return style.person(index) if objects[index] == "person" else objects[index]


def render_tokens(tokens: Any, objects: tuple[str, ...], style: Rendering = R2C) -> str:
    """The text of a token list in `style`: tags become names (`R2C`: "Casey", "car";
    "Casey and Riley"); ValueError when it is not a non-empty list of words and tags
    indexing `objects`."""
    if not isinstance(tokens, list) or not tokens:
        raise _Bad("a text needs a non-empty list of tokens")
    words = []
    for token in tokens:
        if isinstance(token, str):
            words.append(token)
        elif isinstance(token, list) and token:
            words.append(style.join.join(_name(objects, index, style) for index in token))
        else:
            raise _Bad(f"token {shown(token)} is neither a word nor a list of object indices")
    return clean_text(" ".join(words))


def _label(value: Any) -> Optional[int]:
    if value is None:
        return None
    if not is_int(value) or not 0 <= value < CHOICES:
        raise _Bad(f"label {shown(value)} is not in 0-{CHOICES - 1}")
    return value


def _choices(value: Any, objects: tuple[str, ...], style: Rendering) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) != CHOICES:
        raise _Bad(f"needs {CHOICES} answer and {CHOICES} rationale choices")
    return tuple(render_tokens(choice, objects, style) for choice in value)


def _image(img_fn: str) -> str:
    suffix = PurePosixPath(img_fn).suffix
    return img_fn[: -len(suffix)] if suffix.lower() in _IMAGE_SUFFIXES else img_fn


def _question(obj: Any, style: Rendering) -> VcrQuestion:
    """The question of one line; _Bad saying why not."""
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("annot_id"), str)
        or not isinstance(obj.get("img_fn"), str)
        or not obj["img_fn"]
        or not isinstance(obj.get("objects"), list)
        or not all(isinstance(o, str) for o in obj["objects"])
    ):
        raise _Bad("needs annot_id, img_fn and objects (a list of class names)")
    objects = tuple(obj["objects"])
    metadata_fn = obj.get("metadata_fn")
    return VcrQuestion(
        obj["annot_id"],
        _image(obj["img_fn"]),
        metadata_fn if isinstance(metadata_fn, str) else "",
        objects,
        render_tokens(obj.get("question"), objects, style),
        _choices(obj.get("answer_choices"), objects, style),
        _choices(obj.get("rationale_choices"), objects, style),
        _label(obj.get("answer_label")),
        _label(obj.get("rationale_label")),
    )


def read_vcr(path: Path, style: Rendering = R2C) -> Iterator[Union[VcrQuestion, Skip, Malformed]]:
    """The questions of a VCR file, one a line, in file order, rendered in `style`."""
    path = Path(path)
    seen: set[str] = set()
    for where, obj in iter_json_lines(path):
        if isinstance(obj, Malformed):
            yield obj
            continue
        try:
            question = _question(obj, style)
        except _Bad as err:
            yield Malformed(path, where, str(err))
            continue
        if question.annot_id in seen:
            yield Skip(question.image, DUPLICATE_ID)
        elif not all((question.question, *question.answers, *question.rationales)):
            yield Skip(question.image, EMPTY_TEXT)
        else:
            yield question
        seen.add(question.annot_id)


def read_vcr_metadata(path: Path) -> VcrMetadata:
    """The detections of one image's metadata JSON (for ``vlprep extract --given-boxes``);
    ConfigError naming the file when it is not such JSON."""
    path = Path(path)
    data = load_json_file(path)
    boxes, names = (data.get("boxes"), data.get("names")) if isinstance(data, dict) else (None, None)
    if (
        not isinstance(boxes, list)
        or not isinstance(names, list)
        or len(boxes) != len(names)
        or not all(isinstance(n, str) for n in names)
        or not all(isinstance(b, list) and len(b) in (4, 5) and finite_numbers(b) for b in boxes)
        or not is_int(data.get("width"))
        or not is_int(data.get("height"))
    ):
        raise ConfigError(
            f"{path}: not a VCR metadata file (needs boxes [[x1, y1, x2, y2, score]] of finite numbers, as many names, "
            "an integer width and height)"
        )
    array = np.array([b[:4] for b in boxes], dtype=np.float32).reshape(len(boxes), 4)
    return VcrMetadata(array, tuple(names), data["width"], data["height"])
