"""The bottom-up-attention Faster R-CNN (ResNet C4, Visual Genome heads) on torch + torchvision.

Module names follow detectron2's so its checkpoints map key for key (see weights.py):

    backbone.stem.conv1 (+ .norm)                   7x7/2 conv, FrozenBN, ReLU, max-pool k3 s2
                                                    (pad 0, ceil: the Caffe pooling)
    backbone.res2 / res3 / res4.<i>.{conv1,conv2,conv3,shortcut}   bottlenecks, stride in the 1x1
    proposal_generator.rpn_head.{conv, objectness_logits, anchor_deltas}
    roi_heads.res5.<i>...                           res5 at stride 1, 3x3 convs dilated by 2
    roi_heads.box_predictor.{cls_score, bbox_pred, cls_embedding, fc_attr, attr_score}
                                                    attributes: [feature, embedding(argmax class)]
                                                    -> fc_attr -> ReLU -> attr_score

Conventions inside this model (converted on load): class tables have the background at
index 0 (`cls_score` row 0, `cls_embedding` row 0), `bbox_pred` is class-specific over the
foreground classes (row block k for class k+1), and `attr_score` has "no attribute" at 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.resnet import ResNet, init_random, make_stage


class ResNetC4(ResNet):
    """stem + res2..res4: features at stride 16 with `res4_channels` channels."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__(
            cfg.blocks,
            cfg.stem_channels,
            cfg.res2_out_channels,
            cfg.bottleneck_channels,
            cfg.stride_in_1x1,
            cfg.caffe_maxpool,
        )


class RPNHead(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.conv = nn.Conv2d(cfg.res4_channels, cfg.rpn_channels, 3, padding=1)
        self.objectness_logits = nn.Conv2d(cfg.rpn_channels, cfg.num_anchors, 1)
        self.anchor_deltas = nn.Conv2d(cfg.rpn_channels, cfg.num_anchors * 4, 1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = F.relu(self.conv(features))
        return self.objectness_logits(t), self.anchor_deltas(t)


class RPN(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.rpn_head = RPNHead(cfg)


class BoxPredictor(nn.Module):
    """Class scores (background first), class-specific box deltas, attribute head."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        dim = cfg.res5_channels
        self.cls_score = nn.Linear(dim, cfg.num_classes + 1)
        self.bbox_pred = nn.Linear(dim, cfg.num_classes * 4)
        self.has_attributes = cfg.num_attributes > 0
        if self.has_attributes:
            self.cls_embedding = nn.Embedding(cfg.num_classes + 1, cfg.attribute_embed)
            self.fc_attr = nn.Linear(dim + cfg.attribute_embed, cfg.attribute_hidden)
            self.attr_score = nn.Linear(cfg.attribute_hidden, cfg.num_attributes + 1)

    def attribute_logits(self, features: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
        """Attribute logits given region features and (background-first) class indices."""
        x = torch.cat([features, self.cls_embedding(classes)], dim=1)
        return self.attr_score(F.relu(self.fc_attr(x)))


class Res5ROIHeads(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        c4, b = cfg.res4_channels, cfg.bottleneck_channels * 8
        self.res5 = make_stage(cfg.blocks[3], c4, b, cfg.res5_channels, 1, cfg.res5_dilation, cfg.stride_in_1x1)
        self.box_predictor = BoxPredictor(cfg)


class VGDetector(nn.Module):
    """Backbone, RPN and ROI heads; inference lives in `extractor.py`, losses in `training.py`."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNetC4(cfg)
        self.proposal_generator = RPN(cfg)
        self.roi_heads = Res5ROIHeads(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Random initialization (for --random-weights smoke runs and training from scratch)."""
        init_random(self, self.backbone.stem)
