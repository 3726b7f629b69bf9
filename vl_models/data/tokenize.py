"""WordPiece tokenization with the `tokenizers` library from a BERT vocab file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import BertWordPieceTokenizer

from pipeline.errors import ConfigError


@dataclass(frozen=True)
class Encoded:
    ids: np.ndarray  # (max_length,) int64: [CLS] tokens [SEP] then [PAD]s
    mask: np.ndarray  # (max_length,) int64: 1 on real tokens
    special: np.ndarray  # (max_length,) bool: [CLS], [SEP], [PAD] (never masked)


class WordPiece:
    def __init__(self, vocab_file: Path, lowercase: bool = True):
        if not Path(vocab_file).exists():
            raise ConfigError(f"vocab file not found: {vocab_file}")
        self.tok = BertWordPieceTokenizer(str(vocab_file), lowercase=lowercase)
        vocab = self.tok.get_vocab()
        for token in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"):
            if token not in vocab:
                raise ConfigError(f"{vocab_file}: no {token} token")
        self.cls_id, self.sep_id, self.pad_id, self.mask_id = (vocab[t] for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]"))
        self.vocab_size = len(vocab)

    def encode(self, text: str, max_length: int) -> Encoded:
        pieces = self.tok.encode(text, add_special_tokens=False).ids[: max_length - 2]
        ids = np.full(max_length, self.pad_id, np.int64)
        ids[: len(pieces) + 2] = [self.cls_id, *pieces, self.sep_id]
        mask = (np.arange(max_length) < len(pieces) + 2).astype(np.int64)
        special = ~mask.astype(bool)
        special[0] = special[len(pieces) + 1] = True
        return Encoded(ids, mask, special)
