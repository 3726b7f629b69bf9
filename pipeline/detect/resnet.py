"""ResNet / ResNeXt building blocks shared by the detector backends (detectron2's module names).

    stem.conv1 (+ .norm)            7x7/2 conv, frozen BN, ReLU, then a k3 s2 max-pool: pad 0 with
                                    ceil (the Caffe pooling of bottom-up attention) or pad 1
    res2 .. res5 .<i>.{shortcut, conv1, conv2, conv3}
                                    bottlenecks: 1x1 -> 3x3 (grouped for ResNeXt, dilated where
                                    asked) -> 1x1, the stride in the first 1x1 (MSRA weights) or in
                                    the 3x3 (``stride_in_1x1`` False: Caffe2 / ResNeXt weights)

Every convolution is bias-free and followed by a frozen batch norm (`Conv2dBN`), whose epsilon is
the weights' convention: detectron2's and torchvision's 1e-5, maskrcnn-benchmark's 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d


class Conv2dBN(nn.Conv2d):
    """A bias-free convolution followed by a frozen batch norm kept as `.norm` (detectron2's
    layout). In eval mode the norm is folded into the convolution (weight times the norm's
    scale, its shift as the bias): one pass over the output instead of three, the same
    function up to float rounding (~1e-6 relative)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        eps: float = 1e-5,
    ):
        super().__init__(
            cin, cout, kernel, stride=stride, padding=padding, dilation=dilation, groups=groups, bias=False
        )
        self.norm = FrozenBatchNorm2d(cout, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            return self.norm(super().forward(x))
        norm = self.norm
        scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
        return self._conv_forward(x, self.weight * scale.view(-1, 1, 1, 1), norm.bias - norm.running_mean * scale)


class BasicStem(nn.Module):
    def __init__(self, channels: int, caffe_maxpool: bool, eps: float = 1e-5):
        super().__init__()
        self.conv1 = Conv2dBN(3, channels, 7, stride=2, padding=3, eps=eps)
        self.caffe_maxpool = caffe_maxpool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu_(self.conv1(x))
        if self.caffe_maxpool:
            return F.max_pool2d(x, kernel_size=3, stride=2, padding=0, ceil_mode=True)
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)

    def output_side(self, n: int) -> int:
        """A side of the stem's output for an input side of `n`: the conv halves it rounding
        up; the max-pool (k3 s2) gives ``ceil((n - 3) / 2) + 1`` Caffe-style (pad 0, ceil),
        ``ceil(n / 2)`` otherwise (pad 1)."""
        n = -(-n // 2)
        return -(-(n - 3) // 2) + 1 if self.caffe_maxpool else -(-n // 2)


class Bottleneck(nn.Module):
    def __init__(
        self,
        cin: int,
        bottleneck: int,
        cout: int,
        stride: int,
        dilation: int,
        stride_in_1x1: bool,
        groups: int = 1,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.shortcut = Conv2dBN(cin, cout, 1, stride=stride, eps=eps) if cin != cout else None
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = Conv2dBN(cin, bottleneck, 1, stride=s1, eps=eps)
        self.conv2 = Conv2dBN(
            bottleneck, bottleneck, 3, stride=s3, padding=dilation, dilation=dilation, groups=groups, eps=eps
        )
        self.conv3 = Conv2dBN(bottleneck, cout, 1, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu_(self.conv1(x))
        out = F.relu_(self.conv2(out))
        out = self.conv3(out)
        return F.relu_(out + (self.shortcut(x) if self.shortcut is not None else x))


def make_stage(
    count: int,
    cin: int,
    bottleneck: int,
    cout: int,
    first_stride: int,
    dilation: int,
    stride_in_1x1: bool,
    groups: int = 1,
    eps: float = 1e-5,
) -> nn.Sequential:
    blocks = [Bottleneck(cin, bottleneck, cout, first_stride, dilation, stride_in_1x1, groups, eps)]
    blocks += [Bottleneck(cout, bottleneck, cout, 1, dilation, stride_in_1x1, groups, eps) for _ in range(count - 1)]
    return nn.Sequential(*blocks)


class ResNet(nn.Module):
    """stem + res2 .. res4 (stride 16, ``res2_out_channels * 4`` channels), and with `res5` the
    fourth stage too (stride 32 at dilation 1; stride 16 with dilated 3x3 convs at dilation 2).
    `bottleneck_channels` is res2's (``groups * width_per_group`` for ResNeXt); both bottleneck
    and output widths double per stage."""

    def __init__(
        self,
        blocks: tuple[int, ...],
        stem_channels: int,
        res2_out_channels: int,
        bottleneck_channels: int,
        stride_in_1x1: bool,
        caffe_maxpool: bool,
        groups: int = 1,
        res5: bool = False,
        res5_dilation: int = 1,
        eps: float = 1e-5,
    ):
        super().__init__()
        self.stem = BasicStem(stem_channels, caffe_maxpool, eps)
        cin, b, cout = stem_channels, bottleneck_channels, res2_out_channels
        self.stages = ("res2", "res3", "res4", "res5") if res5 else ("res2", "res3", "res4")
        for i, name in enumerate(self.stages):
            dilation = res5_dilation if name == "res5" else 1
            stride = 1 if i == 0 or dilation > 1 else 2
            setattr(self, name, make_stage(blocks[i], cin, b, cout, stride, dilation, stride_in_1x1, groups, eps))
            cin, b, cout = cout, b * 2, cout * 2
        self.out_channels = cin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for name in self.stages:
            x = getattr(self, name)(x)
        return x

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """(h, w) of the output for a `height` x `width` input: after the stem, each stage of
        stride 2 halves a side rounding up."""
        halvings = len(self.stages) - 1 - int(self.stages[-1] == "res5" and self.res5[0].conv2.dilation[0] > 1)

        def side(n: int) -> int:
            n = self.stem.output_side(n)
            for _ in range(halvings):
                n = -(-n // 2)
            return n

        return side(height), side(width)


def init_random(model: nn.Module, stem: BasicStem) -> None:
    """Random initialization of a detector around a ResNet (--random-weights smoke runs, training
    from scratch): He-normal convolutions, small heads. A deep random tower is kept tame: inputs
    are raw BGR values (about +-128) and each residual branch starts small, so activations stay
    O(1) through all blocks."""
    for m in model.modules():
        if isinstance(m, Conv2dBN):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.01)
            nn.init.zeros_(m.bias)
    stem.conv1.norm.weight.fill_(1.0 / 64)
    for m in model.modules():
        if isinstance(m, Bottleneck):
            m.conv3.norm.weight.fill_(0.1)
            if m.shortcut is not None:
                m.shortcut.norm.weight.fill_(1.0 / math.sqrt(m.shortcut.weight.shape[1]))
