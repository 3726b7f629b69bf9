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

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

from pipeline.detect.config import DetectorConfig


class Conv2dBN(nn.Conv2d):
    """A bias-free convolution followed by a frozen batch norm kept as `.norm` (detectron2's
    layout). In eval mode the norm is folded into the convolution (weight times the norm's
    scale, its shift as the bias): one pass over the output instead of three, the same
    function up to float rounding (~1e-6 relative)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1):
        super().__init__(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation, bias=False)
        self.norm = FrozenBatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.norm(super().forward(x))
        norm = self.norm
        scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
        return self._conv_forward(x, self.weight * scale.view(-1, 1, 1, 1), norm.bias - norm.running_mean * scale)


class BasicStem(nn.Module):
    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.conv1 = Conv2dBN(3, cfg.stem_channels, 7, stride=2, padding=3)
        self.caffe_maxpool = cfg.caffe_maxpool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.conv1(x))
        if self.caffe_maxpool:
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, bottleneck: int, cout: int, stride: int, dilation: int, stride_in_1x1: bool):
        super().__init__()
        self.shortcut = Conv2dBN(cin, cout, 1, stride=stride) if cin != cout else None
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = Conv2dBN(cin, bottleneck, 1, stride=s1)
        self.conv2 = Conv2dBN(bottleneck, bottleneck, 3, stride=s3, padding=dilation, dilation=dilation)
        self.conv3 = Conv2dBN(bottleneck, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu_(self.conv1(x))
        out = F.relu_(self.conv2(out))
        out = self.conv3(out)
        return F.relu_(out + (self.shortcut(x) if self.shortcut is not None else x))


def make_stage(count: int, cin: int, bottleneck: int, cout: int, first_stride: int, dilation: int, stride_in_1x1: bool):
    blocks = [Bottleneck(cin, bottleneck, cout, first_stride, dilation, stride_in_1x1)]
    blocks += [Bottleneck(cout, bottleneck, cout, 1, dilation, stride_in_1x1) for _ in range(count - 1)]
    return nn.Sequential(*blocks)


class ResNetC4(nn.Module):
    """stem + res2..res4: features at stride 16 with `res4_channels` channels."""

    def __init__(self, cfg: DetectorConfig):
        super().__init__()
        self.stem = BasicStem(cfg)
        cin, b, cout = cfg.stem_channels, cfg.bottleneck_channels, cfg.res2_out_channels
        for i, name in enumerate(("res2", "res3", "res4")):
            setattr(self, name, make_stage(cfg.blocks[i], cin, b, cout, 1 if i == 0 else 2, 1, cfg.stride_in_1x1))
            cin, b, cout = cout, b * 2, cout * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.res4(self.res3(self.res2(self.stem(x))))

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) of the features of a `height` x `width` input: the stem's conv and the
        first blocks of res3 and res4 halve a side rounding up; the stem's max-pool
        (k3 s2) gives ``ceil((n - 3) / 2) + 1`` Caffe-style (pad 0, ceil), ``ceil(n / 2)``
        otherwise (pad 1)."""

        def side(n: int) -> int:
            n = -(-n // 2)
            n = -(-(n - 3) // 2) + 1 if self.stem.caffe_maxpool else -(-n // 2)
            return -(-(-(-n // 2)) // 2)

        return side(height), side(width)


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
        for m in self.modules():
            if isinstance(m, Conv2dBN):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Conv2d):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)
        # Keep a deep random tower tame: inputs are raw BGR values (about +-128), and each
        # residual branch starts small, so activations stay O(1) through all blocks.
        self.backbone.stem.conv1.norm.weight.fill_(1.0 / 64)
        for m in self.modules():
            if isinstance(m, Bottleneck):
                m.conv3.norm.weight.fill_(0.1)
                if m.shortcut is not None:
                    m.shortcut.norm.weight.fill_(1.0 / math.sqrt(m.shortcut.weight.shape[1]))
