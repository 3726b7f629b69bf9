"""The formats of the newer extractors' codebases: VinVL's predictions.tsv, Oscar's feature.tsv +
label.tsv (each with its .lineidx) and grid-feats-vqa's per-image .pth maps. Round trips are exact;
what a file says is checked, not trusted (a 2054-d row's position tail against its box, a map's
size against its image's)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import make_record

from pipeline.detect.backends import open_extractor, resolve
from pipeline.detect.config import GridPool
from pipeline.errors import ConfigError
from pipeline.formats.convert import ExportConfig, ImportConfig, run_export, run_import
from pipeline.records import grid_shape
from pipeline.store import FeatureStore, write_records

OBJECTS = [f"object{i}" for i in range(10)]
ATTRIBUTES = [f"attr{i}" for i in range(6)]
LABELS = {"file": "labelmap.json", "objects": OBJECTS, "attributes": ATTRIBUTES}


def detection_store(path: Path, labels: dict | None = LABELS) -> FeatureStore:
    rng = np.random.default_rng(5)
    records = [
        make_record(
            rng, f"COCO_val2014_{i:012d}", num_boxes=int(rng.integers(1, 9)), feature_dim=24, cls_dim=11, attr_dim=7
        )
        for i in range(4)
    ]
    provenance = {"detector": "vinvl-tiny", "labels": labels} if labels else {"detector": "vinvl-tiny"}
    return write_records(path, records, feature_dim=24, dtype="float32", provenance=provenance)


def export(fmt: str, store: Path, dest: Path) -> int:
    return run_export(ExportConfig(fmt=fmt, store=store, dest=dest))


def import_(fmt: str, sources, dest: Path, **kw):
    cfg = ImportConfig(fmt=fmt, sources=tuple(sources), dest=dest, dtype="float32", **kw)
    return run_import(cfg)


def lineidx_matches(tsv: Path) -> None:
    """Each .lineidx offset seeks to the start of its row (bytes)."""
    offsets = [int(line) for line in tsv.with_suffix(".lineidx").read_text().splitlines()]
    data = tsv.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == ord("\n")][:-1]
    assert offsets == starts


@pytest.mark.parametrize(
    "fmt,files", [("vinvl-tsv", ("predictions.tsv", "predictions.hw.tsv")), ("oscar-tsv", ("feature.tsv", "label.tsv"))]
)
def test_vinvl_and_oscar_round_trips_are_exact(tmp_path, fmt, files):
    store = detection_store(tmp_path / "store")
    assert export(fmt, tmp_path / "store", tmp_path / "out") == 4
    for name in files:
        lineidx_matches(tmp_path / "out" / name)
    labelmap = json.loads((tmp_path / "out" / "labelmap.json").read_text())
    assert labelmap["label_to_idx"]["object0"] == 1 and labelmap["attribute_to_idx"]["attr5"] == 6
    report = import_(fmt, [tmp_path / "out"], tmp_path / "back", feature_dim=24)
    assert (report.imported, report.skipped) == (4, 0)
    back = FeatureStore.open(tmp_path / "back")
    assert back.manifest.provenance["labels"]["objects"] == OBJECTS
    for rec in store:
        got = back.get(rec.image_id)
        assert (got.image_h, got.image_w) == (rec.image_h, rec.image_w)
        for field in ("boxes", "features", "objects_id", "objects_conf"):
            assert np.array_equal(getattr(got, field), getattr(rec, field)), field
        if fmt == "vinvl-tsv":  # the best attribute comes back; Oscar's files hold none
            assert np.array_equal(got.attrs_id, rec.attrs_id) and np.array_equal(got.attrs_conf, rec.attrs_conf)


def test_a_vinvl_row_is_laid_out_as_scene_graph_benchmark_writes_it(tmp_path):
    store = detection_store(tmp_path / "store")
    export("vinvl-tsv", tmp_path / "store", tmp_path / "out")
    key, value = (tmp_path / "out" / "predictions.tsv").read_text().splitlines()[0].split("\t")
    rec = store.get(key)
    row = json.loads(value)
    assert row["relations"] is None and len(row["objects"]) == rec.num_boxes
    obj = row["objects"][0]
    assert list(obj)[:5] == ["rect", "bbox_id", "class", "conf", "feature"]  # TSV_SAVE_SUBSET's order
    assert obj["class"] == OBJECTS[rec.objects_id[0]] and obj["bbox_id"] == 0
    feature = np.frombuffer(base64.b64decode(obj["feature"]), np.float32)
    assert np.array_equal(feature, rec.features[0])
    assert obj["attributes"][0] == ATTRIBUTES[rec.attrs_id[0]] and obj["attr_scores"][0] == pytest.approx(
        rec.attrs_conf[0]
    )
    hw = (tmp_path / "out" / "predictions.hw.tsv").read_text().splitlines()[0].split("\t")
    assert json.loads(hw[1]) == [{"height": rec.image_h, "width": rec.image_w}]


def test_an_oscar_row_is_features_then_the_6d_position(tmp_path):
    store = detection_store(tmp_path / "store")
    export("oscar-tsv", tmp_path / "store", tmp_path / "out")
    key, value = (tmp_path / "out" / "feature.tsv").read_text().splitlines()[0].split("\t")
    rec, info = store.get(key), json.loads(value)
    rows = np.frombuffer(base64.b64decode(info["features"]), np.float32).reshape(info["num_boxes"], -1)
    assert rows.shape == (rec.num_boxes, 24 + 6)
    assert np.array_equal(rows[:, :24], rec.features) and np.array_equal(rows[:, 24:], rec.spatial6())
    w, h = rec.image_w, rec.image_h
    x1, y1, x2, y2 = rec.boxes[0]
    assert rows[0, 24:] == pytest.approx([x1 / w, y1 / h, x2 / w, y2 / h, (x2 - x1) / w, (y2 - y1) / h], rel=1e-6)


def test_a_position_tail_that_disagrees_with_its_box_is_skipped_by_name(tmp_path):
    detection_store(tmp_path / "store")
    export("oscar-tsv", tmp_path / "store", tmp_path / "out")
    lines = (tmp_path / "out" / "feature.tsv").read_text().splitlines()
    key, value = lines[1].split("\t")
    info = json.loads(value)
    rows = np.frombuffer(base64.b64decode(info["features"]), np.float32).reshape(info["num_boxes"], -1).copy()
    rows[0, -1] *= 1.5  # h/H no longer the box's
    info["features"] = base64.b64encode(rows.tobytes()).decode()
    lines[1] = f"{key}\t{json.dumps(info)}"
    lines.append("COCO_val2014_999999999999\t" + json.dumps({"num_boxes": 1, "features": "AAAA"}))
    (tmp_path / "out" / "feature.tsv").write_text("\n".join(lines) + "\n")
    report = import_("oscar-tsv", [tmp_path / "out"], tmp_path / "back", feature_dim=24, allow_skips=True)
    assert report.imported == 3 and dict(report.skipped_by_kind) == {"position mismatch": 1, "no labels": 1}
    assert any("feature.tsv:2: position mismatch" in line for line in report.skipped_rows)


def test_vinvl_rows_with_unknown_classes_or_sizes_are_skipped_by_name(tmp_path):
    detection_store(tmp_path / "store")
    export("vinvl-tsv", tmp_path / "store", tmp_path / "out")
    path = tmp_path / "out" / "predictions.tsv"
    lines = path.read_text().splitlines()
    key, value = lines[0].split("\t")
    renamed = value.replace('"class": "object', '"class": "thing', 1)
    lines[0] = f"{key}\t{renamed}"
    lines.append("unsized\t" + json.dumps({"objects": [{"rect": [0, 0, 1, 1]}]}))
    lines.append("COCO_val2014_000000000001\tnot json")
    path.write_text("\n".join(lines))  # no final newline: the last row is truncated
    report = import_("vinvl-tsv", [tmp_path / "out"], tmp_path / "back", feature_dim=24, allow_skips=True)
    assert report.imported == 3
    assert dict(report.skipped_by_kind) == {"unknown class": 1, "no image size": 1, "truncated last line": 1}


def test_formats_that_name_classes_need_a_store_with_label_names(tmp_path):
    detection_store(tmp_path / "store", labels=None)
    for fmt in ("vinvl-tsv", "oscar-tsv"):
        with pytest.raises(ConfigError, match="records no label names: extract it with --labelmap"):
            export(fmt, tmp_path / "store", tmp_path / fmt)
        assert not (tmp_path / fmt).exists()
    with pytest.raises(ConfigError, match="grid-pth holds feature maps, and this store holds a detector's regions"):
        export("grid-pth", tmp_path / "store", tmp_path / "grid")


@pytest.fixture(scope="module")
def grid_stores(tmp_path_factory):
    """Two grid stores of grid-tiny (random weights) over three images: whole maps, and 2x3 pools."""
    root = tmp_path_factory.mktemp("grids")
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size, dtype=np.uint8) for size in ((120, 200, 3), (233, 151, 3), (90, 90, 3))]
    detector = resolve("grid-tiny")
    out = {}
    for name, pool in (("whole", None), ("pooled", GridPool(2, 3))):
        extractor = open_extractor("grid-tiny", seed=0, grid_pool=pool)
        records = extractor(images, [f"im{i}" for i in range(3)])
        provenance = {"detector": "grid-tiny", "extractor": detector.to_json()}
        config = {"grid_pool": pool and str(pool)}  # the run's config, as vlprep extract records it
        write_records(
            root / name, records, feature_dim=128, dtype="float32", provenance=provenance, config=config, regions="grid"
        )
        out[name] = (root / name, extractor, images)
    return out


@pytest.mark.parametrize("kind", ["whole", "pooled"])
def test_grid_maps_round_trip_exactly(grid_stores, tmp_path, kind):
    path, extractor, images = grid_stores[kind]
    assert export("grid-pth", path, tmp_path / "maps") == 3
    sizes = json.loads((tmp_path / "maps" / "grid_sizes.json").read_text())
    assert (sizes["min_size"], sizes["max_size"], sizes["stride"]) == (160, 256, 32)
    store = FeatureStore.open(path)
    for i, rgb in enumerate(images):
        saved = torch.load(tmp_path / "maps" / f"im{i}.pth", weights_only=True)
        rows, cols = grid_shape(store.get(f"im{i}").boxes)
        assert saved.dtype == torch.float32 and list(saved.shape) == [1, 128, rows, cols]
        if kind == "whole":  # grid-feats-vqa's file: the C5 map itself
            assert torch.equal(saved, extractor.grid(rgb)[0])
    report = import_("grid-pth", [tmp_path / "maps"], tmp_path / "back", feature_dim=128)
    assert (report.imported, report.skipped) == (3, 0)
    back = FeatureStore.open(tmp_path / "back")
    assert back.layout.regions == "grid"
    assert back.manifest.provenance["max_regions"] == (6 if kind == "pooled" else 5 * 8)
    for rec in store:
        got = back.get(rec.image_id)
        assert (got.image_h, got.image_w) == (rec.image_h, rec.image_w)
        assert np.array_equal(got.boxes, rec.boxes) and np.array_equal(got.features, rec.features)


def test_a_foreign_grid_folder_is_boxed_by_its_images_sizes(tmp_path):
    """grid-feats-vqa's own output: .pth files and a sizes file the user writes (images alone;
    600 / 1000 / 32 by default). A map of the wrong size for its image is skipped by name, never
    re-boxed by guess; a file that is not a tensor, or not loadable with weights only, likewise."""
    folder = tmp_path / "features"
    folder.mkdir()
    torch.save(torch.rand(1, 16, 19, 25), folder / "480x640.pth")  # 600 x 800: 19 x 25 cells
    torch.save(torch.rand(1, 16, 19, 24), folder / "wrong.pth")
    torch.save({"not": "a tensor"}, folder / "dict.pth")

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save(Evil(), folder / "evil.pth")
    (folder / "grid_sizes.json").write_text(
        json.dumps({"images": {"480x640": [480, 640], "wrong": [480, 640], "dict": [10, 10], "evil": [10, 10]}})
    )
    report = import_("grid-pth", [folder], tmp_path / "store", feature_dim=16, allow_skips=True)
    assert report.imported == 1
    assert dict(report.skipped_by_kind) == {"map size mismatch": 1, "not a map": 1, "unreadable": 1}
    rec = FeatureStore.open(tmp_path / "store").get("480x640")
    assert rec.num_boxes == 19 * 25 and grid_shape(rec.boxes) == (19, 25)
    assert rec.boxes[-1].tolist() == pytest.approx([24 * 32 * 0.8, 18 * 32 * 0.8, 640, 480])


def test_a_grid_folder_without_sizes_is_refused_before_any_work(tmp_path):
    (tmp_path / "f").mkdir()
    torch.save(torch.rand(1, 4, 2, 2), tmp_path / "f" / "a.pth")
    with pytest.raises(ConfigError, match="grid-pth needs one grid_sizes.json"):
        import_("grid-pth", [tmp_path / "f"], tmp_path / "store", feature_dim=4)
    assert not (tmp_path / "store").exists()
