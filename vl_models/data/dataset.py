"""Pretraining examples: mixture items joined with feature-store records.

The mixture (`Mixture.open`: ``items.arrow``) and the feature stores are memory-mapped, so DataLoader
workers share the page cache instead of holding copies. Every example is a function of
(seed, epoch, item index) only: masking, negative sampling and answer sampling draw from
a generator seeded by those three numbers, so a resumed run sees the same examples.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np
import torch

from pipeline.errors import ConfigError
from pipeline.mixture import Mixture
from pipeline.store import FeatureStore
from pipeline.store.buffer import RegionBuffer, empty_array, img_token_feature, pad_regions
from vl_models.config import DataSettings
from vl_models.data.loader import drawn
from vl_models.data.masking import mask_regions, mask_tokens, mismatch, overlapping, sample_answer
from vl_models.data.tokenize import WordPiece


def check_region_slots(stores: Sequence, max_regions: int) -> None:
    """A grid store's regions are a feature map's cells in row-major order: keeping the first
    `max_regions` of them would keep the map's top rows. ConfigError when a grid store's images
    can have more cells than the slots (its provenance's ``max_regions``: the largest map, or
    the ``--grid-pool`` cells); a detector's regions come most confident first (BUTD's own cut)."""
    for store in stores:
        layout, manifest = getattr(store, "layout", None), getattr(store, "manifest", None)
        if layout is None or layout.regions != "grid":
            continue
        cells = manifest.provenance.get("max_regions") if manifest is not None else None
        if cells is None or cells > max_regions:
            raise ConfigError(
                f"{getattr(store, 'path', store)} holds grid features of up to {cells or 'an unknown number of'} "
                f"cells per image, and --max-regions {max_regions} would keep only the first cells (the top rows "
                f"of each map): give --max-regions {cells or 'N'} or more, or extract with --grid-pool (e.g. 6x6)"
            )


def _rows_of(values: Sequence) -> Optional[torch.Tensor]:
    """The batch tensor whose consecutive rows `values` are (arrays that are views of one
    C-contiguous array, row b at row b), sharing its memory; None otherwise."""
    first = values[0]
    parent = getattr(first, "base", None)
    if (
        not isinstance(first, np.ndarray)
        or not isinstance(parent, np.ndarray)
        or parent.dtype != first.dtype
        or parent.shape != (len(values), *first.shape)
        or not parent.flags.c_contiguous
    ):
        return None
    start, step = parent.ctypes.data, parent.strides[0]
    if any(
        not isinstance(v, np.ndarray) or v.base is not parent or v.ctypes.data != start + b * step
        for b, v in enumerate(values)
    ):
        return None
    return parent.base if isinstance(parent.base, torch.Tensor) else torch.from_numpy(parent)


def collate(examples: Sequence[dict]) -> dict:
    """`torch.utils.data.default_collate` of `PretrainDataset` examples, except that arrays
    which are the consecutive rows of one batch array (`__getitems__`'s) become that array
    as it is, a tensor of the same memory: no copy. (DataLoader(..., collate_fn=collate).)"""
    out = {}
    for key in examples[0]:
        values = [example[key] for example in examples]
        whole = _rows_of(values)
        out[key] = torch.utils.data.default_collate(values) if whole is None else whole
    return out


class PretrainDataset(torch.utils.data.Dataset):
    """Split `split` of a mixture as `family`'s model sees it (`vl_models.families`: box
    encoding, IMG token, text length, region masking, region targets), with the text
    length, region slots and masking rates of `settings`; examples are seeded by `seed`.
    A DataLoader batches them with `collate` (the trainer passes it as ``collate_fn``)."""

    collate = staticmethod(collate)

    def __init__(
        self,
        mixture: Union[Mixture, Path],
        stores: Sequence[Path],
        vocab_file: Path,
        settings: DataSettings,
        family,
        split: str = "train",
        seed: int = 0,
    ):
        if settings.region_overlap not in family.region_overlap:
            raise ConfigError(
                f"--region-overlap {settings.region_overlap}: {family.name} supports {', '.join(family.region_overlap)}"
            )
        self.cfg = settings
        self.family = family
        self.seed = seed
        self.max_text = settings.max_text or family.max_text
        self.mixture = mixture if isinstance(mixture, Mixture) else Mixture.open(mixture)
        self.rows = self.mixture.rows(split)
        if not len(self.rows):
            raise ConfigError(f"{self.mixture.path}: no items in split {split!r}")
        self.images = self.mixture.store_keys
        self.stores = [
            FeatureStore.open(p, dtype="float32", verify=True if settings.verify_shards else None) for p in stores
        ]
        check_region_slots(self.stores, settings.max_regions)
        self.tokenizer = WordPiece(vocab_file)
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.rows)

    def missing_images(self) -> list[str]:
        """The images of this split that no feature store holds, sorted."""
        return sorted(key for key in set(self.images[self.rows]) if not any(key in store for store in self.stores))

    def text_lengths(self, epoch: int) -> np.ndarray:
        """Each item's text length in words (`ItemsFolder.text_words`) in `epoch`, for length
        grouping: of the text the item has then, its own or the pair negative swapped in
        (`_pair_text`, the same draw `__getitem__` makes). One pass over the items per epoch
        (a few µs each)."""
        words = self.mixture.text_words()
        return np.array(
            [words[self._pair_text(i, np.random.default_rng([self.seed, epoch, i]))[0]] for i in range(len(self))],
            np.int64,
        )

    def _pair_text(self, i: int, rng: np.random.Generator) -> tuple[int, int]:
        """(the mixture row of item `i`'s text, matched: 1 its own, 0 a sentence of another
        image), the first draws of the item's generator."""
        cfg = self.cfg
        row = int(self.rows[i])
        image = self.images[row]
        captions_only = cfg.pair_texts == "captions"
        kinds = self.mixture.kinds
        if mismatch(rng, cfg.mismatch_prob) and (not captions_only or kinds[row] == "caption"):
            for _ in range(10):  # a sentence of a different image
                other = int(self.rows[rng.integers(len(self.rows))])
                if self.images[other] != image and (not captions_only or kinds[other] == "caption"):
                    return other, 0
        return row, 1

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
        return {
            "visual_feats": batch.features[0],
            "visual_pos": batch.positions[0],
            "visual_mask": batch.mask[0].astype(np.int64),
        }

    def _regions(self, key: str):
        family = self.family
        return pad_regions(
            [self._record(key)], self.cfg.max_regions, position=family.position, img_token=family.img_token
        )

    def _gather(self, keys: Sequence[str], memory: str) -> RegionBuffer:
        """The regions of images `keys`, padded as `_regions` pads one, read in one batched
        gather per store (`FeatureStore.get_many_into`) into a fresh buffer in the stored
        dtype, with only the fields the family reads (`region_fields`)."""
        family, stores = self.family, self.stores
        out = stores[0].region_buffer(
            len(keys),
            self.cfg.max_regions,
            position=family.position,
            img_token=family.img_token,
            fields=family.region_fields,
            dtype=stores[0].layout.dtype,
            memory=memory,
        )
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

    def __getitems__(self, indices: Sequence) -> list[dict]:
        """The examples of `indices` (what a DataLoader asks for one batch; an index or an
        ``(epoch, index)`` draw of `vl_models.data.loader.EpochBatches` each): the same
        examples as ``[self[i] for i in indices]``, with every image's regions read in one
        batched gather, converted to float32 once per batch and masked in place, so that an
        example's region arrays are rows of batch arrays (in shared memory in a DataLoader
        worker) which `collate` hands on without copying."""
        memory = "shared" if torch.utils.data.get_worker_info() is not None else "plain"
        draws = [drawn(key, self.epoch) for key in indices]
        regions = self._gather([self.images[int(self.rows[i])] for _, i in draws], memory)
        batch = regions.batch(img_feature=False)  # the IMG feature is computed after masking
        converted = {
            name: _float32(getattr(batch, name), memory)
            for name in ("features", "cls_prob", "attr_prob")
            if getattr(batch, name) is not None
        }
        batch = replace(batch, **converted)  # float32 and unmasked: the original features
        features = empty_array(batch.features.shape, np.float32, memory)
        features[:] = batch.features
        visual_mask = empty_array(batch.mask.shape, np.int64, memory)
        visual_mask[:] = batch.mask
        return [self._example(d, batch.image(b), features[b], visual_mask[b]) for b, d in enumerate(draws)]

    def __getitem__(self, key) -> dict:
        """Example `key`: an index (in the dataset's epoch, `set_epoch`) or an ``(epoch, index)`` draw."""
        epoch, i = drawn(key, self.epoch)
        batch = self._regions(self.images[int(self.rows[i])])
        return self._example((epoch, i), batch, batch.features[0].copy(), batch.mask[0].astype(np.int64))

    def _example(self, draw: tuple[int, int], batch, features: np.ndarray, visual_mask: np.ndarray) -> dict:
        """Example ``draw = (epoch, i)`` over its image's padded, unmasked regions `batch` (a
        one-image `RegionBatch`): `features`, a copy of them, is masked in place."""
        cfg = self.cfg
        epoch, i = draw
        rng = np.random.default_rng([self.seed, epoch, int(i)])
        row = int(self.rows[i])
        image = self.images[row]
        captions_only = cfg.pair_texts == "captions"
        kinds = self.mixture.kinds
        text_row, matched = self._pair_text(int(i), rng)
        text = self.mixture.text(text_row)
        enc = self.tokenizer.encode(text, self.max_text)
        ids, lm_labels = mask_tokens(
            enc.ids, enc.special, rng, self.tokenizer.vocab_size, self.tokenizer.mask_id, cfg.mlm_prob
        )

        family = self.family
        first = int(family.img_token)  # the IMG token is never masked
        slots = batch.mask.shape[1]
        m = mask_regions(slots - first, int(batch.regions[0]), rng, family.region_masking, cfg.region_prob)
        selected = np.concatenate([np.zeros(first, bool), m.selected])
        zeroed = np.concatenate([np.zeros(first, bool), m.zeroed])
        replaced = np.concatenate([np.zeros(first, bool), m.replaced])
        original = batch.features[0]
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
            "input_ids": ids,
            "attention_mask": enc.mask,
            "lm_labels": lm_labels,
            "visual_feats": features,
            "visual_pos": batch.positions[0],
            "visual_mask": visual_mask,
            "region_selected": selected,
            "matched": np.int64(-1 if captions_only and kinds[row] != "caption" else matched),  # -1: no pair label
        }
        example.update(family.visual_targets(batch, original, image))
        answer_ids, scores = self.mixture.labels(row)
        if matched and answer_ids:
            example["qa_label"] = np.int64(
                sample_answer(answer_ids, scores, torch.Generator().manual_seed(int(rng.integers(2**31))))
            )
        else:
            example["qa_label"] = np.int64(-1)
        return example


def _float32(array: np.ndarray, memory: str) -> np.ndarray:
    """`array` in float32, converted in one vectorized pass (torch's; numpy's float16
    conversion is several times slower), into a new array in `memory`."""
    out = empty_array(array.shape, np.float32, memory)
    torch.from_numpy(out).copy_(torch.from_numpy(array))
    return out
