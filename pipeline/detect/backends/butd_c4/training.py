"""Training losses for `VGDetector` (RPN + box head + attribute head), Faster R-CNN style.

Used to train small variants (the embedded demo's detector); the backbone's norms stay
frozen. Per image:

* RPN: anchors with IoU >= 0.7 to a ground-truth box (and each box's best anchor) are
  positive, IoU < 0.3 negative; `rpn_batch` anchors sampled, half positive at most;
  binary cross-entropy on objectness, smooth-L1 on the deltas of positives.
* Box head: RPN proposals (detached) plus the ground-truth boxes; IoU >= 0.5 is
  foreground (its box's class, background 0 otherwise); `roi_batch` sampled, a quarter
  foreground at most; cross-entropy over the background-first classes, smooth-L1 on the
  foreground class's deltas (weights 10, 10, 5, 5).
* Attributes: cross-entropy on foreground regions with the ground-truth class fed to
  the embedding (attribute 0 = "no attribute"). A target may give one attribute per box,
  ``(N,)``, or several, ``(N, K)`` with 0 as padding (Visual Genome boxes carry up to 16);
  then each box's loss is the mean cross-entropy over its given attributes (a box with none
  is trained towards 0, "no attribute", as the 1-D label 0 is), averaged over the boxes —
  so ``(N, 1)`` gives exactly the 1-D loss. See `attribute_loss`.

`calibrate_frozen_norms` readies a freshly initialized model for training from scratch.
Nothing here knows a data set: the shapes-world recipe that trains and measures the
committed ``shapes-tiny`` weights is ``workflows/shapes/shapes_detector.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import box_iou, roi_pool
from torchvision.ops.misc import FrozenBatchNorm2d

from pipeline.detect.backends.butd_c4.extractor import pooled_region_features, rpn_proposals
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.boxes import cell_anchors, encode, grid_anchors
from pipeline.detect.preprocess import preprocess


@dataclass(frozen=True)
class DetectionTarget:
    boxes: np.ndarray  # (N, 4) x1y1x2y2, original pixels
    classes: np.ndarray  # (N,) 1..num_classes (0 is background)
    attributes: np.ndarray  # (N,) 0..num_attributes (0 = none), or (N, K): several per box, 0 = padding


def _sample(labels: torch.Tensor, total: int, positive_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a random subset: at most `positive_fraction` positives (label >= 1)."""
    pos = torch.nonzero(labels >= 1).flatten()
    neg = torch.nonzero(labels == 0).flatten()
    n_pos = min(len(pos), int(total * positive_fraction))
    n_neg = min(len(neg), total - n_pos)
    pos = pos[torch.randperm(len(pos), generator=generator)[:n_pos]]
    neg = neg[torch.randperm(len(neg), generator=generator)[:n_neg]]
    return torch.cat([pos, neg])


def attribute_loss(logits: torch.Tensor, attributes: torch.Tensor) -> torch.Tensor:
    """Attribute cross-entropy for `logits` (n, A+1) against `attributes`: (n,) one label
    per box (0 = "no attribute", a class like any other), or (n, K) several labels per box
    with 0 as padding. For (n, K): a box's loss is the mean negative log-likelihood of its
    non-zero labels (softmax over the A+1 columns; a row of zeros means "no attribute",
    label 0, as in the 1-D case); the result is the mean over the boxes."""
    if attributes.dim() == 1:
        return F.cross_entropy(logits, attributes)
    if attributes.dim() != 2:
        raise ValueError(f"attributes must be (N,) or (N, K), got shape {tuple(attributes.shape)}")
    given = attributes > 0
    given[:, 0] |= ~given.any(dim=1)  # no attribute at all: one target, label 0 (the row holds 0 there)
    labels = torch.where(given, attributes, torch.zeros_like(attributes))
    nll = -F.log_softmax(logits, dim=1).gather(1, labels)
    per_box = (nll * given).sum(dim=1) / given.sum(dim=1)
    return per_box.mean()


def detection_losses(
    model: VGDetector,
    images: list[np.ndarray],
    targets: list[DetectionTarget],
    rpn_batch: int = 256,
    roi_batch: int = 128,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    cell = cell_anchors(cfg.anchor_sizes, cfg.anchor_ratios)
    losses = {k: torch.zeros(()) for k in ("rpn_cls", "rpn_loc", "cls", "box", "attr")}
    for rgb, target in zip(images, targets):
        x, scale = preprocess(rgb, cfg)
        h, w = x.shape[-2:]
        gt = torch.as_tensor(target.boxes, dtype=torch.float32) * scale
        gt_cls = torch.as_tensor(target.classes, dtype=torch.long)
        gt_attr = torch.as_tensor(target.attributes, dtype=torch.long)
        fmap = model.backbone(x)

        # RPN
        logits, deltas = model.proposal_generator.rpn_head(fmap)
        a, fh, fw = cfg.num_anchors, fmap.shape[-2], fmap.shape[-1]
        logits = logits[0].permute(1, 2, 0).reshape(-1)
        deltas = deltas[0].reshape(a, 4, fh, fw).permute(2, 3, 0, 1).reshape(-1, 4)
        anchors = grid_anchors(cell, fh, fw, cfg.feature_stride)
        iou = box_iou(anchors, gt)  # (anchors, gt)
        best, match = iou.max(dim=1)
        labels = torch.full((len(anchors),), -1, dtype=torch.long)
        labels[best < 0.3] = 0
        labels[best >= 0.7] = 1
        labels[iou.argmax(dim=0)] = 1
        picked = _sample(labels, rpn_batch, 0.5, gen)
        losses["rpn_cls"] = losses["rpn_cls"] + F.binary_cross_entropy_with_logits(
            logits[picked], labels[picked].float()
        )
        pos = picked[labels[picked] == 1]
        target_deltas = encode(anchors[pos], gt[match[pos]])
        losses["rpn_loc"] = losses["rpn_loc"] + F.smooth_l1_loss(
            deltas[pos], target_deltas, beta=0.0, reduction="sum"
        ) / max(1, len(picked))

        # Box head on proposals + ground truth
        with torch.no_grad():
            proposals = torch.cat([rpn_proposals(model, cell, fmap.detach(), h, w), gt])
        iou = box_iou(proposals, gt)
        best, match = iou.max(dim=1)
        roi_labels = torch.where(best >= 0.5, gt_cls[match], torch.zeros_like(match))
        picked = _sample(roi_labels, roi_batch, 0.25, gen)
        feats = pooled_region_features(model, fmap, proposals[picked])
        predictor = model.roi_heads.box_predictor
        labels = roi_labels[picked]
        losses["cls"] = losses["cls"] + F.cross_entropy(predictor.cls_score(feats), labels)
        fg = torch.nonzero(labels > 0).flatten()
        if len(fg):
            box_deltas = predictor.bbox_pred(feats[fg]).reshape(len(fg), -1, 4)[torch.arange(len(fg)), labels[fg] - 1]
            wanted = encode(proposals[picked][fg], gt[match[picked][fg]], cfg.bbox_reg_weights)
            losses["box"] = losses["box"] + F.smooth_l1_loss(box_deltas, wanted, beta=0.0, reduction="sum") / len(
                picked
            )
            if predictor.has_attributes:
                attr_logits = predictor.attribute_logits(feats[fg], labels[fg])
                losses["attr"] = losses["attr"] + attribute_loss(attr_logits, gt_attr[match[picked][fg]])
    n = max(1, len(images))
    return {k: v / n for k, v in losses.items()}


@torch.no_grad()
def calibrate_frozen_norms(
    model: VGDetector, images: list[np.ndarray], boxes: list[np.ndarray], scale: float = 1.0
) -> None:
    """Set every frozen norm of a freshly initialized model from data, as a batch norm's
    statistics would be (the norms stay frozen afterwards): each conv's output over
    `images` (backbone) or over the regions `boxes` (original pixels; res5) gets mean 0 and
    standard deviation `scale`. Layers are calibrated in forward order, each seeing the
    calibrated outputs of the layers before it. Training from scratch needs this: the
    generic initialization keeps a deep random tower tame by shrinking activations, which
    leaves a small network's features orders of magnitude below its heads' scale."""

    def hook(norm: FrozenBatchNorm2d, args: tuple) -> None:
        x = args[0].transpose(0, 1).reshape(norm.weight.shape[0], -1)
        norm.running_mean.copy_(x.mean(dim=1))
        var = x.var(dim=1)
        norm.running_var.copy_(var.clamp(min=0.01 * float(var.mean()) + 1e-12))  # a dead channel: at most 10x gain
        norm.weight.fill_(scale)
        norm.bias.zero_()

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, FrozenBatchNorm2d)]
    try:
        batch, scales = zip(*(preprocess(rgb, model.cfg) for rgb in images))
        if len({tuple(x.shape) for x in batch}) != 1:
            raise ValueError("calibration images must share one size")
        fmap = model.backbone(torch.cat(batch))
        regions = [torch.as_tensor(b, dtype=torch.float32).reshape(-1, 4) * s for b, s in zip(boxes, scales)]
        pooled = roi_pool(fmap, regions, model.cfg.pooler_resolution, 1.0 / model.cfg.feature_stride)
        model.roi_heads.res5(pooled)
    finally:
        for h in handles:
            h.remove()
