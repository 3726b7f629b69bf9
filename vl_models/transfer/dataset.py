"""Fine-tuning and evaluation examples: a split of a task dataset (`pipeline.task_data`)
joined with the feature stores, as a model family sees it (box encoding, IMG token, text
length) and as the task shapes it (`Task.example`: C candidate (text, image) pairs and the
targets).

Every example is a function of (seed, epoch, index) only — a retrieval negative is drawn
from a generator seeded by those — so a resumed run sees the same examples. Tensors of an
example have a leading candidate axis: ``input_ids`` (C, L), ``visual_feats`` (C, N, D), ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from pipeline.errors import ConfigError
from pipeline.records import pad_regions
from pipeline.store import FeatureStore
from pipeline.task_data import TaskData
from vl_models.config import DataSettings
from vl_models.data.tokenize import WordPiece

CANDIDATE_KEYS = ("input_ids", "attention_mask", "visual_feats", "visual_pos", "visual_mask")


class TaskDataset(torch.utils.data.Dataset):
    """Split `split` (comma-separated: a union) of `data` for `task` and `family`."""

    def __init__(
        self,
        data: TaskData,
        task,
        stores: Sequence[Path],
        vocab: Path,
        family,
        settings: DataSettings,
        split: str,
        seed: int = 0,
        train: bool = True,
        task_id: int = 0,
    ):
        self.data, self.task, self.family, self.cfg = data, task, family, settings
        self.seed, self.train, self.task_id, self.split = seed, train, task_id, split
        self.rows = data.rows(split)
        if not len(self.rows):
            raise ConfigError(
                f"{data.path}: no {task.name} rows in split {split!r}; its splits: {', '.join(data.splits)}"
            )
        self.max_text = settings.max_text or task.max_text or family.max_text
        self.stores = [
            FeatureStore.open(p, dtype="float32", verify=True if settings.verify_shards else None) for p in stores
        ]
        self.tokenizer = WordPiece(vocab)
        self.epoch = 0

    def __len__(self) -> int:
        return self.task.length(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def value(self, name: str, i: int):
        """Field `name` of the split's `i`-th row."""
        return self.data.column(name)[int(self.rows[i])]

    def missing_images(self) -> list[str]:
        """The images of this split that no feature store holds, sorted."""
        return sorted(k for k in self.data.store_keys(self.rows) if not any(k in s for s in self.stores))

    def _record(self, key: str):
        for store in self.stores:
            if key in store:
                return store.get(key)
        raise KeyError(f"image {key!r} is in no feature store")

    def text(self, text: str, second: Optional[str] = None) -> dict:
        enc = (
            self.tokenizer.encode(text, self.max_text)
            if second is None
            else self.tokenizer.encode_pair(text, second, self.max_text)
        )
        return {"input_ids": enc.ids, "attention_mask": enc.mask}

    def image(self, key: str) -> dict:
        """An image's padded regions (``visual_*``), with ``boxes`` (slots, 4) in pixels and
        ``valid`` (slots,): the real region slots (not the IMG token, not padding)."""
        record = self._record(key)
        family = self.family
        batch = pad_regions([record], self.cfg.max_regions, position=family.position, img_token=family.img_token)
        first, n = int(family.img_token), int(batch.num_regions[0]) - int(family.img_token)
        boxes = np.zeros((batch.mask.shape[1], 4), np.float32)
        boxes[first : first + n] = record.boxes[:n]
        valid = batch.mask[0].copy()
        valid[:first] = False
        return {
            "visual_feats": batch.features[0],
            "visual_pos": batch.positions[0],
            "visual_mask": batch.mask[0].astype(np.int64),
            "boxes": boxes,
            "valid": valid,
        }

    def candidates(self, pairs: Sequence[tuple[dict, dict]]) -> dict:
        """(text, image) pairs stacked on a leading candidate axis."""
        merged = [{**text, **image} for text, image in pairs]
        return {k: np.stack([m[k] for m in merged]) for k in CANDIDATE_KEYS}

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng([self.seed, self.epoch, int(i)])
        example = self.task.example(self, int(i), rng)
        example["task_id"] = np.int64(self.task_id)
        example["index"] = np.int64(i)
        return example
