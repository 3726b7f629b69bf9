"""VinVL's label map (``VG-SGG-dicts-vgoi6-clipped.json``): the names of its classes and
attributes. The reference reads ``label_to_idx`` and ``attribute_to_idx`` ({name: index}, 1-based:
the model's output index, 0 being the background / "no attribute"); `read_labelmap` checks them
against the detector config (1594 + 1 classes, 524 + 1 attributes for ``vinvl-x152c4``) and
returns the names in index order, index 0 first."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.io import MAX_CONFIG_BYTES

BACKGROUND, NO_ATTRIBUTE = "__background__", "__no_attribute__"


def _names(table: object, size: int, what: str, first: str, path: Path) -> list[str]:
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in table.items()):
        raise ConfigError(f"{path}: {what} must map names to integer indices")
    if sorted(table.values()) != list(range(1, size)):
        raise ConfigError(
            f"{path}: {what} has {len(table)} entries with indices {min(table.values(), default=None)}.."
            f"{max(table.values(), default=None)}, but the detector has {size - 1} (indices 1..{size - 1}): "
            "a label map of another model"
        )
    names = [first] * size
    for name, index in table.items():
        names[index] = name
    return names


def read_labelmap(path: Path, cfg) -> tuple[list[str], list[str]]:
    """(class names, attribute names) of the label map at `path`, each indexed as the model's
    outputs (index 0: background / no attribute); ConfigError naming the file when it is not a
    label map or one of another size than `cfg`'s."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--labelmap: {path} is not a file")
    if path.stat().st_size > 50 * MAX_CONFIG_BYTES:
        raise ConfigError(f"--labelmap: {path} is over {50 * MAX_CONFIG_BYTES:,} bytes; no label map is that large")
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"--labelmap: {path} is not JSON ({err})") from None
    if not isinstance(obj, dict) or "label_to_idx" not in obj:
        raise ConfigError(f"--labelmap: {path} has no label_to_idx (a VG-SGG-dicts label map has)")
    classes = _names(obj["label_to_idx"], cfg.num_classes, "label_to_idx", BACKGROUND, path)
    attributes = (
        _names(obj.get("attribute_to_idx"), cfg.num_attributes, "attribute_to_idx", NO_ATTRIBUTE, path)
        if cfg.num_attributes
        else []
    )
    return classes, attributes
