"""Grid features as grid-feats-vqa's ``extract_grid_feature.py`` saves them: a folder of
``<image_id>.pth``, each a float32 tensor ``[1, C, h, w]`` (the C5 map; ``torch.load`` reads it, as
MCAN-style loaders do), plus ``grid_sizes.json``, which the .pth files lack and a store needs:

    {"min_size": 600, "max_size": 1000, "stride": 32, "pool": null | "8x8",
     "images": {"<image_id>": [height, width], ...}}

Export writes each record's cells back as its map (`pipeline.records.grid_shape`: row-major), and
the sizes file from the store (its extractor's input sizes and ``--grid-pool``). Import reads
them back: a cell's box is the one our grid extractor gives it (detectron2's resize of the image
to `min_size` / `max_size`, `stride` pixels a cell, clipped, scaled back; pooled maps by the
adaptive pool's bins), so a map whose size is not what its image gives at those sizes is skipped
by name, never re-boxed by guess. For grid-feats-vqa's own folders, write the sizes file beside
them (``images`` alone: the other keys default to its 600 / 1000 / 32). Only tensors are read
(``weights_only``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

import numpy as np

from pipeline.detect.backends.grid.cells import bins, cell_boxes
from pipeline.detect.config import GridPool
from pipeline.errors import ConfigError
from pipeline.formats.base import (
    Description,
    ReadOptions,
    ReadResult,
    RowError,
    WriteContext,
    decode_row,
    safe_relative_path,
)
from pipeline.records import RegionFeatures, grid_shape

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

SIZES = "grid_sizes.json"
DEFAULTS = {"min_size": 600, "max_size": 1000, "stride": 32, "pool": None}  # grid-feats-vqa's


def check_grid(store: "FeatureStore", ctx: WriteContext) -> None:
    if store.layout.regions != "grid":
        raise ConfigError(
            f"{store.path}: grid-pth holds feature maps, and this store holds a detector's regions "
            "(extract grid features with --detector grid-x152, grid-x101 or grid-r50)"
        )


def write_grid_pth(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    manifest = ctx.manifest
    config = (manifest.provenance.get("extractor") or {}).get("config") or {}
    run = manifest.provenance.get("config") or {}
    stride = 32 if int(config.get("res5_dilation", 1)) == 1 else 16
    sizes = {
        "min_size": int(config.get("min_size", DEFAULTS["min_size"])),
        "max_size": int(config.get("max_size", DEFAULTS["max_size"])),
        "stride": stride,
        "pool": run.get("grid_pool"),
        "images": {},
    }
    import torch  # here: the format registry loads without torch

    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for rec in records:
        rows, cols = grid_shape(rec.boxes)
        grid = torch.from_numpy(np.array(rec.features, np.float32)).reshape(rows, cols, -1)
        target = dest / safe_relative_path(rec.image_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save(grid.permute(2, 0, 1).contiguous()[None], target.with_name(target.name + ".pth"))
        sizes["images"][rec.image_id] = [rec.image_h, rec.image_w]
        count += 1
    (dest / SIZES).write_text(json.dumps(sizes) + "\n", encoding="utf-8")
    return count


def read_sizes(paths: Sequence[Path]) -> tuple[dict, Path]:
    """The sizes file among the sources (or in a source folder), its defaults filled in."""
    found = [p for p in paths if p.is_file() and p.suffix == ".json"]
    found += [p / SIZES for p in paths if p.is_dir() and (p / SIZES).is_file()]
    if len(found) != 1:
        raise ConfigError(
            f"grid-pth needs one {SIZES} (the images' sizes: a .pth holds none) among the sources or in the "
            f"folder; found {len(found)}"
        )
    try:
        obj = json.loads(found[0].read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"{found[0]}: not a readable JSON sizes file ({err})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("images"), dict):
        raise ConfigError(f'{found[0]}: a sizes file holds {{"images": {{"<image_id>": [height, width]}}}}')
    sizes = {**DEFAULTS, **{k: v for k, v in obj.items() if k in DEFAULTS and v is not None}, "images": obj["images"]}
    for key in ("min_size", "max_size", "stride"):
        if not isinstance(sizes[key], int) or isinstance(sizes[key], bool) or sizes[key] < 1:
            raise ConfigError(f"{found[0]}: {key} must be a positive integer, got {sizes[key]!r}")
    if sizes["pool"] is not None:
        sizes["pool"] = GridPool.parse(sizes["pool"])
    return sizes, found[0]


def grid_described(paths: Sequence[Path], opts: ReadOptions) -> Description:
    """The most cells an imported record can have (the trainer's slot check reads it)."""
    sizes, _ = read_sizes(paths)
    pool: Optional[GridPool] = sizes["pool"]
    if pool is not None:
        return Description(provenance={"max_regions": pool.rows * pool.cols})
    stride = sizes["stride"]
    return Description(provenance={"max_regions": -(-sizes["min_size"] // stride) * -(-sizes["max_size"] // stride)})


def read_grid_pth(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    sizes, _ = read_sizes(paths)
    for root in paths:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.pth")):
            rel = path.relative_to(root).as_posix()
            yield decode_row(rel, lambda path=path, rel=rel: _decode(path, rel[: -len(".pth")], sizes))


def _decode(path: Path, image_id: str, sizes: dict) -> RegionFeatures:
    import torch  # here: the format registry loads without torch

    from pipeline.detect.preprocess import detectron2_size

    if image_id not in sizes["images"]:
        raise RowError("no image size", f"{image_id!r} is not in {SIZES}")
    try:
        height, width = (int(v) for v in sizes["images"][image_id])
    except (TypeError, ValueError) as err:
        raise RowError("bad size", f"{sizes['images'][image_id]!r:.60} is not [height, width]") from err
    try:
        grid = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged or hostile file: this image's error
        raise RowError("unreadable", f"{type(err).__name__}: {err}") from None
    if not isinstance(grid, torch.Tensor) or grid.dim() not in (3, 4) or (grid.dim() == 4 and grid.shape[0] != 1):
        raise RowError(
            "not a map", f"expected a [1, C, h, w] tensor, got {getattr(grid, 'shape', type(grid).__name__)}"
        )
    grid = grid.reshape(grid.shape[-3:]).float()
    h, w = grid.shape[1:]
    new_hw = detectron2_size(height, width, sizes["min_size"], sizes["max_size"])
    stride = sizes["stride"]
    full = (-(-new_hw[0] // stride), -(-new_hw[1] // stride))
    pool: Optional[GridPool] = sizes["pool"]
    if (h, w) == full and pool is None:
        rows, cols = [(i, i + 1) for i in range(h)], [(j, j + 1) for j in range(w)]
    elif pool is not None and (h, w) == (pool.rows, pool.cols):
        rows, cols = bins(full[0], pool.rows), bins(full[1], pool.cols)
    else:
        expected = f"{full[0]}x{full[1]}" if pool is None else str(pool)
        raise RowError(
            "map size mismatch",
            f"a {h}x{w} map, but a {height}x{width} image gives {expected} at {sizes['min_size']}/{sizes['max_size']}",
        )
    return RegionFeatures(
        image_id=image_id,
        image_h=height,
        image_w=width,
        boxes=cell_boxes(rows, cols, stride, new_hw, (height, width)),
        features=np.ascontiguousarray(grid.flatten(1).t().numpy(), np.float32),
    )
