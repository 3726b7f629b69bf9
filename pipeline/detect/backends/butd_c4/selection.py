"""Bottom-up attention's region-selection policies (pure functions of one image's proposals,
class probabilities and box deltas; their settings are `pipeline.detect.config.SelectionConfig`),
named and recorded in store provenance:

* ``butd`` (default; the Caffe bottom-up-attention `generate_tsv.py`): boxes are the RPN
  proposals, *not* regressed, mapped back to original-image pixels; for each foreground
  class, Caffe's NMS at 0.3 over that class's scores (`lib/nms/cpu_nms.pyx`: float32,
  +1 pixel widths and heights, suppress when overlap >= threshold — the +1 is why the
  scale the boxes are at matters); a proposal's confidence is its best surviving class
  score; keep proposals with confidence >= 0.2, then clamp the count to [min, max]
  (top-min / top-max by confidence when outside; otherwise proposal order is kept).
* ``maxnms`` (the detectron2 / HF ports): each proposal takes its best foreground class
  and that class's *regressed* box; class-agnostic NMS (torchvision: no +1, overlap >
  threshold suppresses) at 0.3, 0.4, ... 0.9 until at least `min` boxes survive; the top
  `max` by score. Features stay those of the proposal.
"""

from __future__ import annotations

from typing import Optional

import torch
from torchvision.ops import nms

from pipeline.detect.backends.butd_c4.config import DEFAULT_SELECTION
from pipeline.detect.boxes import caffe_overlaps, clip, decode
from pipeline.detect.config import BoxCount, SelectionConfig
from pipeline.detect.preprocess import Resize


def per_class_nms_max_conf(boxes: torch.Tensor, probs: torch.Tensor, thresh: float) -> torch.Tensor:
    """For each box, its highest score among the classes for which it survives Caffe's NMS
    at `thresh` (greedy, score-ordered; `caffe_overlaps` >= thresh, compared in double as
    Cython does, suppresses). All classes at once: one overlap matrix (boxes are shared),
    R greedy steps vectorized over the C classes — the same result as C calls of
    `cpu_nms`, without C x R^2 work in Python."""
    num_boxes, num_classes = probs.shape
    if num_boxes == 0:
        return torch.zeros(0)
    overlaps = caffe_overlaps(boxes).double() >= thresh  # (R, R)
    order = torch.argsort(probs, dim=0, descending=True, stable=True)  # (R, C): rank -> box
    classes = torch.arange(num_classes)
    suppressed = torch.zeros(num_classes, num_boxes, dtype=torch.bool)
    kept = torch.zeros(num_classes, num_boxes, dtype=torch.bool)
    for rank in range(num_boxes):
        cand = order[rank]
        ok = ~suppressed[classes, cand]
        live, box = classes[ok], cand[ok]
        kept[live, box] = True
        suppressed[live] |= overlaps[box]
    return (probs.t() * kept).max(dim=0).values


def select_butd(
    proposals: torch.Tensor, cls_prob: torch.Tensor, count: BoxCount, nms_thresh: float = 0.3, conf_thresh: float = 0.2
) -> torch.Tensor:
    """Indices of the proposals kept by the BUTD rule (see module doc). `proposals` are in
    original-image pixels (Caffe's ``rois / im_scale``); `cls_prob` is (R, C+1) with the
    background at column 0."""
    max_conf = per_class_nms_max_conf(proposals.float().cpu(), cls_prob[:, 1:].float().cpu(), nms_thresh)
    keep = torch.nonzero(max_conf.double() >= conf_thresh).flatten()
    if len(keep) < count.min:
        keep = torch.argsort(max_conf, descending=True, stable=True)[: count.min]
    elif len(keep) > count.max:
        keep = torch.argsort(max_conf, descending=True, stable=True)[: count.max]
    return keep


def select_maxnms(
    boxes_per_class: torch.Tensor,
    cls_prob: torch.Tensor,
    count: BoxCount,
    thresholds=(0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept indices, their regressed boxes) for the class-agnostic max-NMS rule.
    `boxes_per_class` is (R, C*4) regressed boxes for the foreground classes."""
    fg = cls_prob[:, 1:].float()
    scores, classes = fg.max(dim=1)
    boxes = boxes_per_class.float().reshape(len(fg), -1, 4)[torch.arange(len(fg)), classes]
    keep = nms(boxes, scores, thresholds[0])
    for thresh in thresholds:
        keep = nms(boxes, scores, thresh)
        if len(keep) >= count.min:
            break
    keep = keep[: count.max]
    return keep, boxes[keep]


def select_regions(
    selection: SelectionConfig,
    proposals: torch.Tensor,
    probs: torch.Tensor,
    deltas: Optional[torch.Tensor],
    resize: Resize,
    bbox_reg_weights,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept indices, their boxes in original pixels) for one image's `proposals` (resized
    pixels), `probs` (background first) and box `deltas` (only maxnms reads them: None will do
    for butd), by the selection policy (its unset fields BUTD's defaults)."""
    selection = selection.resolved(DEFAULT_SELECTION)
    if selection.policy == "butd":
        original = resize.to_original(proposals)  # Caffe's NMS runs at the original scale
        keep = select_butd(original, probs, selection.boxes, selection.nms_thresh, selection.conf_thresh)
        keep = keep.to(proposals.device)
        return keep, original[keep]
    regressed = clip(decode(deltas, proposals, bbox_reg_weights), resize.new_height, resize.new_width)
    keep, chosen = select_maxnms(regressed, probs, selection.boxes)
    return keep, resize.to_original(chosen)
