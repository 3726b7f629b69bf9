"""BERT WordPiece tokenization with the `tokenizers` library.

The vocabulary comes from a ``vocab.txt`` (BERT uncased: lowercased here), a
``tokenizer.json`` of a BERT WordPiece tokenizer (its own normalizer; its padding and
truncation are switched off: the dataset pads), or a folder holding either (``vocab.txt``
first), as a Hugging Face model folder does. `bundled_bert_vocab` is bert-base-uncased's
``vocab.txt``, shipped with this package (the demo's default; tests, benchmarks).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Union

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
    ids: np.ndarray  # (max_length,) int64: [CLS] tokens [SEP] then [PAD]s
    mask: np.ndarray  # (max_length,) int64: 1 on real tokens
    special: np.ndarray  # (max_length,) bool: [CLS], [SEP], [PAD] (never masked)


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
        pieces = self.tok.encode(text, add_special_tokens=False).ids[: max_length - 2]
        ids = np.full(max_length, self.pad_id, np.int64)
        ids[: len(pieces) + 2] = [self.cls_id, *pieces, self.sep_id]
        mask = (np.arange(max_length) < len(pieces) + 2).astype(np.int64)
        special = ~mask.astype(bool)
        special[0] = special[len(pieces) + 1] = True
        return Encoded(ids, mask, special)

    def encode_pair(self, first: str, second: str, max_length: int) -> Encoded:
        """``[CLS] first [SEP] second [SEP]`` (VCR's question and choice), the longer side
        truncated first, as BERT's pair inputs."""
        a = self.tok.encode(first, add_special_tokens=False).ids
        b = self.tok.encode(second, add_special_tokens=False).ids
        while len(a) + len(b) > max_length - 3:
            (a if len(a) > len(b) else b).pop()
        pieces = [self.cls_id, *a, self.sep_id, *b, self.sep_id]
        ids = np.full(max_length, self.pad_id, np.int64)
        ids[: len(pieces)] = pieces
        mask = (np.arange(max_length) < len(pieces)).astype(np.int64)
        special = ~mask.astype(bool)
        special[[0, len(a) + 1, len(pieces) - 1]] = True
        return Encoded(ids, mask, special)

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
