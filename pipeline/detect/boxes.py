"""Pure box arithmetic and the region-selection policies (no model, no I/O); their
settings (`BoxCount`, `SelectionConfig`, `POLICIES`) are in `pipeline.detect.config`.

Policies (named and recorded in store provenance):

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

import torch
from torchvision.ops import nms

from pipeline.detect.config import BoxCount

_SCALE_CLAMP = torch.log(torch.tensor(1000.0 / 16)).item()


def cell_anchors(sizes, ratios) -> torch.Tensor:
    """(A, 4) anchors centred on 0, size-major then ratio (detectron2's order)."""
    out = []
    for size in sizes:
        area = float(size) ** 2
        for ratio in ratios:
            w = (area / ratio) ** 0.5
            h = ratio * w
            out.append([-w / 2, -h / 2, w / 2, h / 2])
    return torch.tensor(out)


def grid_anchors(cell: torch.Tensor, height: int, width: int, stride: int) -> torch.Tensor:
    """(H*W*A, 4) anchors over a feature map, position-major then anchor (matches the
    RPN head's (A, H, W) outputs permuted to (H, W, A))."""
    ys = torch.arange(height, dtype=torch.float32) * stride
    xs = torch.arange(width, dtype=torch.float32) * stride
    sy, sx = torch.meshgrid(ys, xs, indexing="ij")
    shifts = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4)
    return (shifts + cell.to(shifts).reshape(1, -1, 4)).reshape(-1, 4)


def decode(deltas: torch.Tensor, boxes: torch.Tensor, weights=(1.0, 1.0, 1.0, 1.0)) -> torch.Tensor:
    """Apply (dx, dy, dw, dh) deltas to x1y1x2y2 boxes (detectron2's Box2BoxTransform;
    works on (N, 4k) deltas for k classes at once)."""
    boxes = boxes.to(deltas.dtype)
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    cx = boxes[:, 0] + 0.5 * widths
    cy = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx, dy = deltas[:, 0::4] / wx, deltas[:, 1::4] / wy
    dw = (deltas[:, 2::4] / ww).clamp(max=_SCALE_CLAMP)
    dh = (deltas[:, 3::4] / wh).clamp(max=_SCALE_CLAMP)
    pcx = dx * widths[:, None] + cx[:, None]
    pcy = dy * heights[:, None] + cy[:, None]
    pw = torch.exp(dw) * widths[:, None]
    ph = torch.exp(dh) * heights[:, None]
    out = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, pcx + 0.5 * pw, pcy + 0.5 * ph], dim=-1)
    return out.reshape(deltas.shape)


def encode(boxes: torch.Tensor, targets: torch.Tensor, weights=(1.0, 1.0, 1.0, 1.0)) -> torch.Tensor:
    """The deltas that `decode` turns `boxes` into `targets` with (for training)."""
    wx, wy, ww, wh = weights
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    tw = targets[:, 2] - targets[:, 0]
    th = targets[:, 3] - targets[:, 1]
    tcx, tcy = targets[:, 0] + 0.5 * tw, targets[:, 1] + 0.5 * th
    return torch.stack(
        [wx * (tcx - cx) / w, wy * (tcy - cy) / h, ww * torch.log(tw / w), wh * torch.log(th / h)], dim=1
    )


def clip(boxes: torch.Tensor, height: float, width: float) -> torch.Tensor:
    """Clip x1y1x2y2 boxes (any (..., 4k) layout) to [0, width] x [0, height]."""
    out = boxes.clone()
    out[..., 0::2] = out[..., 0::2].clamp(0, width)
    out[..., 1::2] = out[..., 1::2].clamp(0, height)
    return out


def caffe_overlaps(boxes: torch.Tensor) -> torch.Tensor:
    """(R, R) float32 IoU of x1y1x2y2 boxes with Caffe's +1 pixel widths and heights,
    computed in the order `cpu_nms` computes it (so ties with a threshold fall alike)."""
    boxes = boxes.float()
    x1, y1, x2, y2 = boxes.unbind(dim=1)
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    w = (torch.minimum(x2[:, None], x2[None]) - torch.maximum(x1[:, None], x1[None]) + 1).clamp(min=0)
    h = (torch.minimum(y2[:, None], y2[None]) - torch.maximum(y1[:, None], y1[None]) + 1).clamp(min=0)
    inter = w * h
    return inter / (areas[:, None] + areas[None] - inter)


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
