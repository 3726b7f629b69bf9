"""Answer normalization, soft scores and the joint answer table.

`normalize_answer` applies the official VQA evaluation's rules, then LXMERT's answer-table
rules (`AnswerTable.convert_ans`), in this order:

1. lowercase; newlines and tabs become spaces; outer whitespace stripped;
2. punctuation (VQA `processPunctuation`): ``; / [ ] " { } ( ) = + \\ _ - > < @ ` , ? !``
   are removed, except a comma between digits (``1,000`` stays); a period not between
   digits is removed (``2.5`` stays);
3. digits and articles (VQA `processDigitArticle`): number words ``none``, ``zero`` ...
   ``ten`` become digits, the articles ``a``, ``an``, ``the`` are dropped, and common
   contractions get their apostrophe (``dont`` -> ``don't``);
4. LXMERT: a trailing ``.`` is stripped, ``grey`` becomes ``gray``.

Soft scores follow VQA: an answer given by k of the annotators scores ``min(1, k / 3)``.
The answer table keeps the K most frequent normalized answers over the training items
(ties broken alphabetically, so the table is deterministic).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable

_PUNCT = [";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!"]
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_NUMBERS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
            "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_CONTRACTIONS = {
    "aint": "ain't", "arent": "aren't", "cant": "can't", "couldve": "could've", "couldnt": "couldn't",
    "didnt": "didn't", "doesnt": "doesn't", "dont": "don't", "hadnt": "hadn't", "hasnt": "hasn't",
    "havent": "haven't", "hed": "he'd", "hes": "he's", "howd": "how'd", "howll": "how'll", "hows": "how's",
    "Id": "I'd", "Im": "I'm", "Ive": "I've", "isnt": "isn't", "itd": "it'd", "itll": "it'll", "lets": "let's",
    "mightnt": "mightn't", "mightve": "might've", "mustnt": "mustn't", "mustve": "must've", "neednt": "needn't",
    "shant": "shan't", "shed": "she'd", "shes": "she's", "shouldve": "should've", "shouldnt": "shouldn't",
    "thats": "that's", "thered": "there'd", "theres": "there's", "theyd": "they'd", "theyll": "they'll",
    "theyre": "they're", "theyve": "they've", "wasnt": "wasn't", "wed": "we'd", "weve": "we've",
    "werent": "weren't", "whatll": "what'll", "whatre": "what're", "whats": "what's", "whatve": "what've",
    "whens": "when's", "whered": "where'd", "wheres": "where's", "whereve": "where've", "whod": "who'd",
    "wholl": "who'll", "whos": "who's", "whove": "who've", "whyll": "why'll", "whyre": "why're", "whys": "why's",
    "wont": "won't", "wouldve": "would've", "wouldnt": "wouldn't", "yall": "y'all", "youd": "you'd",
    "youll": "you'll", "youre": "you're", "youve": "you've",
}


def _punctuation(text: str) -> str:
    out = text
    for p in _PUNCT:
        if (p + " " in text or " " + p in text) or re.search(_COMMA_STRIP, text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out)


def _digits_and_articles(text: str) -> str:
    words = []
    for word in text.lower().split():
        word = _NUMBERS.get(word, word)
        if word not in _ARTICLES:
            words.append(_CONTRACTIONS.get(word, word))
    return " ".join(words)


def normalize_answer(answer: str) -> str:
    text = answer.replace("\n", " ").replace("\t", " ").strip().lower()
    text = _digits_and_articles(_punctuation(text))
    text = text.rstrip(".").strip()
    return " ".join("gray" if w == "grey" else w for w in text.split())


def soft_scores(answers: Iterable[str]) -> dict[str, float]:
    """Normalized answer -> min(1, count / 3) over the annotators' answers."""
    counts = Counter(normalize_answer(a) for a in answers)
    counts.pop("", None)
    return {a: min(1.0, n / 3.0) for a, n in counts.items()}


def answer_table(counts: Counter, top_k: int) -> list[str]:
    """The `top_k` most frequent answers, ties alphabetical."""
    return [a for a, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]]
