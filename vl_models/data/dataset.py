"""Pretraining examples: mixture items joined with feature-store records.

The mixture (`Mixture.open`: ``items.arrow``) and the feature stores are memory-mapped, so DataLoader
workers share the page cache instead of holding copies. Every example is a function of
(seed, epoch, item index) only: masking, negative sampling and answer sampling draw from
a generator seeded by those three numbers, so a resumed run sees the same examples.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch

from pipeline.errors import ConfigError
from pipeline.mixture import Mixture
from pipeline.records import img_token_feature, pad_regions
from pipeline.store import FeatureStore, RegionBuffer
from vl_models.config import DataSettings
from vl_models.data.masking import mask_regions, mask_tokens, mismatch, overlapping, sample_answer
from vl_models.data.tokenize import WordPiece


class PretrainDataset(torch.utils.data.Dataset):
    """Split `split` of a mixture as `family`'s model sees it (`vl_models.families`: box
    encoding, IMG token, text length, region masking, region targets), with the text
    length, region slots and masking rates of `settings`; examples are seeded by `seed`."""

    def __init__(self, mixture: Union[Mixture, Path], stores: Sequence[Path], vocab_file: Path,
                 settings: DataSettings, family, split: str = "train", seed: int = 0):
        if settings.region_overlap not in family.region_overlap:
            raise ConfigError(f"--region-overlap {settings.region_overlap}: {family.name} supports "
                              f"{', '.join(family.region_overlap)}")
        self.cfg = settings
        self.family = family
        self.seed = seed
        self.max_text = settings.max_text or family.max_text
        self.mixture = mixture if isinstance(mixture, Mixture) else Mixture.open(mixture)
        self.rows = self.mixture.rows(split)
        if not len(self.rows):
            raise ConfigError(f"{self.mixture.path}: no items in split {split!r}")
        self.images = self.mixture.store_keys
        self.stores = [FeatureStore.open(p, dtype="float32", verify=True if settings.verify_shards else None)
                       for p in stores]
        self.tokenizer = WordPiece(vocab_file)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.rows)

    def missing_images(self) -> list[str]:
        """The images of this split that no feature store holds, sorted."""
        return sorted(key for key in set(self.images[self.rows]) if not any(key in store for store in self.stores))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _record(self, key: str):
        for store in self.stores:
            if key in store:
                return store.get(key)
        raise KeyError(f"image {key!r} is in no feature store (build the mixture with --stores to catch this)")

    def labels(self, i: int) -> tuple[list[int], list[float]]:
        """Item `i`'s answer ids and soft scores (empty for a caption)."""
        return self.mixture.labels(int(self.rows[i]))

    def captions(self, images: int, per_image: int) -> list[list[int]]:
        """The mixture rows of the captions of the split's first `images` images (in split
        order), up to `per_image` each: retrieval's queries (read with `text`, the image of
        the first with `image`)."""
        kinds = self.mixture.kinds
        found: dict[str, list[int]] = {}
        for row in self.rows:
            image = self.images[row]
            if kinds[row] != "caption" or len(found.get(image, ())) >= per_image:
                continue
            if image in found or len(found) < images:
                found.setdefault(image, []).append(int(row))
        return list(found.values())

    def text(self, row: int) -> dict:
        """One item's text, unmasked."""
        enc = self.tokenizer.encode(self.mixture.text(row), self.max_text)
        return {"input_ids": enc.ids, "attention_mask": enc.mask}

    def image(self, row: int) -> dict:
        """One item's image regions, unmasked."""
        batch = self._regions(self.images[row])
        return {"visual_feats": batch.features[0], "visual_pos": batch.positions[0],
                "visual_mask": batch.mask[0].astype(np.int64)}

    def _regions(self, key: str):
        family = self.family
        return pad_regions([self._record(key)], self.cfg.max_regions, position=family.position,
                           img_token=family.img_token)

    def _gather(self, keys: Sequence[str]) -> RegionBuffer:
        """The regions of images `keys`, padded as `_regions` pads one, read in one batched
        gather per store (`FeatureStore.get_many_into`) into a fresh buffer."""
        family, stores = self.family, self.stores
        out = stores[0].region_buffer(len(keys), self.cfg.max_regions, position=family.position,
                                      img_token=family.img_token)
        if len(stores) == 1:
            return stores[0].get_many_into(keys, out)
        owner = [next((s for s, store in enumerate(stores) if key in store), None) for key in keys]
        for key, s in zip(keys, owner):
            if s is None:
                self._record(key)  # raises, naming the image
        for s, store in enumerate(stores):
            slots = [b for b, o in enumerate(owner) if o == s]
            store.get_many_into([keys[b] for b in slots], out, slots)
        return out

    def __getitems__(self, indices: Sequence[int]) -> list[dict]:
        """The examples of `indices` (what a DataLoader asks for one batch): the same
        examples as ``[self[i] for i in indices]``, with every image's regions read in one
        batched gather and masked in place, so an example's region arrays are rows of one
        batch buffer: the only further copy is the collate's, into the batch tensor."""
        regions = self._gather([self.images[int(self.rows[i])] for i in indices])
        return [self._example(i, regions.batch(slice(b, b + 1)), owned=True) for b, i in enumerate(indices)]

    def __getitem__(self, i: int) -> dict:
        return self._example(i, self._regions(self.images[int(self.rows[i])]), owned=False)

    def _example(self, i: int, batch, owned: bool) -> dict:
        """Example `i` over its image's padded regions `batch` (a one-image `RegionBatch`);
        with `owned` its feature rows may be masked in place."""
        cfg = self.cfg
        rng = np.random.default_rng([self.seed, self.epoch, int(i)])
        row = int(self.rows[i])
        image = self.images[row]
        text_row, matched = row, 1
        if mismatch(rng, cfg.mismatch_prob):
            for _ in range(10):  # a sentence of a different image
                other = int(self.rows[rng.integers(len(self.rows))])
                if self.images[other] != image:
                    text_row, matched = other, 0
                    break
        text = self.mixture.text(text_row)
        enc = self.tokenizer.encode(text, self.max_text)
        ids, lm_labels = mask_tokens(enc.ids, enc.special, rng, self.tokenizer.vocab_size, self.tokenizer.mask_id, cfg.mlm_prob)

        family = self.family
        first = int(family.img_token)  # the IMG token is never masked
        slots = batch.mask.shape[1]
        m = mask_regions(slots - first, int(batch.num_boxes[0]) - first, rng, family.region_masking, cfg.region_prob)
        selected = np.concatenate([np.zeros(first, bool), m.selected])
        zeroed = np.concatenate([np.zeros(first, bool), m.zeroed])
        replaced = np.concatenate([np.zeros(first, bool), m.replaced])
        original = batch.features[0].copy()
        features = batch.features[0] if owned else original.copy()
        regions = batch.mask[0] & (np.arange(slots) >= first)  # real region slots (not IMG, not padding)
        if cfg.region_overlap == "zero":  # IoU on the normalized boxes (scale-free)
            zeroed |= selected | (overlapping(batch.positions[0][:, :4], selected) & regions)
        features[zeroed] = 0.0
        if replaced.any():  # a feature of another image
            other = self._record(self.images[int(self.rows[rng.integers(len(self.rows))])])
            picks = rng.integers(0, other.num_boxes, int(replaced.sum()))
            features[replaced] = other.features[picks]
        if family.img_token:  # over what the model sees, after masking
            features[0] = img_token_feature(features, regions & ~zeroed)

        example = {
            "input_ids": ids, "attention_mask": enc.mask, "lm_labels": lm_labels,
            "visual_feats": features, "visual_pos": batch.positions[0], "visual_mask": batch.mask[0].astype(np.int64),
            "region_selected": selected, "matched": np.int64(matched),
        }
        example.update(family.visual_targets(replace(batch, features=original[None]) if owned else batch, original, image))
        answer_ids, scores = self.mixture.labels(row)
        if matched and answer_ids:
            example["qa_label"] = np.int64(sample_answer(answer_ids, scores, torch.Generator().manual_seed(int(rng.integers(2**31)))))
        else:
            example["qa_label"] = np.int64(-1)
        return example
