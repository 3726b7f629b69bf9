"""``grid``: grid features (Jiang et al., CVPR 2020; facebookresearch/grid-feats-vqa), the C5 map
of a detectron2 ResNet / ResNeXt, one region per cell (`extractor.GridExtractor`).

Modules: `config` (architecture and input; named configs ``grid-x152``, ``grid-x101``,
``grid-r50``, ``grid-tiny``), `model` (detectron2 module names), `weights` (grid-feats-vqa's
checkpoints, strictly: the backbone's tensors fill the model, the detection heads' are counted
unused), `extractor`. Preprocessing: ``detectron2``. No box selection, no given boxes; the
cells may be average-pooled (``--grid-pool RxC``).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.detect.backends.base import Backend
from pipeline.detect.backends.grid.config import CONFIG_DIR, WEIGHT_SOURCES, GridConfig
from pipeline.errors import ConfigError


class Grid(Backend):
    name = "grid"
    title = "grid features: the C5 map of a detectron2 ResNet / ResNeXt (facebookresearch/grid-feats-vqa)"
    config_cls = GridConfig
    config_dir = CONFIG_DIR
    regions = "grid"
    preprocess_modes = ("detectron2",)
    weights_help = WEIGHT_SOURCES

    def check_options(self, cfg, config: GridConfig) -> None:
        super().check_options(cfg, config)
        if cfg.grid_pool is not None:
            grid = config
            rows, cols = smallest_map(grid)
            if cfg.grid_pool.rows > rows or cfg.grid_pool.cols > cols:
                raise ConfigError(
                    f"--grid-pool {cfg.grid_pool} is larger than the map: {grid.name} gives an image "
                    f"{rows}x{cols} cells at its shortest side ({grid.min_size} px at stride {grid.stride})"
                )

    def max_regions(self, config: GridConfig, selection, options: dict) -> int:
        """R x C with ``--grid-pool RxC``; else the cells of the largest map: short side at
        `min_size`, long side at `max_size` (19 x 32 = 608 at 600 / 1000, stride 32)."""
        pool = options.get("grid_pool")
        if pool is not None:
            return pool.rows * pool.cols
        return -(-config.min_size // config.stride) * -(-config.max_size // config.stride)

    def describe_selection(self, selection, options: dict) -> str:
        pool = options.get("grid_pool")
        return f"grid cells{'' if pool is None else f' pooled to {pool}'}"

    def load(self, cfg: GridConfig, path: Path):
        from pipeline.detect.backends.grid.weights import load_grid

        return load_grid(path, cfg)

    def random_model(self, cfg: GridConfig):
        from pipeline.detect.backends.grid.model import GridBackbone

        return GridBackbone(cfg)

    def extractor(self, model, *, selection, preprocess, device, fp16, options):
        from pipeline.detect.backends.grid.extractor import GridExtractor

        return GridExtractor(
            model, device=device, fp16=fp16, preprocess=preprocess, **self.take_options(options, "grid_pool")
        )


def smallest_map(cfg: GridConfig) -> tuple[int, int]:
    """Cells of the map of an image whose short side is resized to `min_size` (a square: the
    least a map has on both sides unless the long side's cap shrinks it, for images over
    max/min times longer than wide)."""
    side = -(-cfg.min_size // cfg.stride)
    return side, side
