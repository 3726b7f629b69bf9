"""Reading a detector weights file, and telling which published family it belongs to.

Three families of published files, told apart by their bytes and key names (`family`):

* ``butd-c4``: bottom-up attention's detectron2 ports — a pickle of ``{"model": {name: array}}``
  (py-bottom-up-attention's ``faster_rcnn_from_caffe*.pkl``) or a torch state dict
  (``unc-nlp/frcnn-vg-finetuned``'s ``pytorch_model.bin``); detectron2 names with res5 under
  ``roi_heads.res5``;
* ``grid``: grid-feats-vqa's detectron2 checkpoints (``X-152.pth``: ``{"model": state dict}``),
  detectron2 names with res5 in the backbone (``backbone.res5``);
* ``vinvl-x152c4``: maskrcnn-benchmark checkpoints (``vinvl_vg_x152c4.pth``), names under
  ``backbone.body.`` / ``rpn.head.`` / ``roi_heads.box.``.

A backend given another family's file says which family it is and which ``--detector`` reads
it, instead of listing a thousand mismatched keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.safe_pickle import safe_loads

FAMILY_DETECTORS = {"butd-c4": "vg-r101", "grid": "grid-x152 (or grid-x101, grid-r50)", "vinvl-x152c4": "vinvl-x152c4"}


def file_kind(path: Path) -> str:
    """``torch`` (a torch.save zip archive) or ``pickle`` (a plain pickle stream)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head[:2] == b"PK":
        return "torch"
    if head[:1] == b"\x80":
        return "pickle"
    raise ConfigError(f"{path}: neither a torch checkpoint nor a detectron2 pickle")


def read_tensors(path: Path, kind: Optional[str] = None) -> dict[str, torch.Tensor]:
    """name -> tensor of a weights file: a pickle through the restricted unpickler (numpy arrays
    and plain values only) or a torch file with ``weights_only=True``; the state dict under a
    ``"model"`` key when there is one (detectron2 and maskrcnn-benchmark checkpoints), else the
    file's own mapping. Non-tensor entries (a training step count) are left out."""
    kind = kind or file_kind(path)
    if kind == "pickle":
        try:
            obj = safe_loads(Path(path).read_bytes(), encoding="latin1")
        except UnsafePickleError as err:
            raise ConfigError(f"{path}: {err}") from err
    else:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ConfigError(f"{path}: cannot read as a torch checkpoint: {err}") from err
    if isinstance(obj, dict) and isinstance(obj.get("model"), dict):
        obj = obj["model"]
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: expected a state dict (name -> tensor), got {type(obj).__name__}")
    out = {}
    for name, value in obj.items():
        if isinstance(value, torch.Tensor):
            out[str(name)] = value
        elif isinstance(value, np.ndarray):
            out[str(name)] = torch.as_tensor(value)
    return out


def family(names) -> Optional[str]:
    """The published family whose key names these are (module prefixes stripped of a leading
    ``module.``), or None when none fits."""
    names = [n[len("module.") :] if n.startswith("module.") else n for n in names]
    if any(n.startswith(("backbone.body.", "rpn.head.", "roi_heads.box.")) for n in names):
        return "vinvl-x152c4"
    if any(n.startswith("backbone.res5.") for n in names):
        return "grid"
    if any(n.startswith(("roi_heads.res5.", "backbone.res4.")) for n in names):
        return "butd-c4"
    return None


def refuse_other_family(path: Path, names, backend: str) -> None:
    """ConfigError when the file's keys belong to another backend's published family."""
    found = family(names)
    if found is not None and found != backend:
        raise ConfigError(
            f"{path}: a {found} weights file (its key names), not a {backend} one: "
            f"read it with --detector {FAMILY_DETECTORS[found]}"
        )


def read_family(path: Path, backend: str, sources: str) -> tuple[str, dict[str, torch.Tensor]]:
    """(file kind, name -> tensor) of `backend`'s weights file at `path`: ConfigError when it does
    not exist (with `sources`: where the published files come from) or belongs to another family."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights not found: {path}; {sources}")
    kind = file_kind(path)
    tensors = read_tensors(path, kind)
    refuse_other_family(path, tensors, backend)
    return kind, tensors
