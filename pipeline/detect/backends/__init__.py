"""Extraction backends behind one seam: the registry, and the only way to build an extractor.

=================  ===========================================================================
backend            what it extracts, after which reference
=================  ===========================================================================
``butd-c4``        bottom-up attention's ResNet-101 C4 Faster R-CNN (Visual Genome, 1600 objects
                   + 400 attributes): Caffe BUTD and its detectron2 / HF ports
``vinvl-x152c4``   VinVL's ResNeXt-152 C4 AttrRCNN (1594 objects + 524 attributes):
                   microsoft/scene_graph_benchmark
``grid``           grid features, the C5 map of a detectron2 ResNet / ResNeXt:
                   facebookresearch/grid-feats-vqa
=================  ===========================================================================

``--detector NAME`` names a config of one backend (`config_names`: ``vg-r101``, ``tiny``,
``shapes-tiny``, ``vinvl-x152c4``, ``grid-x152``, ...) or a JSON file holding a config and its
``"backend"`` (a file without one is a ``butd-c4`` config, as such files always were).
`resolve` turns it into a `Detector` (backend + config); `load_model` fills a model from a
weights file (or seeds an untrained one); `build_extractor` wraps a model in the backend's
extractor. A store's provenance records ``Detector.to_json()`` so that `vltrain predict` builds
the very same extractor again (`detector_from_json`).

Importing this package needs no torch: the CLI and `ExtractConfig` use the registry's checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from pipeline.detect.backends.base import Backend, Detector, Extractor, LoadReport
from pipeline.detect.backends.butd_c4 import ButdC4
from pipeline.detect.backends.grid import Grid
from pipeline.detect.backends.vinvl_x152c4 import VinvlX152C4
from pipeline.detect.config import SelectionConfig
from pipeline.errors import ConfigError
from pipeline.io import read_named_json
from pipeline.registry import Registry

__all__ = [
    "BACKENDS",
    "Backend",
    "Detector",
    "Extractor",
    "LoadReport",
    "build_extractor",
    "config_names",
    "detector_from_json",
    "load_model",
    "open_extractor",
    "resolve",
]

BACKENDS: Registry[Backend] = Registry("extraction backend")
for _backend in (ButdC4(), VinvlX152C4(), Grid()):
    BACKENDS.register(_backend)
DEFAULT_BACKEND = "butd-c4"  # of a detector JSON without a "backend" key


def config_names() -> dict[str, Backend]:
    """Every named detector config, and the backend it belongs to."""
    out: dict[str, Backend] = {}
    for backend in BACKENDS:
        for name in backend.config_names():
            if name in out:
                raise ConfigError(f"detector config {name!r} is named by both {out[name].name} and {backend.name}")
            out[name] = backend
    return out


def config_names_by_backend() -> str:
    """Every named config, by backend, as a --detector help text lists them
    (``butd-c4: shapes-tiny, tiny, vg-r101; vinvl-x152c4: ...``)."""
    return "; ".join(f"{b.name}: {', '.join(b.config_names())}" for b in BACKENDS)


def resolve(detector: Union[str, Path, Detector]) -> Detector:
    """The backend and config ``--detector`` names: a named config of any backend, or a JSON
    file (its ``"backend"`` key, ``butd-c4`` when absent). ConfigError listing the names when
    none matches."""
    if isinstance(detector, Detector):
        return detector
    text = str(detector)
    named = config_names()
    if not Path(text).suffix:
        backend = named.get(text)
        if backend is None:
            raise ConfigError(f"no detector config {text!r} (known: {', '.join(sorted(named))}, or a .json path)")
        return Detector(backend, backend.config_from_json(read_named_json(text, backend.config_dir, "detector")))
    obj = read_named_json(text, Path("."), "detector")
    return detector_from_json({"backend": obj.pop("backend", DEFAULT_BACKEND), "config": obj})


def detector_from_json(obj: dict) -> Detector:
    """The `Detector` of ``Detector.to_json()`` (what a store's provenance records)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("config"), dict):
        raise ConfigError(f"a detector is recorded as {{'backend': NAME, 'config': {{...}}}}, got {obj!r:.200}")
    name = obj.get("backend", DEFAULT_BACKEND)
    backend = BACKENDS.get(name)
    config = {k: v for k, v in obj["config"].items() if k != "backend"}
    return Detector(backend, backend.config_from_json(config))


def load_model(detector: Union[str, Detector], weights: Optional[Union[str, Path]], seed: int = 0):
    """(model, report) of `detector` filled from `weights` strictly; with no weights an untrained
    model seeded by `seed` (the caller's random stream is left as it was) and report None."""
    det = resolve(detector)
    if weights is not None:
        return det.backend.load(det.config, Path(weights))
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return det.backend.random_model(det.config), None


def build_extractor(
    detector: Union[str, Detector],
    model,
    *,
    selection: Optional[SelectionConfig] = None,
    preprocess: Optional[str] = None,
    device: str = "cpu",
    fp16: bool = False,
    **options,
) -> Extractor:
    """The backend's extractor around `model` (from `load_model`): `selection` and `preprocess`
    resolved against the backend's defaults, `options` the backend's own (``grid_pool``;
    ``pad_tolerance`` for butd-c4's padded backbone batches)."""
    det = resolve(detector)
    return det.backend.extractor(
        model,
        selection=det.backend.check_selection(selection or SelectionConfig()),
        preprocess=det.backend.check_preprocess(preprocess),
        device=device,
        fp16=fp16,
        options=options,
    )


def open_extractor(
    detector: Union[str, Detector],
    weights: Optional[Union[str, Path]] = None,
    *,
    seed: int = 0,
    selection: Optional[SelectionConfig] = None,
    preprocess: Optional[str] = None,
    device: str = "cpu",
    fp16: bool = False,
    **options,
) -> Extractor:
    """`load_model` then `build_extractor`: the extractor a run of these settings uses."""
    model, _ = load_model(detector, weights, seed)
    return build_extractor(
        detector, model, selection=selection, preprocess=preprocess, device=device, fp16=fp16, **options
    )
