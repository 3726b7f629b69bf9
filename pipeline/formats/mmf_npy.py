"""MMF per-image feature files: ``<id>.npy`` (float32 features, N x D) and
``<id>_info.npy`` (a pickled dict: ``bbox, num_boxes, objects, cls_prob, image_width,
image_height``), as written by `tools/scripts/features/extract_features_vmb.py`.

Import walks the folder (recursively; the id is the relative path without ``.npy``) and
needs ``trust_pickle``: the info files are pickles, loaded through the restricted
unpickler. (``x_info.npy`` is the info file of ``x``, unless ``x.npy`` is absent and
``x_info_info.npy`` exists: then it holds the features of the image ``x_info``.)
Export writes the same pair per image; `cls_prob` keeps our canonical 1601
columns with background first (MMF's `--background` layout), and `objects_conf`,
`attrs_id`, `attrs_conf`, `attr_prob`, `image_id` are added as extra keys (MMF's
readers ignore keys they do not use) so nothing is lost on a round trip. Ids whose
files would collide (``img`` and ``img_info`` both need ``img_info.npy``; ``a`` writes
the file ``a.npy`` that ``a.npy/b`` needs as a folder) are refused before anything is
written.
"""

from __future__ import annotations

import io
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.formats.base import (
    ReadOptions,
    ReadResult,
    RowError,
    WriteContext,
    decode_row,
    pickle_refusal,
    record_from_dict,
    safe_relative_path,
)
from pipeline.records import RegionFeatures
from pipeline.safe_pickle import legacy_dumps, safe_load_npy_object

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

INFO_SUFFIX = "_info.npy"


def read_mmf_npy(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    if not opts.trust_pickle:
        raise pickle_refusal("mmf-npy")
    for root in paths:
        if not root.is_dir():
            raise ConfigError(f"{root}: mmf-npy input must be a folder of <id>.npy and <id>_info.npy files")
        for info_path in sorted(root.rglob(f"*{INFO_SUFFIX}")):
            rel = info_path.relative_to(root).as_posix()
            feat_path = info_path.with_name(info_path.name[: -len(INFO_SUFFIX)] + ".npy")
            if not feat_path.exists() and info_path.with_name(info_path.name[:-4] + INFO_SUFFIX).exists():
                continue  # the features of an image whose id ends in "_info"
            image_id = rel[: -len(INFO_SUFFIX)]
            yield decode_row(rel, lambda: _decode(info_path, feat_path, image_id, opts.options.cls_background))


def _decode(info_path: Path, feat_path: Path, image_id: str, background: str) -> RegionFeatures:
    if not feat_path.exists():
        raise RowError("missing features", f"{feat_path.name} not found")
    features = _load(feat_path, lambda p: np.load(p, allow_pickle=False))
    info = _load(info_path, lambda p: safe_load_npy_object(p.read_bytes()))
    return record_from_dict(info, default_id=image_id, features=features, background=background)


def _load(path: Path, load):
    try:
        return load(path)
    except UnsafePickleError:
        raise  # refused, with its own reason
    except (ValueError, OSError, EOFError) as err:
        raise RowError("bad npy", f"{path.name}: {err}") from err


def _collision(first: str, second: str, what: str) -> ConfigError:
    return ConfigError(
        f"mmf-npy export: the image ids collide: {what}; MMF's layout (<id>.npy beside "
        f"<id>_info.npy) cannot hold both {first!r} and {second!r}: rename one, or export to "
        "another format"
    )


def check_mmf_ids(store: "FeatureStore", ctx: WriteContext) -> None:
    """Refuse ids whose output paths collide, before anything is written: ``x`` and
    ``x_info`` (both write ``x_info.npy``), or ``x`` and ``x.npy/...`` / ``x_info.npy/...``
    (a file where a folder is needed); and ids that would escape the folder."""
    for image_id in store.ids():
        safe_relative_path(image_id)
        if image_id.endswith("_info") and image_id[: -len("_info")] in store:
            other = image_id[: -len("_info")]
            raise _collision(other, image_id, f"{other!r} and {image_id!r} both write {image_id}.npy")
        for folder in PurePosixPath(image_id).parents:
            name = folder.as_posix()
            for suffix in (".npy", INFO_SUFFIX):
                if name.endswith(suffix) and name[: -len(suffix)] in store:
                    other = name[: -len(suffix)]
                    raise _collision(
                        other, image_id, f"{other!r} writes the file {name}, which {image_id!r} needs as a folder"
                    )


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _info_npy_bytes(info: dict) -> bytes:
    """What ``np.save(path, info, allow_pickle=True)`` writes (a 0-d object array,
    pickled with protocol 3), with numpy's globals named as numpy 1.x names them
    (`safe_pickle.legacy_dumps`), so MMF's ``np.load(..., allow_pickle=True).item()``
    works under any numpy."""
    array = np.empty((), dtype=object)
    array[()] = info
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(array))
    buf.write(legacy_dumps(array))
    return buf.getvalue()


def write_mmf_npy(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
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
            "objects": (rec.objects_id, np.int64),
            "objects_conf": (rec.objects_conf, np.float32),
            "attrs_id": (rec.attrs_id, np.int64),
            "attrs_conf": (rec.attrs_conf, np.float32),
            "cls_prob": (rec.cls_prob, np.float32),
            "attr_prob": (rec.attr_prob, np.float32),
        }
        info.update({k: np.asarray(v, t) for k, (v, t) in optional.items() if v is not None})
        target.with_name(target.name + ".npy").write_bytes(_npy_bytes(np.asarray(rec.features, np.float32)))
        # MMF loads this with np.load(allow_pickle=True).item(): a pickle by its format.
        target.with_name(target.name + INFO_SUFFIX).write_bytes(_info_npy_bytes(info))
        count += 1
    return count
