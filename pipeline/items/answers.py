"""Answer normalization, soft scores and the joint answer table.

Two normalizations, for two kinds of table:

* `evaluator_answer`: exactly what the official VQA evaluator (GT-Vision-Lab/VQA
  ``vqaEval.py``, 2021) does to an answer before comparing it, and nothing more: the answer
  tables of the VQA task (`vl_models.transfer.vqa`; BUTD's ``preprocess_answer`` makes the
  same strings) and the official accuracy (`vl_models.eval.metrics`). Its steps:

  1. newlines and tabs become spaces; outer whitespace stripped;
  2. punctuation (VQA `processPunctuation`, here `process_punctuation`):
     ``; / [ ] " { } ( ) = + \\ _ - > < @ ` , ? !`` are removed, except a comma between
     digits (``1,000`` stays); a period not followed by a digit is removed (``2.5`` stays);
  3. digits and articles (VQA `processDigitArticle`, here `process_digit_article`):
     lowercased; number words ``none``, ``zero`` ... ``ten`` become digits, the articles
     ``a``, ``an``, ``the`` are dropped, and the evaluation's contractions get their
     apostrophe (``dont`` -> ``don't``, ``oclock`` -> ``o'clock``).

  ``grey`` and ``gray`` stay two answers, as the evaluator scores them.
* `normalize_answer`: the evaluator's steps, then two of LXMERT's pretraining answer-table
  rules (``AnswerTable.convert_ans``: a trailing ``.`` stripped, ``grey`` -> ``gray``): the
  answers of pretraining mixtures.

Soft scores are the official VQA values: an answer given by k annotators scores 0.3, 0.6,
0.9 for k = 1, 2, 3 and 1.0 for k >= 4 (BUTD's ``get_score``, LXMERT's labels). For 10
annotators (every VQA v2 question) this is exactly the official accuracy of that answer,
averaged over the 10 sets of 9 annotators; for other annotator counts it is not (5
annotators: 1 of 5 scores 0.27 officially, 0.3 here). `soft_scores` counts the answers
normalized (pretraining mixtures); `counted_scores` counts them as given, as BUTD's
``compute_target`` does (the VQA task's targets, both references' VQA labels).

The answer table (`answer_table`, for mixtures and task datasets alike) is built from answer
counts by either rule the seeds use: the K most frequent answers (LXMERT: 9,500) or every
answer counted at least N times (BUTD and ViLBERT's VQA: 9), most frequent first, ties
broken alphabetically so the table is deterministic. Or it is a fixed table read from a file
(`read_answer_file`, `fixed_table`: the seeds' own label files), in the file's order.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from pipeline.errors import ConfigError
from pipeline.items.inputs import file_problem
from pipeline.sources.base import parse_json

_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_NUMBERS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
}
_ARTICLES = {"a", "an", "the"}
# The official evaluation's contraction table; its keys with capitals ("Im", "Id've") are left
# out: the text is lowercased first, so they never match.
_CONTRACTIONS = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "couldn'tve": "couldn't've",
    "couldnt've": "couldn't've",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hadnt've": "hadn't've",
    "hadn'tve": "hadn't've",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hed've": "he'd've",
    "he'dve": "he'd've",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "isnt": "isn't",
    "itd": "it'd",
    "itd've": "it'd've",
    "it'dve": "it'd've",
    "itll": "it'll",
    "let's": "let's",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightnt've": "mightn't've",
    "mightn'tve": "mightn't've",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "ow's'at": "'ow's'at",
    "'ows'at": "'ow's'at",
    "'ow'sat": "'ow's'at",
    "shant": "shan't",
    "shed've": "she'd've",
    "she'dve": "she'd've",
    "she's": "she's",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "shouldnt've": "shouldn't've",
    "shouldn'tve": "shouldn't've",
    "somebody'd": "somebodyd",  # sic: the official table has it backwards
    "somebodyd've": "somebody'd've",
    "somebody'dve": "somebody'd've",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someoned've": "someone'd've",
    "someone'dve": "someone'd've",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingd've": "something'd've",
    "something'dve": "something'd've",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "thered've": "there'd've",
    "there'dve": "there'd've",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyd've": "they'd've",
    "they'dve": "they'd've",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "wed've": "we'd've",
    "we'dve": "we'd've",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "whod've": "who'd've",
    "who'dve": "who'd've",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "wouldnt've": "wouldn't've",
    "wouldn'tve": "wouldn't've",
    "yall": "y'all",
    "yall'll": "y'all'll",
    "y'allll": "y'all'll",
    "yall'd've": "y'all'd've",
    "y'alld've": "y'all'd've",
    "y'all'dve": "y'all'd've",
    "youd": "you'd",
    "youd've": "you'd've",
    "you'dve": "you'd've",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}


def process_punctuation(text: str) -> str:
    """The official evaluation's `processPunctuation` (see the module docstring, step 2)."""
    out = text
    for p in _PUNCT:
        if (p + " " in text or " " + p in text) or re.search(_COMMA_STRIP, text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    # The official call passes re.UNICODE (32) where `sub` takes its count: at most 32 periods go.
    return _PERIOD_STRIP.sub("", out, count=32)


def process_digit_article(text: str) -> str:
    """The official evaluation's `processDigitArticle` (lowercases; module docstring, step 3)."""
    words = []
    for word in text.lower().split():
        word = _NUMBERS.get(word, word)
        if word not in _ARTICLES:
            words.append(_CONTRACTIONS.get(word, word))
    return " ".join(words)


def strip_answer(answer: str) -> str:
    """The evaluator's first step (module docstring, step 1): newlines and tabs become
    spaces, outer whitespace is stripped; what it compares when the annotators agree."""
    return answer.replace("\n", " ").replace("\t", " ").strip()


def evaluator_answer(answer: str) -> str:
    """An answer normalized exactly as the official VQA evaluator normalizes one (module
    docstring, steps 1-3): ``"Grey!"`` -> ``"grey"``, ``"Two"`` -> ``"2"``."""
    return process_digit_article(process_punctuation(strip_answer(answer)))


def normalize_answer(answer: str) -> str:
    """`evaluator_answer`, then LXMERT's pretraining rules: a trailing ``.`` stripped,
    ``grey`` -> ``gray`` (for pretraining mixtures, not for VQA's task tables)."""
    text = evaluator_answer(answer.lower()).rstrip(".").strip()
    return " ".join("gray" if w == "grey" else w for w in text.split())


# BUTD's get_score: the official accuracy of an answer given by k of 10 annotators.
_SCORE_OF_COUNT = {1: 0.3, 2: 0.6, 3: 0.9}


def soft_scores(answers: Iterable[str]) -> dict[str, float]:
    """Normalized answer -> 0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ annotators giving it
    (exact for 10 annotators; see the module docstring)."""
    counts = Counter(normalize_answer(a) for a in answers)
    counts.pop("", None)
    return {a: _SCORE_OF_COUNT.get(n, 1.0) for a, n in counts.items()}


def counted_scores(answers: Iterable[str]) -> dict[str, float]:
    """Answer as given -> 0.3 / 0.6 / 0.9 / 1.0 for 1 / 2 / 3 / 4+ annotators giving exactly
    that string: BUTD's ``compute_target`` (``tools/compute_softscore.py``), which counts the
    annotators' answers unnormalized and keeps those its table (normalized multiple-choice
    answers) holds, so an answer written otherwise than its normal form (``t-shirt``, ``Two``)
    gives no target, however many annotators gave it."""
    counts = Counter(answers)
    return {a: _SCORE_OF_COUNT.get(n, 1.0) for a, n in counts.items()}


def answer_table(counts: Counter, top_k: Optional[int] = None, min_count: int = 1) -> list[str]:
    """The answers counted at least `min_count` times, most frequent first (ties
    alphabetical), at most `top_k` of them (None: all); the empty answer never."""
    ranked = sorted(((a, n) for a, n in counts.items() if a and n >= min_count), key=lambda kv: (-kv[1], kv[0]))
    return [a for a, _ in ranked[:top_k]]


_FILE_FORMATS = (
    'an answer table is a JSON list of strings (VQA label2ans), a JSON list of {"ans": ...} objects '
    "(LXMERT all_ans.json), {\"answers\": [...]} (a mixture's answers.json) or {answer: index} (LXMERT's "
    "and ViLBERT's ans2label files, indices 0..n-1); other files: one answer a line"
)


def read_answer_file(path: Path) -> list[str]:
    """The entries of an answer-table file, in the file's order: a ``.json`` file holds a
    list of strings, a list of ``{"ans": ...}`` objects, ``{"answers": [...]}`` or an
    ``{answer: index}`` map (in index order; the indices must be 0..n-1); any other
    file holds one answer a line (every line is an entry; a final newline ends the last).
    ConfigError naming the file (and the entry) otherwise."""
    path = Path(path)
    problem = file_problem(path)  # a FIFO would block the read for ever
    if problem:
        raise ConfigError(f"{path}: cannot read the answer table: {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the answer table: {err}") from err
    if path.suffix.lower() != ".json":
        return text.splitlines()
    data = parse_json(text, path)
    if isinstance(data, dict) and isinstance(data.get("answers"), list):
        data = data["answers"]
    elif isinstance(data, dict) and data and all(type(v) is int for v in data.values()):
        if sorted(data.values()) != list(range(len(data))):
            raise ConfigError(f"{path}: an {{answer: index}} table needs the indices 0..{len(data) - 1}, each once")
        data = sorted(data, key=data.get)
    if not isinstance(data, list):
        raise ConfigError(f"{path}: {_FILE_FORMATS}")
    entries = []
    for i, entry in enumerate(data):
        if isinstance(entry, dict):
            if not isinstance(entry.get("ans"), str):
                raise ConfigError(f'{path}: entry {i}: an object entry needs a string "ans" (got {sorted(entry)})')
            entry = entry["ans"]
        elif not isinstance(entry, str):
            raise ConfigError(f"{path}: entry {i}: must be a string (got {entry!r})")
        entries.append(entry)
    return entries


@dataclass(frozen=True)
class FixedTable:
    """A table read from a file: `answers[i]` is entry i normalized. An entry that normalizes
    to nothing ("a") or to an earlier entry's answer ("above the bed" after "above bed") keeps
    its position, so answer ids stay the file's, but no item maps to it: it is `unreachable`,
    and `index` maps every answer to its first position."""

    answers: list[str]
    index: dict[str, int]
    unreachable: list[int]


def fixed_table(entries: list[str], path: Path, normalize: Callable[[str], str] = normalize_answer) -> FixedTable:
    """The table of a file's `entries` (`read_answer_file`), each made an answer by `normalize`
    (default: the VQA normalization); ConfigError naming `path` when none is left."""
    answers = [normalize(e) for e in entries]
    index: dict[str, int] = {}
    unreachable = []
    for i, answer in enumerate(answers):
        if answer and answer not in index:
            index[answer] = i
        else:
            unreachable.append(i)
    if not index:
        raise ConfigError(
            f"{path}: no answers (of its {len(entries)} entries, none is a non-empty answer after "
            "normalization); " + _FILE_FORMATS
        )
    return FixedTable(answers, index, unreachable)
