"""Fine-tuning and evaluation examples: a split of a task dataset (`pipeline.task_data`)
joined with the feature stores, as a model family sees it (box encoding, IMG token, text
length) and as the task shapes it (`Task.example`: C candidate (text, image) pairs and the
targets).

Every example is a function of (seed, epoch, index) only — a retrieval negative is drawn
from a generator seeded by those — so a resumed run sees the same examples. Tensors of an
example have a leading candidate axis: ``input_ids`` (C, L), ``token_type_ids`` (C, L)
(1 on a pair's second segment, else 0), ``visual_feats`` (C, N, D), ...

Regions come from the feature stores (the first that holds an image: detections). Stores of
ground-truth boxes (``given_stores``: built with `vlprep extract --given-boxes`, as
vilbert-multi-task's ``*_gt_*`` LMDBs) are separate: a task that adds ground-truth boxes to the
detections as the reference does asks for them (`image(key, ground_truth=...)`: RefCOCO in
training only, so its evaluation never sees a ground-truth box; VCR always).

Two choices follow a published checkpoint's code where it differs from ours (`vltrain
evaluate` sets them, `vl_models.transfer.published`): ``img_feature``, the IMG token's feature
when an image has more regions than the slots (``"kept"``: the mean of the regions in the
slots, ours; ``"all"``: the mean of every region of the image, as vilbert-multi-task's and
vilbert_beta's feature reader computes it before their datasets cut the regions to the slots),
and ``packing``, how a two-image example's regions fill its two rows (``"per-image"``: each
image its own row, ours; ``"mt"``: vilbert-multi-task's NLVR2 packing, `nlvr2.mt_packed`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from pipeline.errors import ConfigError
from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore
from pipeline.store.buffer import pad_regions
from pipeline.task_data import TaskData
from vl_models.config import NLVR2_PACKINGS, DataSettings
from vl_models.data.dataset import check_region_slots
from vl_models.data.loader import drawn
from vl_models.data.tokenize import WordPiece

CANDIDATE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "visual_feats", "visual_pos", "visual_mask")
IMG_FEATURES = ("kept", "all")  # the IMG token's feature: the mean of the regions in the slots, or of all the image's


def _mean(features: np.ndarray) -> np.ndarray:
    """The mean of region features (float64; zeros for none), as the IMG token's feature."""
    return features.sum(axis=0, dtype=np.float64) / max(len(features), 1)


def _opened(store, verify: Optional[bool]):
    """A feature store path opened for float32 reads; an opened store (anything with ``in`` and
    ``get``: `vltrain predict`'s new images) as it is."""
    return FeatureStore.open(store, dtype="float32", verify=verify) if isinstance(store, (str, Path)) else store


def check_given_stores(tasks: Sequence, stores: Sequence[Path], training: bool) -> None:
    """ConfigError when ground-truth boxes' stores (``--given-stores``) are given where no task
    reads them (RefCOCO in training, VCR always), or one of them holds a detector's regions (its
    provenance names a box policy that is no ``--given-boxes`` file); a store imported from
    elsewhere, which records no extraction, is taken at its word."""
    if not stores:
        return
    readers = [t.name for t in tasks if t.ground_truth == "always" or (training and t.ground_truth == "train")]
    if not readers:
        raise ConfigError(
            f"--given-stores: {', '.join(t.name for t in tasks)} read no ground-truth boxes "
            f"{'in training' if training else 'when evaluated'} (RefCOCO's training and VCR do); leave it out"
        )
    for path in stores:
        provenance = FeatureStore.open(path).manifest.provenance
        policy = str(provenance.get("box_policy") or "")
        if provenance.get("detector") and not policy.startswith("given boxes"):
            raise ConfigError(
                f"--given-stores {path}: its features are a detector's regions ({policy or 'no box policy'}), not "
                "ground-truth boxes (vlprep extract --given-boxes FILE, with the file build-task writes, makes those)"
            )


class TaskDataset(torch.utils.data.Dataset):
    """Split `split` (comma-separated: a union) of `data` for `task` and `family`;
    `given_stores`: the ground-truth boxes' feature stores; `img_feature`, `packing`: see the
    module's docstring. `data` is a `TaskData` or anything with its reading methods (`vltrain
    predict`'s queries); `stores` are paths or opened stores; `vocab` a vocab path or a
    `WordPiece`."""

    def __init__(
        self,
        data: TaskData,
        task,
        stores: Sequence[Union[Path, object]],
        vocab: Union[Path, WordPiece],
        family,
        settings: DataSettings,
        split: str,
        seed: int = 0,
        train: bool = True,
        task_id: int = 0,
        given_stores: Sequence[Path] = (),
        img_feature: str = "kept",
        packing: str = "per-image",
    ):
        if img_feature not in IMG_FEATURES:
            raise ValueError(f"img_feature: one of {', '.join(IMG_FEATURES)}, not {img_feature!r}")
        if packing not in NLVR2_PACKINGS:  # a two-image example's rows (see the module's docstring)
            raise ValueError(f"packing: one of {', '.join(NLVR2_PACKINGS)}, not {packing!r}")
        if packing == "mt" and not family.img_token:
            raise ConfigError(
                f"--nlvr2-packing mt packs ViLBERT's IMG tokens and regions (vilbert-multi-task's); a {family.name} "
                "model has no IMG token: leave it out"
            )
        self.img_feature, self.packing = img_feature, packing
        self.data, self.task, self.family, self.cfg = data, task, family, settings
        self.seed, self.train, self.task_id, self.split = seed, train, task_id, split
        self.rows = data.rows(split)
        if not len(self.rows):
            raise ConfigError(
                f"{data.path}: no {task.name} rows in split {split!r}; its splits: {', '.join(data.splits)}"
            )
        self.max_text = settings.max_text or task.max_text or family.max_text
        verify = True if settings.verify_shards else None
        self.stores = [_opened(p, verify) for p in stores]
        self.given_stores = [_opened(p, verify) for p in given_stores]
        check_region_slots(self.stores, settings.max_regions)
        dims = {s.layout.feature_dim for s in self.stores + self.given_stores}
        if self.given_stores and len(dims) > 1:
            raise ConfigError(
                f"the feature stores have features of different widths ({', '.join(map(str, sorted(dims)))}): "
                "ground-truth boxes must come from the detections' detector"
            )
        self.tokenizer = vocab if isinstance(vocab, WordPiece) else WordPiece(vocab)
        self.epoch = 0
        self._memo: dict = {}

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

    def text_lengths(self) -> np.ndarray:
        """Each example's length in words of its row's text (`ItemsFolder.text_words`), for
        length grouping."""
        words = self.data.text_words()[self.rows]
        if len(self) == len(self.rows):
            return words
        return np.array([words[self.task.example_of(self, i)[0]] for i in range(len(self))], np.int64)

    def memo(self, name: str, compute):
        """``compute()``, computed once per dataset (a task's per-split lookup table)."""
        if name not in self._memo:
            self._memo[name] = compute()
        return self._memo[name]

    def _record(self, key: str):
        for store in self.stores:
            if key in store:
                return store.get(key)
        raise KeyError(f"image {key!r} is in no feature store")

    def text(
        self, text: Union[str, Sequence[str]], second: Optional[str] = None, *, limit: Optional[int] = None, **pair
    ) -> dict:
        """``input_ids``, ``attention_mask`` and ``token_type_ids`` of a text or of a pair
        (`WordPiece.encode_pair`: `text` may be several segments, `pair` its options), the
        dataset's text length long; a pair fills at most `limit` of it (default: all)."""
        if second is None:
            enc = self.tokenizer.encode(text, self.max_text)
        else:
            fill = min(limit or self.max_text, self.max_text)
            enc = self.tokenizer.encode_pair(text, second, fill, pad_to=self.max_text, **pair)
        return {"input_ids": enc.ids, "attention_mask": enc.mask, "token_type_ids": enc.types}

    def image(self, key: str, ground_truth: Optional[str] = None, whole: bool = False) -> dict:
        """An image's padded regions (``visual_*``), with ``boxes`` (slots, 4) in pixels (the
        IMG token's: the whole image, ``0, 0, W, H``, as vilbert-multi-task's reader gives it)
        and ``valid`` (slots,): the slots that hold a region or the IMG token (not padding).
        The IMG token's feature as ``img_feature`` says; `whole`: every region of the image,
        in as many slots (no cut to ``max_regions``; at least one slot).

        `ground_truth`: the detections followed by the image's ground-truth boxes (the
        `given_stores`'; none there: the detections alone) as vilbert-multi-task merges them:
        ``"fill"`` (`refer_expression_dataset.py`) the ground-truth boxes fill the slots the
        detections leave, the IMG token the mean of the detections (those in the slots, or
        with ``img_feature`` "all" every one, as the reference's reader); ``"keep"``
        (`vcr_dataset.py`) every ground-truth box is kept (as many as the slots hold) and the
        detections fill the slots left, the IMG token ``(d (n + 1) + g (m + 1)) / (n + m + 2)``
        for n detections of mean d and m ground-truth boxes of mean g (the reference's weights:
        each reader's count includes its IMG token)."""
        record = self._record(key)
        family = self.family
        slots = max(record.num_boxes, 1) if whole else self.cfg.max_regions
        if ground_truth not in (None, "fill", "keep"):
            raise ValueError(f"ground_truth: 'fill', 'keep' or None, not {ground_truth!r}")
        gt = next((s.get(key) for s in self.given_stores if key in s), None) if ground_truth else None
        img = _mean(record.features) if self.img_feature == "all" and record.num_boxes > slots else None
        if gt is not None:
            if ground_truth == "fill":
                dets, gts = min(record.num_boxes, slots), gt.num_boxes
                img = _mean(record.features[: record.num_boxes if self.img_feature == "all" else dets])
            else:
                gts = min(gt.num_boxes, slots)
                dets = min(record.num_boxes, slots - gts)
                n, m = record.num_boxes, gt.num_boxes
                img = (_mean(record.features) * (n + 1) + _mean(gt.features) * (m + 1)) / (n + m + 2)
            record = RegionFeatures(
                image_id=record.image_id,
                image_h=record.image_h,
                image_w=record.image_w,
                boxes=np.concatenate([record.boxes[:dets], gt.boxes[:gts]]),
                features=np.concatenate([record.features[:dets], gt.features[:gts]]),
            )
        batch = pad_regions([record], slots, position=family.position, img_token=family.img_token)
        first, n = int(family.img_token), int(batch.regions[0])
        boxes = np.zeros((batch.mask.shape[1], 4), np.float32)
        boxes[first : first + n] = record.boxes[:n]
        if first:
            boxes[0] = (0, 0, record.image_w, record.image_h)
            if img is not None:
                batch.features[0, 0] = img
        return {
            "visual_feats": batch.features[0],
            "visual_pos": batch.positions[0],
            "visual_mask": batch.mask[0].astype(np.int64),
            "boxes": boxes,
            "valid": batch.mask[0].copy(),
        }

    def candidates(self, pairs: Sequence[tuple[dict, dict]]) -> dict:
        """(text, image) pairs stacked on a leading candidate axis."""
        merged = [{**text, **image} for text, image in pairs]
        return {k: np.stack([m[k] for m in merged]) for k in CANDIDATE_KEYS}

    def __getitem__(self, key) -> dict:
        """Example `key`: an index (in the dataset's epoch, `set_epoch`) or an ``(epoch, index)``
        draw (`vl_models.data.loader.EpochBatches`)."""
        epoch, i = drawn(key, self.epoch)
        rng = np.random.default_rng([self.seed, epoch, i])
        example = self.task.example(self, int(i), rng)
        example["task_id"] = np.int64(self.task_id)
        example["index"] = np.int64(i)
        return example
