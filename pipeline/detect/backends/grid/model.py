"""The grid extractor's network: a detectron2 ResNet / ResNeXt through res5 (module names
``backbone.stem``, ``backbone.res2`` .. ``backbone.res5``, as grid-feats-vqa's checkpoints hold
them). Its output is the C5 map that grid-feats-vqa's `get_conv5_features` returns."""

from __future__ import annotations

import torch
from torch import nn

from pipeline.detect.backends.grid.config import GridConfig
from pipeline.detect.resnet import ResNet, init_random


class GridBackbone(nn.Module):
    def __init__(self, cfg: GridConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = ResNet(
            cfg.blocks,
            cfg.stem_channels,
            cfg.res2_out_channels,
            cfg.bottleneck_channels,
            cfg.stride_in_1x1,
            caffe_maxpool=False,
            groups=cfg.groups,
            res5=True,
            res5_dilation=cfg.res5_dilation,
            eps=cfg.norm_eps,
        )
        self.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backbone(x)

    def reset_parameters(self) -> None:
        """Random initialization (--random-weights)."""
        init_random(self, self.backbone.stem)
