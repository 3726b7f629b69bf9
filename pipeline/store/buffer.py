"""The padded batch a model reads: `RegionBatch` (fixed slots per image, an optional IMG
token first), the `RegionBuffer` that holds its arrays and is filled image by image (by
`FeatureStore.get_many_into`, or record by record), and `pad_regions` of a list of
`pipeline.records.RegionFeatures`. Positions, mask and the IMG token are derived here on
read, never stored."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional, Sequence

import numpy as np

from pipeline.records import OPTIONAL_ARRAYS, POSITION_WIDTHS, PROB_FIELDS, Position, RegionFeatures, box_positions


@dataclass(frozen=True, eq=False)
class RegionBatch:
    """A padded batch of region features for the trainer.

    Slot layout per image: optional IMG token at slot 0 (`img_token_feature` of the regions in the
    batch, box covering the whole image), then the first `max_regions` regions, then padding. `mask` is True on
    real slots (IMG token included). Padding and the IMG token carry label id -1 and
    zero confidences / probabilities. `regions` counts an image's regions in its slots (the IMG
    token not counted); `slots_used` counts its occupied slots (the IMG token counted).
    """

    image_ids: list[str]
    features: np.ndarray  # (B, K, D) float32
    positions: np.ndarray  # (B, K, 4|5) float32
    mask: np.ndarray  # (B, K) bool
    regions: np.ndarray  # (B,) int64, regions in the slots per image (the IMG token not counted)
    objects_id: Optional[np.ndarray] = None  # (B, K) int64
    objects_conf: Optional[np.ndarray] = None  # (B, K) float32
    attrs_id: Optional[np.ndarray] = None
    attrs_conf: Optional[np.ndarray] = None
    cls_prob: Optional[np.ndarray] = None  # (B, K, C) float32
    attr_prob: Optional[np.ndarray] = None
    img_token: bool = False  # slot 0 holds the IMG token

    @property
    def slots_used(self) -> np.ndarray:
        """(B,) int64: occupied slots per image, the IMG token included."""
        return self.regions + int(self.img_token)

    def image(self, b: int) -> "RegionBatch":
        """Image `b` as a one-image batch of views."""
        one = slice(b, b + 1)
        arrays = (f.name for f in fields(self) if f.name != "img_token")
        return RegionBatch(
            **{name: None if getattr(self, name) is None else getattr(self, name)[one] for name in arrays},
            img_token=self.img_token,
        )


def img_token_feature(features: np.ndarray, visible: np.ndarray) -> np.ndarray:
    """ViLBERT's [IMG] feature: the mean of the `visible` regions' features, (D,) float32;
    zeros when none is visible. Computed over the regions the model gets (not those beyond
    the slot budget), and after masking over the ones left visible, so that a masked
    region cannot be recovered from it."""
    count = int(visible.sum())
    if not count:
        return np.zeros(features.shape[1], np.float32)
    return (features[visible].sum(axis=0, dtype=np.float64) / count).astype(np.float32)


_IMG_POSITION = np.array([0, 0, 1, 1, 1, 1], np.float32)  # the IMG token's box: the whole image (area, w, h 1)
Memory = Literal["plain", "pinned", "shared"]


def empty_array(shape: tuple, dtype, memory: Memory = "plain") -> np.ndarray:
    """A zeroed array; "pinned": in page-locked memory when CUDA exists (fast, asynchronous
    host-to-GPU copies); "shared": a view of a torch tensor in shared memory, which a
    DataLoader worker hands to the main process without copying it (torch collates its
    batches so). The array's `.base` is then that tensor."""
    if memory == "plain":
        return np.zeros(shape, dtype)
    import torch

    if memory == "pinned" and not torch.cuda.is_available():
        return np.zeros(shape, dtype)
    kind = torch.from_numpy(np.zeros(0, dtype)).dtype
    tensor = (
        torch.zeros(shape, dtype=kind, pin_memory=True)
        if memory == "pinned"
        else torch.zeros(shape, dtype=kind).share_memory_()
    )
    return tensor.numpy()


class RegionBuffer:
    """The padded arrays of a `RegionBatch` of `size` images of up to `max_regions` regions,
    allocated once and filled with images (`put_many`, `put` for one): the one owner of the
    slot layout (`pad_regions` is a buffer filled once). Slot 0 holds the IMG token with
    `img_token`; `position` "4d", "5d" or "6d". `fields`: the optional fields to hold (of
    `OPTIONAL_ARRAYS`; `prob_widths` gives each probability table's width); an image lacking
    one gets the padding values there (ids -1, else 0) and is in `missing[field]` (a set of
    image slots). Features and probability tables have dtype `dtype` (the stored float16 copies straight), boxes and
    confidences float32, ids int64; `memory` as in `empty_array`. Filling copies each array
    once; positions, mask and the IMG token are computed for the whole batch by `batch`."""

    def __init__(
        self,
        size: int,
        max_regions: int,
        feature_dim: int,
        *,
        position: Position = "5d",
        img_token: bool = False,
        fields: Sequence[str] = (),
        prob_widths: Optional[dict] = None,
        dtype="float32",
        memory: Memory = "plain",
    ):
        if size < 1 or max_regions < 1:
            raise ValueError("a RegionBuffer needs size >= 1 and max_regions >= 1")
        unknown = set(fields) - set(OPTIONAL_ARRAYS)
        if unknown:
            raise ValueError(f"unknown region fields {sorted(unknown)}; choose from {OPTIONAL_ARRAYS}")
        widths = prob_widths or {}
        self.first, self.max_regions, self.position = int(img_token), max_regions, position
        slots = max_regions + self.first
        self.image_ids: list[str] = [""] * size
        # per image (lists: filled image by image, read once per batch): its size in pixels and the regions held
        self.widths, self.heights, self.counts = [1] * size, [1] * size, [0] * size  # (IMG token excluded)
        self.boxes = np.zeros((size, slots, 4), np.float32)  # pixel boxes, zero in padding
        self.features = empty_array((size, slots, feature_dim), dtype, memory)
        self.positions = empty_array((size, slots, POSITION_WIDTHS[position]), np.float32, memory)
        self.mask = empty_array((size, slots), bool, memory)
        self.optional: dict[str, np.ndarray] = {}
        for name in fields:
            if name in PROB_FIELDS:
                if not widths.get(name):
                    raise ValueError(f"no width for {name}: give it in prob_widths, or leave {name} out of fields")
                self.optional[name] = empty_array((size, slots, widths[name]), dtype, memory)
            else:
                self.optional[name] = empty_array(
                    (size, slots), np.int64 if name.endswith("_id") else np.float32, memory
                )
                if name.endswith("_id"):
                    self.optional[name].fill(-1)
        self.missing = {name: set() for name in fields}  # the image slots lacking each field
        # 1-d views of the region arrays (field -> (view, values per region, padding)): what `put_many` fills
        self._flat = {}
        for name, out in (("boxes", self.boxes), ("features", self.features), *self.optional.items()):
            view = out.view()
            view.shape = (-1,)  # raises rather than copy: the arrays are contiguous
            self._flat[name] = (view, int(np.prod(out.shape[2:], dtype=np.int64)), -1 if name.endswith("_id") else 0)
        # what a compiled gather fills (`native.gather_rows`): per field (values per region, dtype,
        # padding) in `signature`, which buffers of the same shape share, and its address in `addresses`
        self.signature = tuple((name, width, v.dtype, pad) for name, (v, width, pad) in self._flat.items())
        self.addresses = np.array([v.ctypes.data for v, _, _ in self._flat.values()], np.int64)

    def __len__(self) -> int:
        return len(self.image_ids)

    def put(
        self, b: int, image_id: str, image_h: int, image_w: int, boxes: np.ndarray, features: np.ndarray, optional: dict
    ) -> None:
        """Copy one image's first `max_regions` regions into image slot `b` (`optional`: field
        -> array or None, for the buffer's `fields`): `put_many` of one image."""

        def flat(value):
            return ([None], [-1]) if value is None else ([np.ascontiguousarray(value).reshape(-1)], [0])

        sources = {"boxes": flat(boxes), "features": flat(features)}
        sources.update((name, flat(optional.get(name))) for name in self.optional)
        self.put_many([b], [image_id], [image_h], [image_w], [len(boxes)], sources)

    def put_many(
        self,
        slots: Sequence[int],
        image_ids: Sequence[str],
        heights: Sequence[int],
        widths: Sequence[int],
        counts: Sequence[int],
        sources: dict,
    ) -> None:
        """Copy images into image slots `slots`, each its first `max_regions` regions (store
        order), clearing what a previous, larger image left beyond them. Image k has
        `counts[k]` regions; `sources` maps "boxes", "features" and the buffer's optional
        fields to a pair (arrays, starts): image k's values are
        ``arrays[k][starts[k] : starts[k] + counts[k] * width]`` (1-d, row-major; `width`
        values per region); ``starts[k] < 0`` where it lacks the field, which is then
        padded and marked in `missing`. One slice copy per image and field: the arrays may
        be views of a shard's map (the values of many images in one array)."""
        first, limit, per_image = self.first, self.max_regions, self.boxes.shape[1]
        bases, kept, stale = [], [], []  # each image's first region slot, counted over the batch; regions kept
        for b, image_id, image_h, image_w, n in zip(slots, image_ids, heights, widths, counts):
            base, n, held = b * per_image + first, min(n, limit), self.counts[b]
            if held > n:  # a previous, larger image's regions beyond the new ones
                stale.append((base + n, base + held))
            bases.append(base)
            kept.append(n)
            self.image_ids[b], self.heights[b], self.widths[b], self.counts[b] = image_id, image_h, image_w, n
        for name, (out, width, pad) in self._flat.items():
            arrays, starts = sources[name]
            for base, n, values, start in zip(bases, kept, arrays, starts):
                if start < 0:
                    out[base * width : (base + n) * width] = pad
                else:
                    out[base * width : (base + n) * width] = values[start : start + n * width]
            for begin, end in stale:
                out[begin * width : end * width] = pad
            lacking = [b for b, start in zip(slots, starts) if start < 0] if min(starts, default=0) < 0 else ()
            self._note_missing(name, slots, lacking)

    def _note_missing(self, name: str, slots: Sequence[int], lacking: Sequence[int]) -> None:
        """Image slots `slots` were just filled; those in `lacking` lack field `name`."""
        missing = self.missing.get(name)
        if missing is not None:
            missing.difference_update(slots)
            missing.update(lacking)

    def note_filled(self, slots: Sequence[int], image_ids: Sequence[str], sizes: np.ndarray, lacking: dict) -> None:
        """Image slots `slots` were filled by a compiled gather (`native.gather_rows`) with
        `image_ids`: `sizes[k]` is (height, width, regions kept) of image k, `lacking[name]`
        whether each lacks field `name` (a bool array)."""
        heights, widths, counts = sizes.T.tolist()
        if slots == list(range(len(slots))):
            k = len(slots)
            self.image_ids[:k], self.heights[:k], self.widths[:k], self.counts[:k] = image_ids, heights, widths, counts
        else:
            for b, image_id, image_h, image_w, n in zip(slots, image_ids, heights, widths, counts):
                self.image_ids[b], self.heights[b], self.widths[b], self.counts[b] = image_id, image_h, image_w, n
        for name, flags in lacking.items():
            if flags.any():
                self._note_missing(name, slots, [b for b, lack in zip(slots, flags.tolist()) if lack])
            elif self.missing.get(name):
                self._note_missing(name, slots, ())

    def put_record(self, b: int, rec: RegionFeatures) -> None:
        """`put` of a record."""
        self.put(
            b,
            rec.image_id,
            rec.image_h,
            rec.image_w,
            rec.boxes,
            rec.features,
            {name: getattr(rec, name) for name in self.optional},
        )

    def batch(self, images: Optional[slice] = None, img_feature: bool = True) -> RegionBatch:
        """A `RegionBatch` of views of these arrays (of `images`, default all), its positions,
        mask and IMG token computed now for all its images at once. An optional field
        missing from any of its images is None, as `pad_regions` leaves it. With
        ``img_feature=False`` the IMG token's feature is left as it is (for a caller that
        computes it itself, after masking regions)."""
        sel = images or slice(None)
        first, counts = self.first, np.array(self.counts[sel], np.int64)
        image_w, image_h = np.array(self.widths[sel], np.float64), np.array(self.heights[sel], np.float64)
        positions, mask, features = self.positions[sel], self.mask[sel], self.features[sel]
        positions[:] = box_positions(self.boxes[sel], image_w[:, None], image_h[:, None], self.position)
        np.less(np.arange(mask.shape[1]), (counts + first)[:, None], out=mask)
        if first:
            positions[:, 0] = _IMG_POSITION[: positions.shape[2]]
            if img_feature:  # the mean of the regions (padding is zero), as `img_token_feature`
                features[:, 0] = features[:, 1:].sum(axis=1, dtype=np.float64) / np.maximum(counts, 1)[:, None]
        held = range(len(self))[sel]
        optional = {
            name: out[sel] if self.missing[name].isdisjoint(held) else None for name, out in self.optional.items()
        }
        return RegionBatch(
            image_ids=self.image_ids[sel],
            features=features,
            positions=positions,
            mask=mask,
            regions=counts,
            img_token=bool(first),
            **optional,
        )


def pad_regions(
    records: Sequence[RegionFeatures],
    max_regions: int,
    *,
    position: Position = "5d",
    img_token: bool = False,
) -> RegionBatch:
    """Pad records to a fixed number of slots (regions beyond `max_regions` are dropped,
    keeping store order), float32: a `RegionBuffer` filled once. Optional label/probability
    arrays are filled only when every record has them."""
    if not records:
        raise ValueError("pad_regions needs at least one record")
    fields = [name for name in OPTIONAL_ARRAYS if all(getattr(r, name) is not None for r in records)]
    widths = {name: getattr(records[0], name).shape[1] for name in PROB_FIELDS if name in fields}
    buffer = RegionBuffer(
        len(records),
        max_regions,
        records[0].features.shape[1],
        position=position,
        img_token=img_token,
        fields=fields,
        prob_widths=widths,
    )
    for b, rec in enumerate(records):
        buffer.put_record(b, rec)
    return buffer.batch()
