"""VinVL's and Oscar's TSV files, each beside its ``.lineidx`` (one decimal byte offset per row, as
scene_graph_benchmark's `tsv_writer` writes it; ours counts bytes, so non-ASCII keys seek right).

vinvl-tsv (scene_graph_benchmark `convert_predictions_to_tsv`): a folder holding
    predictions.tsv     ``key \\t {"objects": [{"rect": [x1, y1, x2, y2], "bbox_id": i, "class": name,
                        "conf": score, "feature": base64(float32 x D), "attributes": [names],
                        "attr_scores": [scores]}, ...], "relations": null}``
    predictions.hw.tsv  ``key \\t [{"height": H, "width": W}]`` (the image sizes; predictions.tsv has none)
    labelmap.json       the VG-SGG-dicts label map (``label_to_idx``, ``attribute_to_idx``: 1-based)
  Export writes the attributes the extractor reports (the label map's names above its attribute
  threshold, best first, at most its `max_attributes`), the best one always, so a record's
  ``attrs_id`` / ``attrs_conf`` come back; class probability tables are not in the format.
oscar-tsv (Oscar's ``run_captioning.py`` / ``run_vqa.py`` inputs): a folder holding
    feature.tsv         ``key \\t {"num_boxes": N, "features": base64(float32 N x (D + 6))}``: each row
                        the feature and the 6-d position ``[x1/W, y1/H, x2/W, y2/H, w/W, h/H]``
    label.tsv           ``key \\t [{"class": name, "conf": score, "rect": [x1, y1, x2, y2]}, ...]``
    labelmap.json       as above
  On import the image size comes from the rows (each box against its position tail), and every
  row's position tail is checked against its box at that size, not trusted.

Import takes the folder (or its files). A row that cannot be used (bad JSON, base64 of the wrong
length, a class the label map lacks, a position tail that disagrees with its box) is skipped with
its ``file:line`` and the reason; a key missing from the sizes or labels file likewise.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

import numpy as np

from pipeline.errors import ConfigError
from pipeline.formats.base import (
    Description,
    ReadOptions,
    ReadResult,
    RowError,
    Skipped,
    WriteContext,
    array_from_bytes,
    decode_row,
)
from pipeline.records import RegionFeatures, box_positions
from pipeline.store.manifest import Manifest

if TYPE_CHECKING:
    from pipeline.store import FeatureStore

LABELMAP = "labelmap.json"
POSITION_DIM = 6
DEFAULT_ATTRIBUTE_THRESH = 0.05  # scene_graph_benchmark's POSTPROCESS_ATTRIBUTES_THRESHOLD
TAIL_TOLERANCE = 1e-5  # a position tail within this of its box's position


# -- the TSV + lineidx pair ----------------------------------------------------------------


def write_tsv(path: Path, rows: Iterable[tuple[str, str]]) -> int:
    """Write ``key \\t value`` rows to `path` and the byte offset of each to its ``.lineidx``."""
    count, offset = 0, 0
    with open(path, "wb") as out, open(path.with_suffix(".lineidx"), "w", encoding="ascii") as index:
        for key, value in rows:
            if "\t" in key or "\n" in key or "\r" in key:
                raise ConfigError(f"image id {key!r} holds a tab or a line break: no TSV row can carry it")
            line = f"{key}\t{value}\n".encode("utf-8")
            index.write(f"{offset}\n")
            out.write(line)
            offset += len(line)
            count += 1
    return count


def read_tsv(path: Path) -> Iterator[tuple[str, Optional[str], Optional[str], bool]]:
    """(``file:line``, key, value, newline-terminated) per non-empty row; key None for a row
    without a tab (its value then says why)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            complete = raw.endswith(b"\n")
            line = raw.rstrip(b"\r\n")
            if not line:
                continue
            location = f"{path.name}:{lineno}"
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                yield location, None, f"bad utf-8: {err}", complete
                continue
            key, tab, value = text.partition("\t")
            yield (location, key, value, complete) if tab else (location, None, "no tab in the row", complete)


# -- label maps ------------------------------------------------------------------------------


def labels_of(manifest: Manifest, fmt: str) -> dict:
    """The store's label names (`vlprep extract --labelmap`); ConfigError when it has none."""
    labels = manifest.provenance.get("labels")
    if not isinstance(labels, dict) or not labels.get("objects"):
        raise ConfigError(
            f"{fmt} names each region's class, and this store records no label names: extract it with "
            "--labelmap (VinVL's VG-SGG-dicts-vgoi6-clipped.json), or import it with one"
        )
    return labels


def check_labels(store: "FeatureStore", fmt: str) -> None:
    labels = labels_of(store.manifest, fmt)
    for kind in ("objects", "attributes"):
        names = labels.get(kind) or []
        if len(set(names)) != len(names):
            raise ConfigError(f"{fmt}: the store's {kind} names repeat a name; a label map maps each name once")


def write_labelmap(path: Path, labels: dict) -> None:
    """The VG-SGG-dicts form: names to 1-based indices (0 is the background / no attribute)."""
    obj = {
        "label_to_idx": {name: i + 1 for i, name in enumerate(labels["objects"])},
        "attribute_to_idx": {name: i + 1 for i, name in enumerate(labels.get("attributes") or [])},
    }
    path.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")


def read_labelmap(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(class name -> 0-based objects_id, attribute name -> 0-based attrs_id) of a label map."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ConfigError(f"{path}: not a readable JSON label map ({err})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("label_to_idx"), dict):
        raise ConfigError(f"{path}: a label map holds label_to_idx (and attribute_to_idx)")
    out = []
    for table in (obj["label_to_idx"], obj.get("attribute_to_idx") or {}):
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in table.values()):
            raise ConfigError(f"{path}: label map indices must be integers >= 1 (0 is the background)")
        out.append({name: index - 1 for name, index in table.items()})
    return out[0], out[1]


def _labelmap_provenance(paths: Sequence[Path]) -> dict:
    """The imported store's label names, from the label map among the sources."""
    path = _find(paths, lambda p: p.suffix == ".json", "label map (labelmap.json)")
    objects, attributes = read_labelmap(path)

    def names(table: dict[str, int]) -> list[str]:
        out = [""] * (max(table.values(), default=-1) + 1)
        for name, index in table.items():
            out[index] = name
        return out

    return {"labels": {"file": path.name, "objects": names(objects), "attributes": names(attributes)}}


def _find(paths: Sequence[Path], match, what: str, optional: bool = False) -> Optional[Path]:
    """The one file among `paths` (and the files of folders among them) that `match`es."""
    files = [f for p in paths for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]
    files = [f for f in files if not f.name.startswith(".")]  # an export's own marker file
    found = [f for f in files if match(f)]
    if len(found) > 1:
        raise ConfigError(f"more than one {what} among the sources: {', '.join(f.name for f in found)}")
    if not found and not optional:
        raise ConfigError(f"no {what} among the sources ({', '.join(str(p) for p in paths)})")
    return found[0] if found else None


# -- shared decoding ---------------------------------------------------------------------------


def _json(value: str, what: str):
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError) as err:
        raise RowError("bad json", f"{what}: {err}") from None


def _b64(value, what: str) -> bytes:
    if not isinstance(value, str):
        raise RowError("bad base64", f"{what} is a {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise RowError("bad base64", f"{what}: {err}") from None


def _rect(obj: dict, i: int) -> list:
    rect = obj.get("rect")
    if not (isinstance(rect, list) and len(rect) == 4 and all(isinstance(v, (int, float)) for v in rect)):
        raise RowError("bad rect", f"object {i}: rect must be [x1, y1, x2, y2], got {rect!r:.80}")
    return rect


def _class_id(obj: dict, i: int, classes: dict[str, int]) -> int:
    name = obj.get("class")
    if name not in classes:
        raise RowError("unknown class", f"object {i}: {name!r:.80} is not in the label map")
    return classes[name]


def _conf(obj: dict, i: int, key: str = "conf") -> float:
    value = obj.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
        raise RowError("bad conf", f"object {i}: {key} must be a number in [0, 1], got {value!r:.40}")
    return float(value)


def _objects(parsed, location_what: str) -> list:
    if not isinstance(parsed, list) or not parsed or not all(isinstance(o, dict) for o in parsed):
        raise RowError("no objects", f"{location_what} must be a non-empty list of objects")
    return parsed


def _skip_or(location: str, complete: bool, decode) -> ReadResult:
    result = decode_row(location, decode)
    if isinstance(result, Skipped) and not complete:
        return Skipped(location, "truncated last line", f"no newline at end of file and {result.kind}: {result.detail}")
    return result


# -- vinvl-tsv -----------------------------------------------------------------------------------


def _vinvl_attributes(rec: RegionFeatures, names: list[str], thresh: float, most: int) -> list[tuple[list, list]]:
    """Per region, the (names, scores) exported: above `thresh`, best first, at most `most`, the
    record's own best attribute always."""
    out = []
    for i in range(rec.num_boxes):
        if rec.attr_prob is not None:
            prob = rec.attr_prob[i, 1:]
            order = [int(j) for j in np.argsort(-prob, kind="stable")[:most] if prob[j] > thresh]
            best = int(rec.attrs_id[i]) if rec.attrs_id is not None else int(np.argmax(prob))
            ids = [best] + [j for j in order if j != best]
            scores = [float(rec.attrs_conf[i]) if rec.attrs_conf is not None else float(prob[best])]
            scores += [float(prob[j]) for j in ids[1:]]
        elif rec.attrs_id is not None:
            ids, scores = [int(rec.attrs_id[i])], [float(rec.attrs_conf[i])]
        else:
            ids, scores = [], []
        out.append(([names[j] for j in ids], scores))
    return out


def write_vinvl_tsv(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    manifest = ctx.manifest
    labels = labels_of(manifest, "vinvl-tsv")
    config = (manifest.provenance.get("extractor") or {}).get("config") or {}
    thresh = float(config.get("attribute_thresh", DEFAULT_ATTRIBUTE_THRESH))
    most = int(config.get("max_attributes", 16))
    dest.mkdir(parents=True, exist_ok=True)
    sizes: list[tuple[str, str]] = []

    def rows() -> Iterator[tuple[str, str]]:
        for rec in records:
            if rec.objects_id is None or rec.objects_conf is None:
                raise ConfigError(f"image {rec.image_id!r} has no objects_id / objects_conf, which vinvl-tsv requires")
            attributes = _vinvl_attributes(rec, labels.get("attributes") or [], thresh, most)
            objects = []
            for i in range(rec.num_boxes):
                obj = {
                    "rect": [float(v) for v in rec.boxes[i]],
                    "bbox_id": i,
                    "class": labels["objects"][int(rec.objects_id[i])],
                    "conf": float(rec.objects_conf[i]),
                    "feature": base64.b64encode(np.ascontiguousarray(rec.features[i], "<f4").tobytes()).decode(),
                }
                if attributes[i][0]:
                    obj["attributes"], obj["attr_scores"] = attributes[i]
                objects.append(obj)
            sizes.append((rec.image_id, json.dumps([{"height": rec.image_h, "width": rec.image_w}])))
            yield rec.image_id, json.dumps({"objects": objects, "relations": None})

    count = write_tsv(dest / "predictions.tsv", rows())
    write_tsv(dest / "predictions.hw.tsv", sizes)
    write_labelmap(dest / LABELMAP, labels)
    return count


def read_vinvl_tsv(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    tsv = _find(paths, lambda p: p.name.endswith(".tsv") and not p.name.endswith(".hw.tsv"), "predictions.tsv")
    hw = _find(paths, lambda p: p.name.endswith(".hw.tsv"), "image sizes file (predictions.hw.tsv)")
    classes, attributes = read_labelmap(_find(paths, lambda p: p.suffix == ".json", "label map (labelmap.json)"))
    sizes: dict[str, tuple[int, int]] = {}
    for location, key, value, _ in read_tsv(hw):
        try:
            entry = json.loads(value)[0] if key is not None else None
            sizes[key] = (int(entry["height"]), int(entry["width"]))
        except (TypeError, ValueError, KeyError, IndexError, json.JSONDecodeError):
            yield Skipped(location, "bad size", f"{value!r:.80} is not [{{'height': H, 'width': W}}]")
    for location, key, value, complete in read_tsv(tsv):

        def decode(key=key, value=value) -> RegionFeatures:
            if key is None:
                raise RowError("bad row", value)
            if key not in sizes:
                raise RowError("no image size", f"{key!r} is not in {hw.name}")
            parsed = _json(value, "the row")
            objects = _objects(parsed.get("objects") if isinstance(parsed, dict) else None, "objects")
            n, feats = len(objects), []
            fields: dict = {"objects_id": [], "objects_conf": [], "attrs_id": [], "attrs_conf": [], "boxes": []}
            for i, obj in enumerate(objects):
                fields["boxes"].append(_rect(obj, i))
                fields["objects_id"].append(_class_id(obj, i, classes))
                fields["objects_conf"].append(_conf(obj, i))
                feats.append(array_from_bytes(f"object {i} feature", _b64(obj.get("feature"), "feature"), "<f4", 1))
                names, scores = obj.get("attributes") or [], obj.get("attr_scores") or []
                if names:
                    if names[0] not in attributes or not scores:
                        raise RowError("unknown attribute", f"object {i}: {names[0]!r:.80} is not in the label map")
                    fields["attrs_id"].append(attributes[names[0]])
                    fields["attrs_conf"].append(_conf({"s": scores[0]}, i, "s"))
            if len({f.shape[1] for f in feats}) != 1:
                raise RowError("bad feature", "the objects' features differ in length")
            if fields["attrs_id"] and len(fields["attrs_id"]) != n:
                raise RowError("missing field", "some objects have attributes and others not")
            height, width = sizes[key]
            return RegionFeatures(
                image_id=key,
                image_h=height,
                image_w=width,
                boxes=np.asarray(fields["boxes"], np.float32),
                features=np.concatenate(feats).astype(np.float32),
                objects_id=np.asarray(fields["objects_id"], np.int64),
                objects_conf=np.asarray(fields["objects_conf"], np.float32),
                attrs_id=np.asarray(fields["attrs_id"], np.int64) if fields["attrs_id"] else None,
                attrs_conf=np.asarray(fields["attrs_conf"], np.float32) if fields["attrs_id"] else None,
            )

        yield _skip_or(location, complete, decode)


def check_vinvl(store: "FeatureStore", ctx: WriteContext) -> None:
    check_labels(store, "vinvl-tsv")


# -- oscar-tsv -----------------------------------------------------------------------------------


def write_oscar_tsv(records: Iterable[RegionFeatures], dest: Path, ctx: WriteContext) -> int:
    labels = labels_of(ctx.manifest, "oscar-tsv")
    dest.mkdir(parents=True, exist_ok=True)
    label_rows: list[tuple[str, str]] = []

    def rows() -> Iterator[tuple[str, str]]:
        for rec in records:
            if rec.objects_id is None or rec.objects_conf is None:
                raise ConfigError(f"image {rec.image_id!r} has no objects_id / objects_conf, which oscar-tsv requires")
            values = np.concatenate([rec.features.astype(np.float32), rec.spatial6()], axis=1)
            feature = base64.b64encode(np.ascontiguousarray(values, "<f4").tobytes()).decode()
            objects = [
                {
                    "class": labels["objects"][int(rec.objects_id[i])],
                    "conf": float(rec.objects_conf[i]),
                    "rect": [float(v) for v in rec.boxes[i]],
                }
                for i in range(rec.num_boxes)
            ]
            label_rows.append((rec.image_id, json.dumps(objects)))
            yield rec.image_id, json.dumps({"num_boxes": rec.num_boxes, "features": feature})

    count = write_tsv(dest / "feature.tsv", rows())
    write_tsv(dest / "label.tsv", label_rows)
    write_labelmap(dest / LABELMAP, labels)
    return count


def image_size_from_tails(boxes: np.ndarray, tails: np.ndarray) -> tuple[int, int]:
    """(H, W) of the image whose boxes give these position tails: each coordinate over its
    normalized value, rounded, the median of the boxes that show it. RowError when none does."""
    out = []
    for coords, normed, what in (
        (boxes[:, [1, 3]], tails[:, [1, 3]], "height"),
        (boxes[:, [0, 2]], tails[:, [0, 2]], "width"),
    ):
        usable = normed > 1e-3
        if not usable.any():
            raise RowError("bad position", f"no box shows the image {what} (every position tail near 0)")
        out.append(int(np.round(np.median(coords[usable] / normed[usable]))))
    if min(out) < 1:
        raise RowError("bad position", f"the position tails give an image of {out[0]} x {out[1]}")
    return out[0], out[1]


def read_oscar_tsv(paths: Sequence[Path], opts: ReadOptions) -> Iterator[ReadResult]:
    feature_tsv = _find(paths, lambda p: p.name.endswith("feature.tsv"), "feature.tsv")
    label_tsv = _find(paths, lambda p: p.name.endswith("label.tsv"), "label.tsv (the boxes and classes)")
    classes, _ = read_labelmap(_find(paths, lambda p: p.suffix == ".json", "label map (labelmap.json)"))
    labels: dict[str, str] = {}
    for location, key, value, _ in read_tsv(label_tsv):
        if key is None:
            yield Skipped(location, "bad row", value)
        else:
            labels[key] = value
    for location, key, value, complete in read_tsv(feature_tsv):

        def decode(key=key, value=value) -> RegionFeatures:
            if key is None:
                raise RowError("bad row", value)
            if key not in labels:
                raise RowError("no labels", f"{key!r} is not in {label_tsv.name}")
            info = _json(value, "the feature row")
            if not isinstance(info, dict):
                raise RowError("bad row", 'a feature row holds {"num_boxes": N, "features": base64}')
            n = info.get("num_boxes")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise RowError("bad num_boxes", f"num_boxes={n!r:.40}")
            values = array_from_bytes("features", _b64(info.get("features"), "features"), "<f4", n)
            if values.shape[1] <= POSITION_DIM:
                raise RowError(
                    "bad feature", f"rows of {values.shape[1]} values hold no feature before the 6-d position"
                )
            objects = _objects(_json(labels[key], "the label row"), "the label row")
            if len(objects) != n:
                raise RowError("num_boxes mismatch", f"{n} feature rows, {len(objects)} labels")
            boxes = np.asarray([_rect(o, i) for i, o in enumerate(objects)], np.float32)
            tails = values[:, -POSITION_DIM:]
            height, width = image_size_from_tails(boxes, tails)
            expected = box_positions(boxes, width, height, "6d")
            worst = float(np.abs(expected - tails).max())
            if worst > TAIL_TOLERANCE:
                raise RowError(
                    "position mismatch",
                    f"a position tail is {worst:.2g} from its box's at the image size {height} x {width}",
                )
            return RegionFeatures(
                image_id=key,
                image_h=height,
                image_w=width,
                boxes=boxes,
                features=np.ascontiguousarray(values[:, :-POSITION_DIM], np.float32),
                objects_id=np.asarray([_class_id(o, i, classes) for i, o in enumerate(objects)], np.int64),
                objects_conf=np.asarray([_conf(o, i) for i, o in enumerate(objects)], np.float32),
            )

        yield _skip_or(location, complete, decode)


def check_oscar(store: "FeatureStore", ctx: WriteContext) -> None:
    check_labels(store, "oscar-tsv")


def labels_described(paths: Sequence[Path], opts: ReadOptions) -> Description:
    """The label names of the label map among the sources (the imported store records them)."""
    return Description(provenance=_labelmap_provenance(paths))
