"""Random detector weights written in the published layouts, from the published key
names and shapes (detectron2 module names; background and "no attribute" rows last)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from pipeline.detect.backends.butd_c4.config import DetectorConfig


def published_shapes(cfg: DetectorConfig, attributes: bool = True) -> dict[str, tuple]:
    shapes: dict[str, tuple] = {}

    def conv(prefix: str, cout: int, cin: int, k: int) -> None:
        shapes[f"{prefix}.weight"] = (cout, cin, k, k)
        for buf in ("weight", "bias", "running_mean", "running_var"):
            shapes[f"{prefix}.norm.{buf}"] = (cout,)

    conv("backbone.stem.conv1", cfg.stem_channels, 3, 7)
    cin, width, cout = cfg.stem_channels, cfg.bottleneck_channels, cfg.res2_out_channels
    for stage, count in zip(("backbone.res2", "backbone.res3", "backbone.res4", "roi_heads.res5"), cfg.blocks):
        for i in range(count):
            block_in = cin if i == 0 else cout
            if i == 0:
                conv(f"{stage}.{i}.shortcut", cout, cin, 1)
            conv(f"{stage}.{i}.conv1", width, block_in, 1)
            conv(f"{stage}.{i}.conv2", width, width, 3)
            conv(f"{stage}.{i}.conv3", cout, width, 1)
        cin, width, cout = cout, width * 2, cout * 2
    c4, c5, anchors = (
        cfg.res2_out_channels * 4,
        cfg.res2_out_channels * 8,
        len(cfg.anchor_sizes) * len(cfg.anchor_ratios),
    )
    shapes.update(
        {
            "proposal_generator.rpn_head.conv.weight": (cfg.rpn_channels, c4, 3, 3),
            "proposal_generator.rpn_head.conv.bias": (cfg.rpn_channels,),
            "proposal_generator.rpn_head.objectness_logits.weight": (anchors, cfg.rpn_channels, 1, 1),
            "proposal_generator.rpn_head.objectness_logits.bias": (anchors,),
            "proposal_generator.rpn_head.anchor_deltas.weight": (anchors * 4, cfg.rpn_channels, 1, 1),
            "proposal_generator.rpn_head.anchor_deltas.bias": (anchors * 4,),
            "roi_heads.box_predictor.cls_score.weight": (cfg.num_classes + 1, c5),
            "roi_heads.box_predictor.cls_score.bias": (cfg.num_classes + 1,),
            "roi_heads.box_predictor.bbox_pred.weight": (cfg.num_classes * 4, c5),
            "roi_heads.box_predictor.bbox_pred.bias": (cfg.num_classes * 4,),
        }
    )
    if attributes:
        shapes.update(
            {
                "roi_heads.box_predictor.cls_embedding.weight": (cfg.num_classes + 1, cfg.attribute_embed),
                "roi_heads.box_predictor.fc_attr.weight": (cfg.attribute_hidden, c5 + cfg.attribute_embed),
                "roi_heads.box_predictor.fc_attr.bias": (cfg.attribute_hidden,),
                "roi_heads.box_predictor.attr_score.weight": (cfg.num_attributes + 1, cfg.attribute_hidden),
                "roi_heads.box_predictor.attr_score.bias": (cfg.num_attributes + 1,),
            }
        )
    return shapes


def random_weights(cfg: DetectorConfig, seed: int = 0, attributes: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in published_shapes(cfg, attributes).items():
        if name.endswith("norm.running_var"):
            value = 1 + rng.random(shape)
        elif name.endswith("norm.weight"):
            value = 0.3 + 0.2 * rng.random(shape)
        elif name.endswith(("norm.bias", "norm.running_mean")):
            value = 0.05 * rng.standard_normal(shape)
        else:
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        out[name] = value.astype(np.float32)
    out["backbone.stem.conv1.weight"] /= 64  # raw pixel inputs
    return out


def write_d2_pickle(path: Path, weights: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        pickle.dump({"model": weights, "__author__": "Caffe"}, f, protocol=2)


def write_hf_bin(path: Path, weights: dict[str, np.ndarray], cfg: DetectorConfig) -> None:
    """HF port's state dict: BatchNorm2d counters and the anchor buffer included."""
    from pipeline.detect.boxes import cell_anchors

    state = {k: torch.from_numpy(v.copy()) for k, v in weights.items()}
    for key in list(state):
        if key.endswith(".norm.running_var"):
            state[key.replace("running_var", "num_batches_tracked")] = torch.tensor(0)
    state["proposal_generator.anchor_generator.cell_anchors.0"] = cell_anchors(cfg.anchor_sizes, cfg.anchor_ratios)
    torch.save(state, path)


def two_box_scene(rng: np.random.Generator, attributes_per_box: int | None = None):
    """A 160x200 image with a red (class 1) and a blue (class 2) rectangle and its
    `DetectionTarget`: one attribute per box (its colour, 1-D), or `attributes_per_box`
    of them ((2, K): colour, a size-like 3 + class, and 6)."""
    from pipeline.detect.backends.butd_c4.training import DetectionTarget

    img = np.full((160, 200, 3), 235, np.uint8)
    boxes, classes, attrs = [], [], []
    for cls, color in ((1, (220, 30, 30)), (2, (30, 30, 220))):
        x1, y1 = rng.integers(0, 110), rng.integers(0, 80)
        w, h = rng.integers(40, 80), rng.integers(40, 70)
        img[y1 : y1 + h, x1 : x1 + w] = color
        boxes.append([x1, y1, x1 + w, y1 + h])
        classes.append(cls)
        attrs.append(cls if attributes_per_box is None else [cls, 3 + cls, 6][:attributes_per_box])
    attributes = np.array(attrs) if attributes_per_box is None else np.array(attrs).reshape(2, attributes_per_box)
    return img, DetectionTarget(np.array(boxes, np.float32), np.array(classes), attributes)
