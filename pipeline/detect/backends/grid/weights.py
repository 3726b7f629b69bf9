"""grid-feats-vqa's published checkpoints into `GridBackbone`, strictly.

The files (``X-152.pth``, ``X-101.pth``, ``R-50.pth``, ``X-152pp.pth``) are detectron2 training
checkpoints of the whole attribute Faster R-CNN: a torch file holding ``{"model": state dict}``
(beside it, depending on the file, the optimizer, scheduler and iteration). Grid extraction runs
the backbone alone, so every ``backbone.*`` tensor must fill our model exactly (names and
shapes), and the detection heads' tensors (``proposal_generator.*``, ``roi_heads.*``) are
counted in the report as unused; anything else is refused, listing the keys. A detectron2
pickle (``.pkl``, numpy arrays under ``"model"``) reads the same way.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.detect.backends.base import LoadReport
from pipeline.detect.backends.grid.config import WEIGHT_SOURCES, GridConfig
from pipeline.detect.backends.grid.model import GridBackbone
from pipeline.detect.checkpoints import read_family
from pipeline.detect.strict import strict_state
from pipeline.io import sha256_file

HEAD_PREFIXES = ("proposal_generator.", "roi_heads.")


def load_grid(path: Path, cfg: GridConfig) -> tuple[GridBackbone, LoadReport]:
    path = Path(path)
    kind, tensors = read_family(path, "grid", WEIGHT_SOURCES)
    unused = sorted(k for k in tensors if k.startswith(HEAD_PREFIXES))
    backbone = {k: v for k, v in tensors.items() if not k.startswith(HEAD_PREFIXES)}
    model = GridBackbone(cfg)
    report = LoadReport(
        str(path), f"detectron2-{kind}", sha256_file(path), len(tensors), unused=unused, attributes=False
    )
    state = strict_state(path, backbone, model.state_dict(), cfg.name, report)
    model.load_state_dict(state, strict=True)
    return model, report


def published_state(model: GridBackbone) -> dict[str, torch.Tensor]:
    """`model`'s tensors under the names a grid-feats-vqa checkpoint holds them (float32, CPU)."""
    return {name: value.detach().cpu().float().clone() for name, value in model.state_dict().items()}
