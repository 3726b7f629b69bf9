"""BERT WordPiece tokenization with the `tokenizers` library.

The vocabulary comes from a ``vocab.txt`` (BERT uncased: lowercased here), a
``tokenizer.json`` of a BERT WordPiece tokenizer (its own normalizer; its padding and
truncation are switched off: the dataset pads), or a folder holding either (``vocab.txt``
first), as a Hugging Face model folder does. `bundled_bert_vocab` is bert-base-uncased's
``vocab.txt``, shipped with this package (the demo's default; tests, benchmarks).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
from tokenizers import BertWordPieceTokenizer, Tokenizer, models

from pipeline.errors import ConfigError

SPECIAL_TOKENS = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "mask_token": "[MASK]",
    "unk_token": "[UNK]",
}


# bert-base-uncased's vocab.txt (30,522 WordPieces; google-research/bert, Apache-2.0), as released
BUNDLED_VOCAB = Path(__file__).resolve().parent / "vocab" / "bert-base-uncased.txt"
BUNDLED_VOCAB_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"


def bundled_bert_vocab() -> Path:
    """bert-base-uncased's WordPiece vocab, shipped with vl_models (package data)."""
    return BUNDLED_VOCAB


@dataclass(frozen=True)
class Encoded:
    ids: np.ndarray  # (length,) int64: [CLS] tokens [SEP] then [PAD]s
    mask: np.ndarray  # (length,) int64: 1 on real tokens
    special: np.ndarray  # (length,) bool: [CLS], [SEP], [PAD] (never masked)
    types: np.ndarray  # (length,) int64: token type (segment) ids: 1 on a pair's second segment, else 0


def vocab_file(source: Union[str, Path]) -> Path:
    """The file a ``--vocab`` names: a vocab.txt or tokenizer.json, or the one in a folder."""
    source = Path(source)
    if source.is_dir():
        for name in ("vocab.txt", "tokenizer.json"):
            if (source / name).is_file():
                return source / name
        raise ConfigError(f"{source}: no vocab.txt or tokenizer.json in this folder")
    if not source.is_file():
        raise ConfigError(f"vocab file not found: {source}")
    return source


_WORD = re.compile(r"\S+")


def head(text: str, pieces: int) -> str:
    """The start of `text` that decides its first `pieces` word pieces: its first ``2 * pieces +
    16`` whitespace-separated words (each word gives one piece or more, unless normalization
    erases it whole), found without reading past them. What is cut before tokenizing, so that a
    10 MB question costs what its first words cost; a short text comes back as it is."""
    if len(text) <= 64 * (pieces + 16):
        return text
    end = 0
    for count, word in enumerate(_WORD.finditer(text)):
        if count >= 2 * pieces + 16:
            break
        end = word.end()
    return text[:end]


class WordPiece:
    def __init__(self, source: Union[str, Path], lowercase: bool = True):
        self.path = vocab_file(source)
        try:
            if self.path.suffix == ".json":
                self.tok = Tokenizer.from_file(str(self.path))
                self.tok.no_padding()
                self.tok.no_truncation()
            else:
                self.tok = BertWordPieceTokenizer(str(self.path), lowercase=lowercase)
        except Exception as err:  # tokenizers raises a bare Exception for unreadable files
            raise ConfigError(f"{self.path}: not a WordPiece vocab.txt or tokenizer.json ({err})") from err
        if not isinstance(self.tok.model, models.WordPiece):
            raise ConfigError(f"{self.path}: a {type(self.tok.model).__name__} tokenizer; BERT's WordPiece is needed")
        vocab = self.tok.get_vocab()
        for token in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"):
            if token not in vocab:
                raise ConfigError(f"{self.path}: no {token} token")
        self.cls_id, self.sep_id, self.pad_id, self.mask_id = (vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"))
        self.vocab_size = len(vocab)
        self.lowercase = lowercase

    def encode(self, text: str, max_length: int) -> Encoded:
        pieces = self.tok.encode(head(text, max_length), add_special_tokens=False).ids[: max_length - 2]
        ids = np.full(max_length, self.pad_id, np.int64)
        ids[: len(pieces) + 2] = [self.cls_id, *pieces, self.sep_id]
        mask = (np.arange(max_length) < len(pieces) + 2).astype(np.int64)
        special = ~mask.astype(bool)
        special[0] = special[len(pieces) + 1] = True
        return Encoded(ids, mask, special, np.zeros(max_length, np.int64))

    def pieces(self, text: str, retokenize: bool = False) -> list[int]:
        """The WordPiece ids of `text` (no special tokens). ``retokenize``: as vilbert-multi-task's
        VCR reader makes them (`vcr_dataset.py`, ``tokenize``): the pieces written out with
        spaces and tokenized again, so a continuation piece ``##ing`` becomes ``#``, ``#``,
        ``ing``; special tokens in the text (``[SEP]``) stay one token both times."""
        enc = self.tok.encode(text, add_special_tokens=False)
        if not retokenize:
            return list(enc.ids)
        return list(self.tok.encode(" ".join(enc.tokens), add_special_tokens=False).ids)

    def encode_pair(
        self,
        first: Union[str, Sequence[str]],
        second: str,
        max_length: int,
        *,
        retokenize: bool = False,
        pad_to: Optional[int] = None,
    ) -> Encoded:
        """``[CLS] first [SEP] second [SEP]`` padded to `pad_to` (default `max_length`), as
        vilbert-multi-task builds VCR's pairs (`vcr_dataset.py`: ``tokenize``,
        ``_truncate_seq_pair``): `first` (a text, or several joined by ``[SEP]``: QA->R's
        question and answer) is kept whole and `second` loses tokens from its end until the
        pair fits `max_length`; token type 0 on ``[CLS] first [SEP]``, 1 on ``second [SEP]``.
        Where `first` alone leaves no room (the reference fails there), it is cut to leave
        `second` one token. ``retokenize``: `pieces`'."""
        segments = [first] if isinstance(first, str) else list(first)
        a: list[int] = []
        for k, segment in enumerate(segments):
            a += ([self.sep_id] if k else []) + self.pieces(head(segment, max_length), retokenize)
        b = self.pieces(head(second, max_length), retokenize)
        if len(a) > max_length - 3:
            a = a[: max(max_length - 4, 0)]
        b = b[: max_length - 3 - len(a)]
        pieces = [self.cls_id, *a, self.sep_id, *b, self.sep_id]
        length = max_length if pad_to is None else pad_to
        if length < len(pieces):
            raise ValueError(f"pad_to {pad_to} is shorter than max_length {max_length}")
        ids = np.full(length, self.pad_id, np.int64)
        ids[: len(pieces)] = pieces
        mask = (np.arange(length) < len(pieces)).astype(np.int64)
        special = ~mask.astype(bool) | (ids == self.cls_id) | (ids == self.sep_id)
        types = np.zeros(length, np.int64)
        types[len(a) + 2 : len(pieces)] = 1
        return Encoded(ids, mask, special, types)

    def save_pretrained(self, folder: Path, model_max_length: int) -> None:
        """Write the tokenizer as `transformers.AutoTokenizer` reads it: vocab.txt,
        tokenizer.json (fast: adds [CLS] ... [SEP]), tokenizer_config.json and
        special_tokens_map.json."""
        folder = Path(folder)
        if self.path.suffix == ".json":
            shutil.copyfile(self.path, folder / "tokenizer.json")
            vocab = self.tok.get_vocab()
            (folder / "vocab.txt").write_text("".join(t + "\n" for t in sorted(vocab, key=vocab.get)))
            normalizer = json.loads(self.path.read_text()).get("normalizer") or {}
            lowercase = bool(normalizer.get("lowercase", self.lowercase))
        else:
            shutil.copyfile(self.path, folder / "vocab.txt")
            BertWordPieceTokenizer(str(self.path), lowercase=self.lowercase).save(str(folder / "tokenizer.json"))
            lowercase = self.lowercase
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": lowercase,
            "model_max_length": model_max_length,
            **SPECIAL_TOKENS,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        (folder / "special_tokens_map.json").write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
