"""Dynamic padding: a batch cut to its own longest text and its own largest region count.

Examples are padded to the configured maxima (``max_text`` tokens, ``max_regions`` region
slots) when they are made; most of those slots are padding (a Conceptual Captions caption is
about 10 words, a VQA question about 6, and an image has 10 to 36 regions). `trim_padding`
cuts every text tensor of a batch after the last position that any example of the batch
attends to (``attention_mask``) and every region tensor after the last slot any example
fills (``visual_mask``). Texts and regions are filled from the front, and the models mask
padding out of attention and their losses count only real targets, so each example's
outputs are those of the fully padded batch (up to floating-point summation order).

The one quantity that did count padded slots is LXMERT's visual losses, a mean over every
region slot (the reference's 36 are all real); the batch keeps the untrimmed slot count
under ``region_slots`` (one per example) so that those means stay what they were.

``DataSettings.padding``: ``batch`` (default) trims, ``max`` keeps the configured maxima
(fixed shapes, e.g. for ``--compile`` on a GPU).
"""

from __future__ import annotations

import torch

TEXT_KEYS = ("input_ids", "attention_mask", "token_type_ids", "lm_labels")
# Region tensors and how many feature axes follow their slot axis.
REGION_KEYS = {
    "visual_feats": 1,
    "original_feats": 1,
    "visual_pos": 1,
    "region_prob": 1,
    "boxes": 1,
    "visual_mask": 0,
    "region_selected": 0,
    "obj_ids": 0,
    "obj_conf": 0,
    "attr_ids": 0,
    "attr_conf": 0,
    "region_iou": 0,
    "region_target": 0,
    "region_valid": 0,
    "valid": 0,
}
REGION_SLOTS = "region_slots"


def used_length(mask: torch.Tensor) -> int:
    """1 + the last position of the mask's last axis that is set in any row (at least 1)."""
    filled = mask.reshape(-1, mask.shape[-1]).bool().any(0).nonzero()
    return int(filled[-1]) + 1 if len(filled) else 1


def _cut(value: torch.Tensor, axis: int, length: int) -> torch.Tensor:
    return value.narrow(axis, 0, length).contiguous() if value.shape[axis] > length else value


def trim_padding(batch: dict) -> dict:
    """`batch` with its text and region tensors cut to what its examples use (see the
    module's docstring); other entries as they are. A batch without ``attention_mask`` keeps
    its text length, one without ``visual_mask`` its region slots."""
    out = dict(batch)
    mask = batch.get("attention_mask")
    if mask is not None:
        length = used_length(mask)
        for key in TEXT_KEYS:
            if key in out:
                out[key] = _cut(out[key], out[key].ndim - 1, length)
    mask = batch.get("visual_mask")
    if mask is not None:
        slots = used_length(mask)
        if REGION_SLOTS not in out:
            out[REGION_SLOTS] = torch.full((mask.shape[0],), mask.shape[-1], dtype=torch.long)
        for key, trailing in REGION_KEYS.items():
            if key in out:
                out[key] = _cut(out[key], out[key].ndim - 1 - trailing, slots)
    return out


def padded(batch: dict, padding: str) -> dict:
    """`batch` as `padding` (``batch``: `trim_padding`; ``max``: as it is) has it."""
    return trim_padding(batch) if padding == "batch" else batch
