"""Pure box arithmetic shared by the detector backends (no model, no I/O): anchors, box
deltas, clipping, and overlaps with the +1-pixel widths of Caffe and maskrcnn-benchmark.
"""

from __future__ import annotations

import torch

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


def decode(
    deltas: torch.Tensor, boxes: torch.Tensor, weights=(1.0, 1.0, 1.0, 1.0), plus_one: bool = False
) -> torch.Tensor:
    """Apply (dx, dy, dw, dh) deltas to x1y1x2y2 boxes (detectron2's Box2BoxTransform; works on
    (N, 4k) deltas for k classes at once). ``plus_one``: maskrcnn-benchmark's ``BoxCoder``, whose
    widths and heights are ``x2 - x1 + 1`` and whose decoded ``x2``, ``y2`` are one pixel in."""
    boxes = boxes.to(deltas.dtype)
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    if plus_one:
        widths, heights = widths + 1, heights + 1
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
    x2, y2 = pcx + 0.5 * pw, pcy + 0.5 * ph
    if plus_one:
        x2, y2 = x2 - 1, y2 - 1
    out = torch.stack([pcx - 0.5 * pw, pcy - 0.5 * ph, x2, y2], dim=-1)
    return out.reshape(deltas.shape)


def legacy_anchors(stride: int, sizes, ratios) -> torch.Tensor:
    """(A, 4) cell anchors of Detectron's (and maskrcnn-benchmark's) ``generate_anchors``:
    ratio-major then size, around the centre of a ``stride`` x ``stride`` cell with +1 widths and
    numpy's round-half-to-even widths and heights; float32."""
    import numpy as np

    ctr = 0.5 * (stride - 1)
    rows = []
    for ratio in ratios:
        ws = np.round(np.sqrt(stride * stride / ratio))
        hs = np.round(ws * ratio)
        for size in sizes:
            w, h = ws * (size / stride), hs * (size / stride)
            rows.append([ctr - 0.5 * (w - 1), ctr - 0.5 * (h - 1), ctr + 0.5 * (w - 1), ctr + 0.5 * (h - 1)])
    return torch.tensor(rows, dtype=torch.float64).float()


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
    """Clip x1y1x2y2 boxes (any (..., 4k) layout) to [0, width] x [0, height] (maskrcnn-benchmark's
    ``clip_to_image``: pass ``width - 1`` and ``height - 1``)."""
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
