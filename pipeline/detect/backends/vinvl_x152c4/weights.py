"""VinVL's published checkpoint (``vinvl_vg_x152c4.pth``) into `AttrRCNN`, strictly.

The released file is maskrcnn-benchmark's: a flat state dict (a ``{"model": ...}`` wrapper is
read too) whose every key carries DataParallel's ``module.`` prefix, with maskrcnn-benchmark's
module names, which `canonical_name` maps onto ours:

    backbone.body.stem.conv1 / .bn1                 -> backbone.stem.conv1 / .conv1.norm
    backbone.body.layerK.I.convJ / .bnJ             -> backbone.res{K+1}.I.convJ / .convJ.norm
    ....downsample.0 / .downsample.1                -> ....shortcut / .shortcut.norm
    rpn.head.{conv,cls_logits,bbox_pred}            -> rpn.{conv,cls_logits,bbox_pred}
    rpn.anchor_generator.cell_anchors.0             -> rpn.cell_anchors (the anchors the model uses)
    roi_heads.box.feature_extractor.head.layer4.I   -> roi_heads.res5.I
    roi_heads.box.predictor.{cls_score,bbox_pred}   -> roi_heads.box_predictor.*
    attribute.predictor.{cls_embedding,fc_attr,attr_score} -> attribute.*

``attribute.feature_extractor.*`` is the box head's feature extractor again (the reference
shares one module under two names): each such tensor must equal its twin, and is then counted
in the report's `dropped`. Every other key must fill our model exactly (names and shapes), as
`pipeline.detect.strict` accounts for them; the reference's own loader skips what does not fit.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from pipeline.detect.backends.base import LoadReport
from pipeline.detect.backends.vinvl_x152c4.config import WEIGHT_SOURCES, VinvlConfig
from pipeline.detect.backends.vinvl_x152c4.model import AttrRCNN
from pipeline.detect.checkpoints import read_family
from pipeline.detect.strict import strict_state
from pipeline.errors import ConfigError
from pipeline.io import sha256_file

SHARED = ("attribute.feature_extractor.", "roi_heads.box.feature_extractor.")  # one module, two names
_RULES = [
    (re.compile(r"^backbone\.body\.stem\.bn1\."), "backbone.stem.conv1.norm."),
    (re.compile(r"^backbone\.body\.stem\."), "backbone.stem."),
    (re.compile(r"^backbone\.body\.layer(\d)\."), lambda m: f"backbone.res{int(m.group(1)) + 1}."),
    (re.compile(r"^roi_heads\.box\.feature_extractor\.head\.layer4\."), "roi_heads.res5."),
    (re.compile(r"^roi_heads\.box\.predictor\."), "roi_heads.box_predictor."),
    (re.compile(r"^rpn\.head\."), "rpn."),
    (re.compile(r"^rpn\.anchor_generator\.cell_anchors\.0$"), "rpn.cell_anchors"),
    (re.compile(r"^attribute\.predictor\."), "attribute."),
    (re.compile(r"\.bn(\d)\."), lambda m: f".conv{m.group(1)}.norm."),
    (re.compile(r"\.downsample\.0\."), ".shortcut."),
    (re.compile(r"\.downsample\.1\."), ".shortcut.norm."),
]


def canonical_name(key: str) -> str:
    """Our module name of a maskrcnn-benchmark key (``module.`` stripped)."""
    key = key[len("module.") :] if key.startswith("module.") else key
    for pattern, repl in _RULES:
        key = pattern.sub(repl, key)
    return key


def load_vinvl(path: Path, cfg: VinvlConfig) -> tuple[AttrRCNN, LoadReport]:
    path = Path(path)
    kind, raw = read_family(path, "vinvl-x152c4", WEIGHT_SOURCES)
    plain = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in raw.items()}
    report = LoadReport(
        str(path), f"maskrcnn-benchmark-{kind}", sha256_file(path), len(raw), attributes=cfg.num_attributes > 0
    )
    tensors = {}
    for key, value in plain.items():
        if key.startswith(SHARED[0]):
            twin = SHARED[1] + key[len(SHARED[0]) :]
            if twin not in plain or plain[twin].shape != value.shape or not torch.equal(plain[twin], value):
                raise ConfigError(f"{path}: {key} differs from {twin}; the reference shares one module under both")
            report.dropped.append(key)
            continue
        tensors[canonical_name(key)] = value
    model = AttrRCNN(cfg)
    model.load_state_dict(strict_state(path, tensors, model.state_dict(), cfg.name, report), strict=True)
    return model, report


def published_state(model: AttrRCNN) -> dict[str, torch.Tensor]:
    """`model`'s tensors as the released file holds them: maskrcnn-benchmark names with the
    ``module.`` prefix, the shared feature extractor under both names (float32, CPU)."""
    reverse = {canonical_name(k): k for k in _published_names(model.cfg)}
    state = {}
    for name, value in model.state_dict().items():
        theirs = reverse[name]
        state["module." + theirs] = value.detach().cpu().float().clone()
        if theirs.startswith(SHARED[1]):
            state["module." + SHARED[0] + theirs[len(SHARED[1]) :]] = state["module." + theirs]
    return state


def _published_names(cfg: VinvlConfig) -> list[str]:
    """Every maskrcnn-benchmark key of `cfg`'s model (the shared extractor once)."""
    names = ["rpn.anchor_generator.cell_anchors.0"]
    names += [f"rpn.head.{m}.{p}" for m in ("conv", "cls_logits", "bbox_pred") for p in ("weight", "bias")]
    names += [f"roi_heads.box.predictor.{m}.{p}" for m in ("cls_score", "bbox_pred") for p in ("weight", "bias")]
    if cfg.num_attributes:
        names += ["attribute.predictor.cls_embedding.weight"]
        names += [f"attribute.predictor.{m}.{p}" for m in ("fc_attr", "attr_score") for p in ("weight", "bias")]
    bn = ("weight", "bias", "running_mean", "running_var")
    names += ["backbone.body.stem.conv1.weight"] + [f"backbone.body.stem.bn1.{p}" for p in bn]
    stages = [(f"backbone.body.layer{k + 1}", cfg.blocks[k]) for k in range(3)]
    stages.append(("roi_heads.box.feature_extractor.head.layer4", cfg.blocks[3]))
    for prefix, count in stages:
        for i in range(count):
            block = f"{prefix}.{i}"
            if i == 0:
                names += [f"{block}.downsample.0.weight"] + [f"{block}.downsample.1.{p}" for p in bn]
            for j in (1, 2, 3):
                names += [f"{block}.conv{j}.weight"] + [f"{block}.bn{j}.{p}" for p in bn]
    return names
