"""``vlprep extract --given-boxes``: the file of boxes to extract features for, read and checked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.feather as feather
import pyarrow.parquet as pq

from pipeline.errors import ConfigError


def read_given_boxes(path: Path) -> dict[str, np.ndarray]:
    """image_id -> (N, 4) float32 x1y1x2y2 boxes in original pixels, from JSON
    (``{"id": [[x1, y1, x2, y2], ...]}`` or ``[{"image_id", "boxes"}, ...]``) or an
    Arrow/Parquet table with ``image_id`` and ``boxes`` (list of 4-lists, or flat) columns.
    A ConfigError names the file and the image of anything else."""
    path = Path(path)
    if path.suffix in (".parquet", ".arrow", ".feather"):
        table = pq.read_table(path) if path.suffix == ".parquet" else feather.read_table(path)
        if not {"image_id", "boxes"} <= set(table.column_names):
            raise ConfigError(f"{path}: needs image_id and boxes columns")
        pairs = zip(table.column("image_id").to_pylist(), table.column("boxes").to_pylist())
    else:
        try:
            obj = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from err
        pairs = obj.items() if isinstance(obj, dict) else ((o.get("image_id"), o.get("boxes")) for o in obj)
    out = {}
    for image_id, boxes in pairs:
        try:
            arr = np.asarray(boxes, np.float32).reshape(-1, 4)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{path}: image {image_id!r}: boxes are not a list of [x1, y1, x2, y2]") from err
        if not len(arr) or not np.isfinite(arr).all() or (arr[:, 2] < arr[:, 0]).any() or (arr[:, 3] < arr[:, 1]).any():
            raise ConfigError(f"{path}: image {image_id!r}: needs >= 1 finite box with x1 <= x2 and y1 <= y2")
        out[str(image_id)] = arr
    return out
