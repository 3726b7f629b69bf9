"""Pure, seeded masking and sampling for the pretraining tasks.

Label convention: -1 means "no target here" (ignored by the losses), as in both
reference implementations (HF uses -100; convert at the boundary if needed).

* words (both models): 15 % of the non-special tokens are selected; of those 80 % become
  [MASK], 10 % a random token, 10 % stay;
* regions, ViLBERT: 15 % of the real regions; 90 % zeroed, 10 % kept (paper §3.2); the KL
  target is on the selected regions only. 12-in-1's variant zeroes every selected region
  and every region overlapping one by IoU > 0.4 (`overlapping`), the latter without a target;
* regions, LXMERT: 15 %; 80 % zeroed, 10 % replaced by a feature of another image, 10 % kept;
* matching: with probability 0.5 the text is swapped for one of a different image;
* QA (LXMERT): one answer drawn in proportion to its soft score (`sample_answer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def mask_tokens(
    ids: np.ndarray, special: np.ndarray, rng: np.random.Generator, vocab_size: int, mask_id: int, prob: float = 0.15
) -> tuple[np.ndarray, np.ndarray]:
    """(masked ids, labels) for one sequence; `special` marks [CLS]/[SEP]/padding."""
    ids = ids.copy()
    labels = np.full_like(ids, -1)
    chosen = (rng.random(ids.shape) < prob) & ~special
    labels[chosen] = ids[chosen]
    roll = rng.random(ids.shape)
    ids[chosen & (roll < 0.8)] = mask_id
    random_tok = chosen & (roll >= 0.8) & (roll < 0.9)
    ids[random_tok] = rng.integers(0, vocab_size, int(random_tok.sum()))
    return ids, labels


@dataclass(frozen=True)
class RegionMasking:
    """A model family's region-masking flavour: of the selected regions, the share zeroed
    and the share replaced by another image's feature (the rest stay unaltered)."""

    zero: float
    replace: float = 0.0


@dataclass(frozen=True)
class RegionMask:
    selected: np.ndarray  # (N,) bool: regions whose prediction is trained
    zeroed: np.ndarray  # (N,) bool: features replaced by zeros
    replaced: np.ndarray  # (N,) bool: features replaced by another image's (LXMERT)


def mask_regions(
    slots: int, regions: int, rng: np.random.Generator, masking: RegionMasking, prob: float = 0.15
) -> RegionMask:
    """Over `slots` region slots (the IMG token's not among them), select among the first
    `regions` (the occupied ones); zero / replace them as `masking` says."""
    real = np.arange(slots) < regions
    selected = (rng.random(slots) < prob) & real
    roll = rng.random(slots)
    zeroed = selected & (roll < masking.zero)
    replaced = selected & (roll >= masking.zero) & (roll < masking.zero + masking.replace)
    return RegionMask(selected, zeroed, replaced)


def overlapping(boxes: np.ndarray, selected: np.ndarray, threshold: float = 0.4) -> np.ndarray:
    """The unselected regions whose IoU with a selected one exceeds `threshold` (boxes
    x1y1x2y2, any consistent unit)."""
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    area = (x2 - x1) * (y2 - y1)
    ix = np.clip(np.minimum(x2[:, None], x2[None]) - np.maximum(x1[:, None], x1[None]), 0, None)
    iy = np.clip(np.minimum(y2[:, None], y2[None]) - np.maximum(y1[:, None], y1[None]), 0, None)
    inter = ix * iy
    iou = inter / np.maximum(area[:, None] + area[None] - inter, 1e-12)
    return (iou[:, selected] > threshold).any(axis=1) & ~selected


def mismatch(rng: np.random.Generator, p: float = 0.5) -> bool:
    """Whether this item's text is swapped for another image's (a negative pair)."""
    return bool(rng.random() < p)


def sample_answer(answer_ids: list[int], scores: list[float], generator: torch.Generator) -> int:
    """One answer id drawn in proportion to its soft score (LXMERT's QA label), or -1."""
    if not answer_ids or sum(scores) <= 0:
        return -1
    probs = torch.tensor(scores, dtype=torch.float64)
    return int(answer_ids[int(torch.multinomial(probs / probs.sum(), 1, generator=generator))])
