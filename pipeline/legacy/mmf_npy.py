"""MMF per-image feature files: ``<id>.npy`` (float32 features, N x D) and
``<id>_info.npy`` (a pickled dict: ``bbox, num_boxes, objects, cls_prob, image_width,
image_height``), as written by `tools/scripts/features/extract_features_vmb.py`.

Import walks the folder (recursively; the id is the relative path without ``.npy``) and
needs ``trust_pickle``: the info files are pickles, loaded through the restricted
unpickler. Export writes the same pair per image; `cls_prob` keeps our canonical 1601
columns with background first (MMF's `--background` layout), and `objects_conf`,
`attrs_id`, `attrs_conf`, `attr_prob`, `image_id` are added as extra keys (MMF's
readers ignore keys they do not use) so nothing is lost on a round trip.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.legacy.base import ReadOptions, pickle_refusal, ReadResult, RowError, Skipped, record_from_dict, safe_relative_path
from pipeline.records import RegionFeatures
from pipeline.store.layout import StoreLayout
from pipeline.safe_pickle import safe_load_npy_object

INFO_SUFFIX = "_info.npy"


def read_mmf_npy(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    if not opts.trust_pickle:
        raise pickle_refusal("mmf-npy")
    for root in paths:
        if not root.is_dir():
            raise ConfigError(f"{root}: mmf-npy input must be a folder of <id>.npy and <id>_info.npy files")
        for info_path in sorted(root.rglob(f"*{INFO_SUFFIX}")):
            rel = info_path.relative_to(root).as_posix()
            image_id = rel[: -len(INFO_SUFFIX)]
            feat_path = info_path.with_name(info_path.name[: -len(INFO_SUFFIX)] + ".npy")
            try:
                if not feat_path.exists():
                    raise RowError("missing features", f"{feat_path.name} not found")
                try:
                    features = np.load(feat_path, allow_pickle=False)
                except (ValueError, OSError, EOFError) as err:
                    raise RowError("bad npy", f"{feat_path.name}: {err}") from err
                info = safe_load_npy_object(info_path.read_bytes())
                yield record_from_dict(info, default_id=image_id, features=features)
            except UnsafePickleError as err:
                yield Skipped(rel, "refused pickle", str(err))
            except (ValueError, EOFError) as err:
                kind, detail = (err.kind, err.detail) if isinstance(err, RowError) else ("bad npy", str(err))
                yield Skipped(rel, kind, detail)


def _npy_bytes(obj, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, obj, allow_pickle=allow_pickle)
    return buf.getvalue()


def write_mmf_npy(records: Iterable[RegionFeatures], dest: Path, layout: StoreLayout) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for rec in records:
        rel = safe_relative_path(rec.image_id)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        info = {
            "image_id": rec.image_id,
            "bbox": np.asarray(rec.boxes, np.float32),
            "num_boxes": rec.num_boxes,
            "image_width": rec.image_w,
            "image_height": rec.image_h,
        }
        optional = {
            "objects": (rec.objects_id, np.int64), "objects_conf": (rec.objects_conf, np.float32),
            "attrs_id": (rec.attrs_id, np.int64), "attrs_conf": (rec.attrs_conf, np.float32),
            "cls_prob": (rec.cls_prob, np.float32), "attr_prob": (rec.attr_prob, np.float32),
        }
        info.update({k: np.asarray(v, t) for k, (v, t) in optional.items() if v is not None})
        target.with_name(target.name + ".npy").write_bytes(_npy_bytes(np.asarray(rec.features, np.float32)))
        # MMF loads this with np.load(allow_pickle=True).item(): a pickle by its format.
        target.with_name(target.name + INFO_SUFFIX).write_bytes(_npy_bytes(info, allow_pickle=True))
        count += 1
    return count
