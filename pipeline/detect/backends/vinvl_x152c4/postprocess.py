"""VinVL's box selection: maskrcnn-benchmark's `PostProcessor` with scene_graph_benchmark's
filters (`roi_heads/box_head/inference.py`), as pure functions of one image's proposals, class
probabilities and box deltas. Both run torchvision's NMS, which that code uses at the commit the
fixture was made from (no +1 pixel in the overlap; suppress above the threshold).

* ``per-class`` (``NMS_FILTER 1``, `filter_results_peter`; what the released features used): for
  every foreground class, NMS at the threshold (0.3, fixed in the reference) over all proposals'
  boxes of that class by that class's probability; a proposal's label is its best class among
  those where it survived, its score that probability; proposals surviving in no class are
  dropped. The survivors sorted by score; those scoring >= the confidence threshold are kept,
  topped up to `min` with the next best (when that many survived) and cut at `max`.
* ``class-agnostic`` (``NMS_FILTER 2``, `filter_results_fast`): each proposal takes its best
  foreground class; proposals scoring above 1/100 of the confidence threshold enter one NMS (0.5
  in the reference) on the proposal boxes; then as above (score order, >= threshold, topped up to
  `min`, cut at `max`).

Boxes are the proposals (``TEST.IGNORE_BOX_REGRESSION True``, the README's feature extraction)
or, with regression, each label's regressed box (`per-class` only: the reference's
class-agnostic filter with regression reports boxes of other proposals, so that combination is
refused). Boxes are clipped to ``[0, w - 1] x [0, h - 1]`` of the resized image. A region's
feature is its proposal's either way.
"""

from __future__ import annotations

from typing import Optional

import torch
from torchvision.ops import nms

from pipeline.detect.boxes import clip, decode
from pipeline.detect.config import SelectionConfig


def class_boxes(
    proposals: torch.Tensor, deltas: Optional[torch.Tensor], height: int, width: int, weights
) -> torch.Tensor:
    """(R, 4C) clipped boxes per class: the regressed ones, or (no `deltas`) the proposal's in
    every class."""
    if deltas is None:
        return clip(proposals, height - 1, width - 1)
    return clip(decode(deltas, proposals, weights, plus_one=True), height - 1, width - 1)


def _cut(order: torch.Tensor, scores: torch.Tensor, selection: SelectionConfig) -> torch.Tensor:
    """`order` (indices by descending score) cut as the filters cut it: the ones scoring >= the
    threshold, but at least `min` and at most `max` of them."""
    passed = int((scores >= selection.conf_thresh).sum())
    return order[: min(max(passed, selection.boxes.min), selection.boxes.max)]


def select_per_class(
    boxes: torch.Tensor, probs: torch.Tensor, selection: SelectionConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(proposal indices, labels, scores, boxes) of ``NMS_FILTER 1``, best first. `boxes` is (R, 4)
    (the proposals, shared by every class) or (R, 4C); `probs` (R, C), background at 0."""
    num, classes = probs.shape
    survived = torch.zeros_like(probs)
    for j in range(1, classes):
        box_j = boxes if boxes.shape[1] == 4 else boxes[:, 4 * j : 4 * (j + 1)]
        survived[nms(box_j, probs[:, j], selection.nms_thresh), j] = 1
    scores, labels = (survived * probs).max(1)
    inds = scores.nonzero(as_tuple=True)[0]
    labels, scores = labels[inds], scores[inds]
    chosen = boxes[inds] if boxes.shape[1] == 4 else boxes.reshape(num, classes, 4)[inds, labels]
    order = _cut(torch.sort(scores, descending=True).indices, scores, selection)
    return inds[order], labels[order], scores[order], chosen[order]


def select_class_agnostic(
    boxes: torch.Tensor, probs: torch.Tensor, selection: SelectionConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(proposal indices, labels, scores, boxes) of ``NMS_FILTER 2``, best first; `boxes` (R, 4)."""
    scores, labels = probs[:, 1:].max(1)
    labels = labels + 1
    sane = (boxes[:, 2] - boxes[:, 0] >= 0) & (boxes[:, 3] - boxes[:, 1] >= 0)
    keep = (sane & (scores > selection.conf_thresh * 0.01)).nonzero(as_tuple=True)[0]
    kept = keep[nms(boxes[keep], scores[keep], selection.nms_thresh)]
    order = kept[torch.sort(scores[kept], descending=True).indices]
    order = _cut(order, scores[order], selection)
    return order, labels[order], scores[order], boxes[order]


def select(
    proposals: torch.Tensor,
    probs: torch.Tensor,
    deltas: Optional[torch.Tensor],
    selection: SelectionConfig,
    height: int,
    width: int,
    weights,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The selection policy's (proposal indices, labels, scores, boxes in resized pixels)."""
    boxes = class_boxes(proposals, deltas if selection.regression else None, height, width, weights)
    if selection.policy == "per-class":
        return select_per_class(boxes, probs, selection)
    return select_class_agnostic(boxes, probs, selection)
