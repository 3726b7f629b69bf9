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
  the embedding (attribute 0 = "no attribute").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.ops import box_iou

from pipeline.detect.boxes import cell_anchors, encode, grid_anchors
from pipeline.detect.extractor import pooled_region_features, rpn_proposals
from pipeline.detect.model import VGDetector
from pipeline.detect.preprocess import preprocess


@dataclass(frozen=True)
class DetectionTarget:
    boxes: np.ndarray  # (N, 4) x1y1x2y2, original pixels
    classes: np.ndarray  # (N,) 1..num_classes (0 is background)
    attributes: np.ndarray  # (N,) 0..num_attributes (0 = none)


def _sample(labels: torch.Tensor, total: int, positive_fraction: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a random subset: at most `positive_fraction` positives (label >= 1)."""
    pos = torch.nonzero(labels >= 1).flatten()
    neg = torch.nonzero(labels == 0).flatten()
    n_pos = min(len(pos), int(total * positive_fraction))
    n_neg = min(len(neg), total - n_pos)
    pos = pos[torch.randperm(len(pos), generator=generator)[:n_pos]]
    neg = neg[torch.randperm(len(neg), generator=generator)[:n_neg]]
    return torch.cat([pos, neg])


def detection_losses(model: VGDetector, images: list[np.ndarray], targets: list[DetectionTarget],
                     rpn_batch: int = 256, roi_batch: int = 128, seed: int = 0) -> dict[str, torch.Tensor]:
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
            logits[picked], labels[picked].float())
        pos = picked[labels[picked] == 1]
        target_deltas = encode(anchors[pos], gt[match[pos]])
        losses["rpn_loc"] = losses["rpn_loc"] + F.smooth_l1_loss(deltas[pos], target_deltas, beta=0.0, reduction="sum") / max(1, len(picked))

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
            losses["box"] = losses["box"] + F.smooth_l1_loss(box_deltas, wanted, beta=0.0, reduction="sum") / len(picked)
            if predictor.has_attributes:
                attr_logits = predictor.attribute_logits(feats[fg], labels[fg])
                losses["attr"] = losses["attr"] + F.cross_entropy(attr_logits, gt_attr[match[picked][fg]])
    n = max(1, len(images))
    return {k: v / n for k, v in losses.items()}
