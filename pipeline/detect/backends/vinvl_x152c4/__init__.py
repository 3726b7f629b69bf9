"""``vinvl-x152c4``: VinVL's ResNeXt-152 C4 AttrRCNN (Zhang et al., CVPR 2021;
microsoft/scene_graph_benchmark), on torch + torchvision.

Modules: `config` (architecture, named configs ``vinvl-x152c4`` and ``vinvl-tiny``, default
selection), `model` (maskrcnn-benchmark's layers under our names), `weights` (the published
maskrcnn-benchmark checkpoint, strictly), `postprocess` (NMS_FILTER 1 / 2, box regression on or
ignored, the attribute head's output), `labelmap` (VG-SGG-dicts JSON), `extractor`.
Preprocessing: ``maskrcnn``. Given boxes: features for exactly those boxes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.detect.backends.base import Backend
from pipeline.detect.backends.vinvl_x152c4.config import (
    CLASS_AGNOSTIC_NMS,
    CONFIG_DIR,
    DEFAULT_SELECTION,
    POLICIES,
    WEIGHT_SOURCES,
    VinvlConfig,
)
from pipeline.detect.config import SelectionConfig
from pipeline.errors import ConfigError


class VinvlX152C4(Backend):
    name = "vinvl-x152c4"
    title = "VinVL's ResNeXt-152 C4 AttrRCNN, Visual Genome 1594 objects + 524 attributes (scene_graph_benchmark)"
    config_cls = VinvlConfig
    config_dir = CONFIG_DIR
    policies = POLICIES
    default_selection = DEFAULT_SELECTION
    preprocess_modes = ("maskrcnn",)
    weights_help = WEIGHT_SOURCES
    given_boxes = True
    labelmap = True

    def check_selection(self, selection: SelectionConfig) -> SelectionConfig:
        """The defaults of the README's extraction; the NMS threshold is the policy's own in the
        reference (0.3 for per-class, ROI_HEADS.NMS 0.5 for class-agnostic). Class-agnostic with
        box regression is refused: the reference then reports boxes of other proposals."""
        if selection.nms_thresh is None and selection.policy == "class-agnostic":
            selection = replace(selection, nms_thresh=CLASS_AGNOSTIC_NMS)
        resolved = super().check_selection(selection)
        if resolved.policy == "class-agnostic" and resolved.regression:
            raise ConfigError(
                "--policy class-agnostic --box-regression: the reference (NMS_FILTER 2 with regression) reports "
                "the boxes of other proposals than the scores and features it keeps (filter_results_fast indexes "
                "the per-class box table by proposal); use --no-box-regression, or --policy per-class"
            )
        return resolved

    def check_options(self, cfg, config: VinvlConfig) -> None:
        super().check_options(cfg, config)
        if cfg.labelmap is not None:
            from pipeline.detect.backends.vinvl_x152c4.labelmap import read_labelmap

            read_labelmap(cfg.labelmap, config)  # refuses one of the wrong size, by name

    def label_names(self, config: VinvlConfig, labelmap: Path) -> dict:
        from pipeline.detect.backends.vinvl_x152c4.labelmap import read_labelmap
        from pipeline.io import sha256_file

        objects, attributes = read_labelmap(labelmap, config)
        return {
            "file": Path(labelmap).name,
            "sha256": sha256_file(Path(labelmap)),
            "objects": objects[1:],
            "attributes": attributes[1:],
        }

    def load(self, cfg: VinvlConfig, path: Path):
        from pipeline.detect.backends.vinvl_x152c4.weights import load_vinvl

        return load_vinvl(path, cfg)

    def random_model(self, cfg: VinvlConfig):
        from pipeline.detect.backends.vinvl_x152c4.model import AttrRCNN

        return AttrRCNN(cfg)

    def extractor(self, model, *, selection, preprocess, device, fp16, options):
        from pipeline.detect.backends.vinvl_x152c4.extractor import VinvlExtractor

        return VinvlExtractor(
            model,
            selection,
            device=device,
            fp16=fp16,
            preprocess=preprocess,
            **self.take_options(options, "kernels", "threads"),
        )
