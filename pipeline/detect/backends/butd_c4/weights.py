"""Loading the public bottom-up-attention weights into `VGDetector`, strictly.

Two layouts, both with detectron2 module names (see model.py):

* ``d2-pickle``: airsplay/py-bottom-up-attention's ``faster_rcnn_from_caffe.pkl``,
  ``faster_rcnn_from_caffe_attr.pkl``, ``faster_rcnn_from_caffe_attr_original.pkl`` — a
  pickle of ``{"model": {name: numpy array}, "__author__": ...}``, opened with the
  restricted unpickler (numpy arrays and plain values only);
* ``hf-bin``: the HF research port's ``pytorch_model.bin`` (``unc-nlp/frcnn-vg-finetuned``)
  — a torch state dict, loaded with ``weights_only=True``; its ``gamma``/``beta`` names
  are read as ``weight``/``bias`` as the port does.

Strict accounting: every tensor of the file is used and every parameter of the model is
filled with the right shape, or the load fails listing the keys. The only tolerated
differences are named: BatchNorm ``num_batches_tracked`` counters (meaningless for frozen
norms), the anchor buffer ``proposal_generator.anchor_generator.cell_anchors.0`` (checked
against our anchors, then dropped), and FrozenBN running statistics absent from a file
(identity statistics, detectron2's rule for its old checkpoints; counted in the report).
A file without the attribute head loads into a model built without one.

The detectron2 convention puts the background class last (``cls_score`` row 1600,
``cls_embedding`` row 1600) and "no attribute" last (``attr_score`` row 400); both are moved
to index 0 here, our canonical convention. `save_detector` (``d2-pickle``) and
`save_detector_hf` (``hf-bin``) write a model back in the published layouts.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from pipeline.detect.backends.base import LoadReport
from pipeline.detect.backends.butd_c4.config import WEIGHT_SOURCES, DetectorConfig
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.boxes import cell_anchors
from pipeline.detect.checkpoints import file_kind, refuse_other_family
from pipeline.detect.strict import strict_state
from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.io import sha256_file
from pipeline.safe_pickle import safe_loads

log = logging.getLogger(__name__)

ANCHOR_KEY = "proposal_generator.anchor_generator.cell_anchors.0"
ATTRIBUTE_PREFIXES = (
    "roi_heads.box_predictor.cls_embedding.",
    "roi_heads.box_predictor.fc_attr.",
    "roi_heads.box_predictor.attr_score.",
)
BACKGROUND_LAST = (
    "roi_heads.box_predictor.cls_score.weight",
    "roi_heads.box_predictor.cls_score.bias",
    "roi_heads.box_predictor.cls_embedding.weight",
    "roi_heads.box_predictor.attr_score.weight",
    "roi_heads.box_predictor.attr_score.bias",
)


def detect_layout(path: Path) -> str:
    return {"torch": "hf-bin", "pickle": "d2-pickle"}[file_kind(path)]


def read_checkpoint(path: Path, layout: Optional[str] = None) -> tuple[str, dict[str, torch.Tensor]]:
    """(layout, name -> tensor) as stored in the file, names normalized to our modules'."""
    layout = layout or detect_layout(path)
    if layout == "d2-pickle":
        try:
            obj = safe_loads(path.read_bytes(), encoding="latin1")
        except UnsafePickleError as err:
            raise ConfigError(f"{path}: {err}") from err
        if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
            raise ConfigError(f"{path}: a detectron2 pickle holds {{'model': {{name: array}}, '__author__': ...}}")
        tensors = {k: torch.as_tensor(np.asarray(v)) for k, v in obj["model"].items()}
    elif layout == "hf-bin":
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ConfigError(f"{path}: cannot read as a torch checkpoint: {err}") from err
        if not isinstance(state, dict):
            raise ConfigError(f"{path}: expected a state dict")
        state = state.get("model", state) if isinstance(state.get("model"), dict) else state
        tensors = {_hf_name(k): v for k, v in state.items()}
    else:
        raise ConfigError(f"unknown weights layout {layout!r}: d2-pickle or hf-bin")
    return layout, tensors


def _hf_name(key: str) -> str:
    return key.replace(".gamma", ".weight").replace(".beta", ".bias")


def _to_canonical(name: str, value: torch.Tensor) -> torch.Tensor:
    """Move the last row (background / no-attribute) of class tables to row 0."""
    if name in BACKGROUND_LAST:
        return torch.cat([value[-1:], value[:-1]], dim=0)
    return value


def load_detector(path: Path, cfg: DetectorConfig, layout: Optional[str] = None) -> tuple[VGDetector, LoadReport]:
    """Build a detector for `cfg` and fill it from `path`; raise ConfigError listing every
    missing, unexpected or misshaped key."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"weights not found: {path}; {WEIGHT_SOURCES}")
    layout, tensors = read_checkpoint(path, layout)
    refuse_other_family(path, tensors, "butd-c4")
    has_attr = any(k.startswith(ATTRIBUTE_PREFIXES) for k in tensors)
    if not has_attr and cfg.num_attributes:
        cfg = replace(cfg, num_attributes=0)
    model = VGDetector(cfg)
    report = LoadReport(str(path), layout, sha256_file(path), len(tensors), attributes=has_attr)
    if ANCHOR_KEY in tensors:
        stored = tensors.pop(ANCHOR_KEY).float()
        ours = cell_anchors(cfg.anchor_sizes, cfg.anchor_ratios)
        if stored.shape != ours.shape or not torch.allclose(stored, ours, atol=1e-3):
            raise ConfigError(
                f"{path}: its anchors differ from the config's ({cfg.anchor_sizes} x {cfg.anchor_ratios})"
            )
        report.dropped.append(ANCHOR_KEY)
    canonical = {k: _to_canonical(k, v) for k, v in tensors.items()}
    state = strict_state(path, canonical, model.state_dict(), cfg.name, report)
    model.load_state_dict(state, strict=True)
    return model, report


def _to_background_last(name: str, value: torch.Tensor) -> torch.Tensor:
    """Inverse of `_to_canonical`: row 0 (background / no attribute) back to the end."""
    if name in BACKGROUND_LAST:
        return torch.cat([value[1:], value[:1]], dim=0)
    return value


def published_state(model: VGDetector) -> dict[str, torch.Tensor]:
    """`model`'s weights as the published files hold them: detectron2 names, background and
    "no attribute" rows last, float32 CPU tensors."""
    return {
        name: _to_background_last(name, value.detach().cpu().float()).clone()
        for name, value in model.state_dict().items()
    }


def save_detector(model: VGDetector, path: Path, author: str = "vlprep") -> str:
    """Write `model` in the ``d2-pickle`` layout that `load_detector` reads (detectron2
    names, background and "no attribute" rows last, float32 numpy arrays; pickle protocol 4,
    which stores array bytes as they are, where Python 2's protocol 2 inflates them by half),
    atomically; returns the file's sha256. The bytes depend only on the weights and
    `author`, so equal weights give an equal digest."""
    import pickle

    from pipeline.io import atomic_write_bytes

    arrays = {name: value.numpy() for name, value in published_state(model).items()}
    path = Path(path)
    atomic_write_bytes(path, pickle.dumps({"model": arrays, "__author__": author}, protocol=4))
    return sha256_file(path)


def save_detector_hf(model: VGDetector, path: Path) -> str:
    """Write `model` in the ``hf-bin`` layout (``unc-nlp/frcnn-vg-finetuned``'s
    ``pytorch_model.bin``): a torch state dict with detectron2 names and rows as in
    `save_detector`, plus what the HF port's modules hold besides — a
    ``num_batches_tracked`` counter per BatchNorm and the anchor buffer `ANCHOR_KEY` — so
    that both `load_detector` and the port's own ``GeneralizedRCNN.from_pretrained`` load it
    strictly. Written atomically; returns the file's sha256."""
    import io

    from pipeline.io import atomic_write_bytes

    state = published_state(model)
    for key in [k for k in state if k.endswith(".norm.running_var")]:
        state[key.replace("running_var", "num_batches_tracked")] = torch.tensor(0)
    state[ANCHOR_KEY] = cell_anchors(model.cfg.anchor_sizes, model.cfg.anchor_ratios)
    buf = io.BytesIO()
    torch.save(state, buf)
    path = Path(path)
    atomic_write_bytes(path, buf.getvalue())
    return sha256_file(path)


WEIGHTS_DATA_DIR = Path(__file__).parent / "weights_data"


def shapes_tiny_weights() -> Path:
    """The packaged shapes-world detector (config ``shapes-tiny``; trained by
    ``workflows/shapes/train_detector.py``). Next to it: ``shapes-tiny.sha256`` (its digest),
    ``shapes-tiny.json`` (training record and held-out measurements) and the label names
    ``objects_shapes.txt`` / ``attributes_shapes.txt`` (for `vlprep show`)."""
    path = WEIGHTS_DATA_DIR / "shapes-tiny.pkl"
    if not path.exists():
        raise ConfigError(f"{path} is missing: the package was installed without its data files")
    return path
