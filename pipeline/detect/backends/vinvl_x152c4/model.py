"""VinVL's AttrRCNN (ResNeXt C4 Faster R-CNN with an attribute head) on torch + torchvision, under
our module names (`weights.py` maps the published maskrcnn-benchmark names onto them):

    backbone.stem / res2 .. res4            ResNeXt, frozen BN without epsilon (maskrcnn-benchmark's),
                                            the stride in the grouped 3x3, max-pool k3 s2 pad 1
    rpn.{conv, cls_logits, bbox_pred}       one 3x3 conv + ReLU, objectness and deltas per anchor;
    rpn.cell_anchors                        the checkpoint's anchor buffer (Detectron's legacy anchors)
    roi_heads.res5                          the box head: res5 at stride 2 on 14 x 14 ROIAlign maps
    roi_heads.box_predictor.{cls_score, bbox_pred}
                                            classes with the background at 0; class-specific deltas
                                            (background's included, as the checkpoint holds them)
    attribute.{cls_embedding, fc_attr, attr_score}
                                            [feature, embedding(label)] -> fc_attr -> ReLU -> attr_score

Inference lives in `extractor.py` and `postprocess.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.detect.backends.vinvl_x152c4.config import VinvlConfig
from pipeline.detect.boxes import legacy_anchors
from pipeline.detect.resnet import ResNet, init_random, make_stage


class RPN(nn.Module):
    def __init__(self, cfg: VinvlConfig):
        super().__init__()
        channels, anchors = cfg.res4_channels, len(cfg.anchor_sizes) * len(cfg.anchor_ratios)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.cls_logits = nn.Conv2d(channels, anchors, 1)
        self.bbox_pred = nn.Conv2d(channels, anchors * 4, 1)
        self.register_buffer("cell_anchors", legacy_anchors(cfg.feature_stride, cfg.anchor_sizes, cfg.anchor_ratios))

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = F.relu(self.conv(features))
        return self.cls_logits(t), self.bbox_pred(t)


class BoxPredictor(nn.Module):
    def __init__(self, cfg: VinvlConfig):
        super().__init__()
        self.cls_score = nn.Linear(cfg.feature_dim, cfg.num_classes)
        self.bbox_pred = nn.Linear(cfg.feature_dim, cfg.num_classes * 4)


class RoIHeads(nn.Module):
    def __init__(self, cfg: VinvlConfig):
        super().__init__()
        self.res5 = make_stage(
            cfg.blocks[3],
            cfg.res4_channels,
            cfg.bottleneck_channels * 8,
            cfg.feature_dim,
            2,
            1,
            cfg.stride_in_1x1,
            cfg.groups,
            cfg.norm_eps,
        )
        self.box_predictor = BoxPredictor(cfg)


class AttributePredictor(nn.Module):
    def __init__(self, cfg: VinvlConfig):
        super().__init__()
        self.cls_embedding = nn.Embedding(cfg.num_classes, cfg.attribute_embed)
        self.fc_attr = nn.Linear(cfg.feature_dim + cfg.attribute_embed, cfg.attribute_hidden)
        self.attr_score = nn.Linear(cfg.attribute_hidden, cfg.num_attributes)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Attribute logits of (R, D) pooled features and their (R,) class labels (background 0)."""
        x = torch.cat([features, self.cls_embedding(labels)], dim=1)
        return self.attr_score(F.relu(self.fc_attr(x)))


class AttrRCNN(nn.Module):
    def __init__(self, cfg: VinvlConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNet(
            cfg.blocks[:3],
            cfg.stem_channels,
            cfg.res2_out_channels,
            cfg.bottleneck_channels,
            cfg.stride_in_1x1,
            caffe_maxpool=False,
            groups=cfg.groups,
            eps=cfg.norm_eps,
        )
        self.rpn = RPN(cfg)
        self.roi_heads = RoIHeads(cfg)
        self.attribute = AttributePredictor(cfg) if cfg.num_attributes else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Random initialization (--random-weights)."""
        init_random(self, self.backbone.stem)

    def pooled_maps(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """(R, C, 14, 14) maps of `boxes` (resized-image pixels): ROIAlign 14 x 14 at 1/16 (sampling
        ratio 0, not aligned: maskrcnn-benchmark's)."""
        from torchvision.ops import roi_align

        cfg = self.cfg
        return roi_align(
            features,
            [boxes.to(features.dtype)],
            cfg.pooler_resolution,
            1.0 / cfg.feature_stride,
            cfg.pooler_sampling_ratio,
            aligned=False,
        )

    def box_features(self, features: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        """(R, D) features of `boxes` (resized-image pixels): `pooled_maps`, res5, average pool."""
        return F.adaptive_avg_pool2d(self.roi_heads.res5(self.pooled_maps(features, boxes)), 1).flatten(1)
