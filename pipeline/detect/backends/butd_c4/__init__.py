"""``butd-c4``: bottom-up attention's ResNet-101 C4 Faster R-CNN with its Visual Genome heads
(Anderson et al. 2018; the Caffe original and its detectron2 / HF ports), on torch + torchvision.

Modules: `config` (architecture, named configs in ``configs/``, default selection), `model`
(detectron2 module names), `weights` (the published detectron2 pickles and HF bins, strictly),
`selection` (the ``butd`` and ``maxnms`` policies), `extractor` (images -> regions), `training`
(the losses the packaged shapes detector was trained with). Preprocessing: ``caffe`` (default)
or ``detectron2`` (`pipeline.detect.preprocess`). Given boxes: features for exactly those boxes.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.detect.backends.base import Backend
from pipeline.detect.backends.butd_c4.config import (
    CONFIG_DIR,
    DEFAULT_SELECTION,
    POLICIES,
    WEIGHT_SOURCES,
    DetectorConfig,
)


class ButdC4(Backend):
    name = "butd-c4"
    title = "bottom-up attention's ResNet-101 C4 Faster R-CNN, Visual Genome (Caffe BUTD; detectron2 / HF ports)"
    config_cls = DetectorConfig
    config_dir = CONFIG_DIR
    policies = POLICIES
    default_selection = DEFAULT_SELECTION
    preprocess_modes = ("caffe", "detectron2")
    weights_help = WEIGHT_SOURCES
    given_boxes = True

    def load(self, cfg: DetectorConfig, path: Path):
        from pipeline.detect.backends.butd_c4.weights import load_detector

        return load_detector(path, cfg)

    def random_model(self, cfg: DetectorConfig):
        from pipeline.detect.backends.butd_c4.model import VGDetector

        return VGDetector(cfg)

    def extractor(self, model, *, selection, preprocess, device, fp16, options):
        from pipeline.detect.backends.butd_c4.extractor import RegionFeatureExtractor

        return RegionFeatureExtractor(
            model,
            selection,
            device=device,
            fp16=fp16,
            preprocess=preprocess,
            **self.take_options(options, "pad_tolerance", "kernels", "threads"),
        )
