"""The ecosystem's readers read our exports as they are: the real `datasets` (Parquet + dataset
card, offline) and `webdataset` (tar shards in a torch DataLoader) libraries, meshed-memory-
transformer's HDF5 lookup and OpenVQA's / bottom-up-attention.pytorch's .npz loading (their logic,
re-implemented in a few lines from the reference code); and what an import of those formats refuses,
by name, before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from format_stores import vg_sized_store
from helpers import REPO, make_record, run_cli

from pipeline.errors import ConfigError, DataError
from pipeline.formats.card import read_card
from pipeline.formats.convert import ExportConfig, ImportConfig, run_export, run_import
from pipeline.formats.m2_hdf5 import m2_number
from pipeline.formats.wds import decode_key, encode_key
from pipeline.store import FeatureStore, write_records


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two VG-sized images (100 and 99 regions of 2048-d, float16 as stored by default)."""
    path = tmp_path_factory.mktemp("eco") / "coco_val"
    vg_sized_store(path, images=2, dtype="float16")
    return path


def export(fmt, store, dest, *options):
    return run_export(ExportConfig(fmt, store, dest, options=tuple(options)))


def import_(fmt, sources, dest, **kw):
    return run_import(ImportConfig(fmt, tuple(sources), dest, **kw))


def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


# -- Hugging Face datasets ------------------------------------------------------------------------


def test_datasets_loads_the_export_folder_and_its_parquet_files(store, tmp_path, monkeypatch):
    """`load_dataset(folder)` follows the card's configs, `load_dataset("parquet", ...)` the files;
    both give the store's values, with the features the card declares."""
    offline(monkeypatch, tmp_path)
    import datasets

    export("hf-dataset", store, tmp_path / "hf", "shard-bytes=1MB")
    files = sorted((tmp_path / "hf" / "data").glob("*.parquet"))
    assert [f.name for f in files] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    card = read_card(tmp_path / "hf" / "README.md")
    assert card.metadata["configs"][0]["data_files"] == [{"split": "train", "path": "data/train-*"}]
    assert card.metadata["license"] == "cc-by-4.0"  # data_manifests/datasets/coco.yaml: the annotations'
    assert card.metadata["size_categories"] == ["n<1K"]
    assert "| weights sha256 | " + "ab" * 32 in card.body and "butd boxes=10-100" in card.body

    original = FeatureStore.open(store)
    for loaded in (
        datasets.load_dataset(str(tmp_path / "hf"), split="train", cache_dir=str(tmp_path / "c1")),
        datasets.load_dataset(
            "parquet", data_files=[str(f) for f in files], split="train", cache_dir=str(tmp_path / "c2")
        ),
    ):
        assert loaded.num_rows == 2
        assert loaded.features["features"] == datasets.List(datasets.List(datasets.Value("float16"), length=2048))
        assert loaded.features["cls_prob"] == datasets.List(datasets.List(datasets.Value("float16"), length=1601))
        table = loaded.with_format("arrow")[:]
        for i, rec in enumerate(original):
            assert table["image_id"][i].as_py() == rec.image_id
            got = np.array(table["features"][i].values.flatten().to_numpy(), np.float16).reshape(rec.features.shape)
            assert np.array_equal(got, rec.features)
            boxes = np.asarray(table["boxes"][i].as_py(), np.float32)
            assert np.array_equal(boxes, rec.boxes)
            assert table["objects_id"][i].as_py() == rec.objects_id.tolist()


@pytest.mark.parametrize(
    "fmt, options",
    [
        ("hf-dataset", ()),
        ("hf-dataset", ("arrays=list", "compression=zstd", "split=validation")),
        ("webdataset", ()),
        ("m2-hdf5", ("dtype=store",)),
    ],
)
def test_an_export_imports_back_as_the_store_it_was(tmp_path, fmt, options):
    """No layout flag given: the import takes the export's (float16, top-k tables, LMDB, its
    provenance), and every record comes back bit for bit."""
    rng = np.random.default_rng(8)
    records = [make_record(rng, f"COCO_val2014_{i:012d}", num_boxes=i + 1, feature_dim=32) for i in range(5)]
    provenance = {"detector": "vg-r101", "weights_sha256": "cd" * 32, "box_policy": "butd boxes=10-100"}
    write_records(
        tmp_path / "s", records, feature_dim=32, backend="lmdb", cls_prob="topk:3", provenance=provenance
    )  # fmt: skip
    export(fmt, tmp_path / "s", tmp_path / "out", *options)
    import_(fmt, [tmp_path / "out"], tmp_path / "back")
    original, back = FeatureStore.open(tmp_path / "s"), FeatureStore.open(tmp_path / "back")
    assert back.layout == original.layout
    assert {k: back.manifest.provenance.get(k) for k in provenance} == provenance
    assert back.manifest.provenance["source_format"] == fmt
    for rec in original:
        got = back.get(rec.image_id)
        for name, value in rec.array_fields().items():
            assert getattr(got, name).dtype == value.dtype and np.array_equal(getattr(got, name), value), name


def test_the_card_is_checked_against_the_data(store, tmp_path):
    export("hf-dataset", store, tmp_path / "hf")
    card = tmp_path / "hf" / "README.md"
    text = card.read_text()
    card.write_text(text.replace("records: 2", "records: 3"))
    with pytest.raises(DataError, match="the dataset card disagrees with the data: records is 3 in the card, 2 in"):
        import_("hf-dataset", [tmp_path / "hf"], tmp_path / "s1")
    card.write_text(text.replace("length: 2048", "length: 1024"))
    with pytest.raises(DataError, match="dataset_info features"):
        import_("hf-dataset", [tmp_path / "hf"], tmp_path / "s2")
    card.write_text(text)
    extra = tmp_path / "hf" / "data" / "extra.parquet"
    pq.write_table(pq.read_table(next((tmp_path / "hf" / "data").glob("train-*"))), extra)
    proc = run_cli("import", "--from", "hf-dataset", tmp_path / "hf", tmp_path / "s3")
    assert proc.returncode == 3 and "the data files is" in proc.stderr, proc.stderr
    assert not any((tmp_path / name).exists() for name in ("s1", "s2", "s3"))  # nothing written


def test_a_truncated_or_foreign_parquet_file_is_refused_before_anything_is_written(store, tmp_path):
    export("hf-dataset", store, tmp_path / "hf")
    shard = next((tmp_path / "hf" / "data").glob("*.parquet"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    proc = run_cli("import", "--from", "hf-dataset", tmp_path / "hf", tmp_path / "s")
    assert proc.returncode == 3 and "truncated" in proc.stderr, proc.stderr
    shard.unlink()
    (tmp_path / "hf" / "README.md").unlink()
    pq.write_table(pa.table({"image_id": ["a"], "caption": ["a cat"]}), tmp_path / "hf" / "data" / "captions.parquet")
    proc = run_cli("import", "--from", "hf-dataset", tmp_path / "hf" / "data" / "captions.parquet", tmp_path / "s")
    assert proc.returncode == 2 and "needs a column 'image_h'" in proc.stderr, proc.stderr
    assert not (tmp_path / "s").exists()


def _rows(path: Path, **change) -> None:
    """A one-file hf-dataset (no card) of two records, `change` applied to the second's columns."""
    rng = np.random.default_rng(1)
    records = [make_record(rng, f"img{i}", num_boxes=3, feature_dim=8, cls_dim=None, attr_dim=None) for i in range(2)]
    write_records(path.parent / "src", records, feature_dim=8, dtype="float32")
    export("hf-dataset", path.parent / "src", path.parent / "hf")
    table = pq.read_table(next((path.parent / "hf" / "data").glob("*.parquet")))
    for name, value in change.items():
        column = table.column(name).to_pylist()
        column[1] = value(column[1])
        table = table.set_column(
            table.schema.get_field_index(name), name, pa.array(column, table.schema.field(name).type)
        )
    pq.write_table(table, path)


def test_bad_rows_are_named_skips_without_a_card_and_damage_with_one(tmp_path):
    """Without its card a foreign Parquet file's bad rows are skipped by name (a non-finite number,
    an id twice); with our card vouching for every row, the same is damage (exit 3) and the new
    store is removed again."""
    nan = lambda rows: [[float("nan")] + r[1:] for r in rows]  # noqa: E731
    _rows(tmp_path / "nan.parquet", features=nan)
    report = import_("hf-dataset", [tmp_path / "nan.parquet"], tmp_path / "a", allow_skips=True)
    assert (report.imported, dict(report.skipped_by_kind)) == (1, {"invalid record": 1})
    assert "NaN" in report.skipped_rows[0] and report.skipped_rows[0].startswith("nan.parquet:row 1: ")
    (tmp_path / "d").mkdir()
    _rows(tmp_path / "d" / "twice.parquet", image_id=lambda _: "img0")
    report = import_("hf-dataset", [tmp_path / "d" / "twice.parquet"], tmp_path / "b", allow_skips=True)
    assert dict(report.skipped_by_kind) == {"duplicate id": 1}
    # the same damage in a carded export: refused whole, nothing left behind
    export("hf-dataset", tmp_path / "src", tmp_path / "carded")
    shard = next((tmp_path / "carded" / "data").glob("*.parquet"))
    table = pq.read_table(shard)
    ids = table.column("image_id").to_pylist()
    table = table.set_column(0, "image_id", pa.array([ids[0], ids[0]], pa.string()))
    pq.write_table(table, shard)
    card = tmp_path / "carded" / "README.md"
    text = card.read_text()
    for entry in read_card(card).vlprep["files"]:
        text = text.replace(f"bytes: {entry['bytes']}", f"bytes: {shard.stat().st_size}")
    card.write_text(text)
    proc = run_cli("import", "--from", "hf-dataset", tmp_path / "carded", tmp_path / "c")
    assert proc.returncode == 3 and "duplicate id" in proc.stderr and "nothing imported" in proc.stderr, proc.stderr
    assert not (tmp_path / "c").exists()


# -- WebDataset -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image_id",
    ["COCO_val2014_000000000042", "a.b/c", "_x", "__key__", "50%", "ünïcode id", "x.jpg.npz", "-", "%2E"],
)
def test_keys_are_safe_for_webdataset_and_reversible(image_id):
    key = encode_key(image_id)
    assert "." not in key and "/" not in key and not key.startswith("_") and decode_key(key) == image_id
    if image_id.startswith("COCO"):
        assert key == image_id  # plain ids stay as they are


def test_webdataset_reads_the_shards_in_a_dataloader(store, tmp_path):
    import torch
    import webdataset as wds

    rng = np.random.default_rng(4)
    ids = ["COCO_val2014_000000000001", "a.b/c.jpg", "_odd id", "üñí"]
    records = [make_record(rng, i, num_boxes=5, feature_dim=16, cls_dim=11, attr_dim=None) for i in ids]
    write_records(tmp_path / "s", records, feature_dim=16)
    export("webdataset", tmp_path / "s", tmp_path / "wds", "shard-bytes=20KB")
    shards = sorted(str(p) for p in (tmp_path / "wds").glob("*.tar"))
    assert len(shards) == 2 and (tmp_path / "wds" / "README.md").is_file()
    dataset = (
        wds.WebDataset(shards, shardshuffle=False, empty_check=False)
        .decode()
        .to_tuple("__key__", "json", "features.npy", "boxes.npy", "cls_prob.npy")
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    got = {decode_key(key): (meta, feats, boxes, cls) for key, meta, feats, boxes, cls in loader}
    stored = FeatureStore.open(tmp_path / "s")
    assert sorted(got) == sorted(ids)
    for rec in stored:
        meta, feats, boxes, cls = got[rec.image_id]
        assert meta == {"image_id": rec.image_id, "image_h": 480, "image_w": 640, "num_boxes": 5}
        feats, boxes, cls = (np.asarray(t) for t in (feats, boxes, cls))  # the DataLoader made them tensors
        assert feats.dtype == np.float16 and np.array_equal(feats, rec.features)
        assert np.array_equal(boxes, rec.boxes) and np.array_equal(cls, rec.cls_prob)


def test_datasets_reads_the_webdataset_export(store, tmp_path, monkeypatch):
    offline(monkeypatch, tmp_path)
    import datasets

    export("webdataset", store, tmp_path / "wds")
    loaded = datasets.load_dataset(str(tmp_path / "wds"), split="train", cache_dir=str(tmp_path / "c"))
    assert loaded.num_rows == 2 and set(loaded.column_names) >= {"json", "features.npy", "boxes.npy"}
    assert [row["image_id"] for row in loaded["json"]] == list(FeatureStore.open(store).ids())


def test_a_truncated_or_mislabelled_shard_is_named(store, tmp_path):
    export("webdataset", store, tmp_path / "wds", "shard-bytes=1MB")
    shard = sorted((tmp_path / "wds").glob("*.tar"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2 // 512 * 512])  # whole blocks, but no end-of-archive
    proc = run_cli("import", "--from", "webdataset", tmp_path / "wds", tmp_path / "s")
    assert proc.returncode == 3 and "truncated" in proc.stderr and shard.name in proc.stderr, proc.stderr
    assert not (tmp_path / "s").exists()
    # a foreign tar: a sample whose key and JSON disagree, and one holding a pickled array
    with tarfile.open(tmp_path / "foreign.tar", "w") as tar:
        for name, payload in (
            ("k1.json", json.dumps({"image_id": "other", "image_h": 10, "image_w": 10}).encode()),
            ("k1.boxes.npy", _npy(np.zeros((1, 4), np.float32))),
            ("k1.features.npy", _npy(np.zeros((1, 3), np.float32))),
            ("k2.json", json.dumps({"image_h": 10, "image_w": 10}).encode()),
            ("k2.boxes.npy", _npy(np.zeros((1, 4), np.float32))),
            ("k2.features.npy", _npy(np.array([{"evil": 1}], dtype=object), allow_pickle=True)),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, __import__("io").BytesIO(payload))
    report = import_("webdataset", [tmp_path / "foreign.tar"], tmp_path / "f", allow_skips=True, feature_dim=3)
    assert dict(report.skipped_by_kind) == {"key mismatch": 1, "bad npy": 1}


def _npy(array, allow_pickle=False) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


# -- meshed-memory-transformer and OpenVQA --------------------------------------------------------


def m2_preprocess(detections_path: Path, x: str, max_detections: int = 50) -> np.ndarray:
    """meshed-memory-transformer's ImageDetectionsField.preprocess (data/field.py), its lookup and
    padding: the image id from the file name, `<id>_features` read whole, padded or cut."""
    import h5py

    image_id = int(x.split("_")[-1].split(".")[0])
    with h5py.File(detections_path, "r") as f:
        precomp = f["%d_features" % image_id][()]
        order = np.argsort(np.max(f["%d_cls_prob" % image_id][()], -1))[::-1]  # its sort_by_prob
        assert len(order) == len(precomp)
    delta = max_detections - precomp.shape[0]
    if delta > 0:
        precomp = np.concatenate([precomp, np.zeros((delta, precomp.shape[1]))], axis=0)
    return precomp[:max_detections].astype(np.float32)


def test_meshed_memory_transformer_finds_the_images_by_number(store, tmp_path):
    assert export("m2-hdf5", store, tmp_path / "coco_detections.hdf5") == 2
    for rec in FeatureStore.open(store, dtype="float32"):
        got = m2_preprocess(tmp_path / "coco_detections.hdf5", rec.image_id + ".jpg")
        assert np.array_equal(got[: min(50, rec.num_boxes)], rec.features[:50])
    assert m2_number("COCO_val2014_000000000042.jpg") == 42 and m2_number("cc3m-val-00000001") is None


def test_m2s_own_file_needs_image_sizes_and_ids_that_give_numbers(tmp_path):
    """A file as m2 publishes it (no size attributes): its images are skipped by name without
    --option sizes, imported with it; a store whose ids give no distinct numbers exports keys=m2 only
    by refusing, before anything is written."""
    import h5py

    rng = np.random.default_rng(2)
    with h5py.File(tmp_path / "m2.hdf5", "w") as f:
        for number in (9, 25):
            f.create_dataset(f"{number}_features", data=rng.random((4, 6)).astype(np.float32))
            f.create_dataset(f"{number}_boxes", data=np.array([[0, 0, 10, 20]] * 4, np.float32))
            prob = rng.random((4, 11)).astype(np.float32)
            f.create_dataset(f"{number}_cls_prob", data=prob / prob.sum(1, keepdims=True))
    report = import_("m2-hdf5", [tmp_path / "m2.hdf5"], tmp_path / "a", feature_dim=6, allow_skips=True)
    assert dict(report.skipped_by_kind) == {"no image size": 2}
    (tmp_path / "sizes.json").write_text(json.dumps({"9": [480, 640], "25": [100, 100]}))
    options = (f"sizes={tmp_path / 'sizes.json'}",)
    report = import_("m2-hdf5", [tmp_path / "m2.hdf5"], tmp_path / "b", feature_dim=6, options=options)
    back = FeatureStore.open(tmp_path / "b")
    assert report.imported == 2 and sorted(back.ids()) == ["25", "9"]
    assert back.get("9").objects_id is not None and (back.get("9").image_h, back.get("9").image_w) == (480, 640)

    write_records(tmp_path / "s", [make_record(rng, i, feature_dim=6) for i in ("x_1", "y_01")], feature_dim=6)
    with pytest.raises(ConfigError, match="'x_1' and 'y_01' give 1.*--option keys=id"):
        export("m2-hdf5", tmp_path / "s", tmp_path / "out.hdf5", "keys=m2")
    assert not (tmp_path / "out.hdf5").exists()
    export("m2-hdf5", tmp_path / "s", tmp_path / "out.hdf5")  # auto: the ids themselves
    with h5py.File(tmp_path / "out.hdf5") as f:
        assert "x_1_features" in f and f["x_1_features"].attrs["image_id"] == "x_1"


def test_not_hdf5_or_truncated_hdf5_is_refused(store, tmp_path):
    (tmp_path / "bad.hdf5").write_bytes(b"\x89HDF not really" * 10)
    proc = run_cli("import", "--from", "m2-hdf5", tmp_path / "bad.hdf5", tmp_path / "s")
    assert proc.returncode == 2 and "not an HDF5 file" in proc.stderr, proc.stderr
    export("m2-hdf5", store, tmp_path / "good.hdf5")
    data = (tmp_path / "good.hdf5").read_bytes()
    (tmp_path / "cut.hdf5").write_bytes(data[: len(data) // 2])
    proc = run_cli("import", "--from", "m2-hdf5", tmp_path / "cut.hdf5", tmp_path / "s")
    assert proc.returncode == 3 and "truncated" in proc.stderr, proc.stderr
    assert not (tmp_path / "s").exists()


def openvqa_load_img_feats(path: Path, pad: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """OpenVQA's VQA loader (openvqa/datasets/vqa/vqa_loader.py load_img_feats): x transposed, boxes
    normalized by the image size, both zero-padded."""
    frcn = np.load(path)
    x = frcn["x"].transpose((1, 0))
    bbox = frcn["bbox"]
    h, w = frcn["image_h"], frcn["image_w"]
    norm = np.stack([bbox[:, 0] / float(w), bbox[:, 1] / float(h), bbox[:, 2] / float(w), bbox[:, 3] / float(h)], 1)
    return (np.pad(x, ((0, pad - x.shape[0]), (0, 0))), np.pad(norm, ((0, pad - len(norm)), (0, 0))))


def test_openvqa_and_bottom_up_attention_pytorch_read_the_npz_files(store, tmp_path):
    export("butd-npz", store, tmp_path / "openvqa", "x-layout=columns")
    export("butd-npz", store, tmp_path / "bua")
    for rec in FeatureStore.open(store, dtype="float32"):
        x, boxes = openvqa_load_img_feats(tmp_path / "openvqa" / f"{rec.image_id}.npz")
        assert np.array_equal(x[: rec.num_boxes], rec.features) and not x[rec.num_boxes :].any()
        assert np.allclose(boxes[: rec.num_boxes], rec.normalized_boxes())
        plain = np.load(tmp_path / "bua" / f"{rec.image_id}.npz")  # what bua.pytorch wrote: x (N, 2048)
        assert plain["x"].shape == (rec.num_boxes, 2048) and int(plain["num_bbox"]) == rec.num_boxes
    # both orientations import back alike (x's orientation read off its shape)
    for folder in ("openvqa", "bua"):
        import_("butd-npz", [tmp_path / folder], tmp_path / f"back-{folder}", dtype="float16")
        back = FeatureStore.open(tmp_path / f"back-{folder}")
        for rec in FeatureStore.open(store):
            assert np.array_equal(back.get(rec.image_id).features, rec.features)


def test_a_bottom_up_attention_pytorch_file_with_its_pickled_info(tmp_path):
    """save_roi_features' own file: labels in a pickled `info` dict, read only with --trust-pickle;
    a square x (N = D) is ambiguous and named; a truncated file is skipped by name."""
    rng = np.random.default_rng(5)
    folder = tmp_path / "features"
    folder.mkdir()
    info = {"image_id": "img", "image_h": 50, "image_w": 60, "num_boxes": 3}
    info.update(objects_id=np.array([1, 2, 3]), objects_conf=np.array([0.5, 0.25, 0.75], np.float32))
    boxes = np.array([[0, 0, 10, 10], [5, 5, 20, 30], [1, 2, 3, 4]], np.float32)
    np.savez_compressed(folder / "img", x=rng.random((3, 8), np.float32), bbox=boxes, num_bbox=3, image_h=50,
                        image_w=60, info=info)  # fmt: skip
    np.savez_compressed(folder / "square", x=rng.random((3, 3), np.float32), bbox=boxes, num_bbox=3, image_h=50,
                        image_w=60)  # fmt: skip
    data = (folder / "img.npz").read_bytes()
    (folder / "cut.npz").write_bytes(data[: len(data) // 2])
    report = import_("butd-npz", [folder], tmp_path / "a", feature_dim=8, allow_skips=True)
    assert report.imported == 1 and dict(report.skipped_by_kind) == {"ambiguous x": 1, "bad npz": 1}
    assert FeatureStore.open(tmp_path / "a").get("img").objects_id is None  # the pickle was not read
    report = import_("butd-npz", [folder], tmp_path / "b", feature_dim=8, allow_skips=True, trust_pickle=True)
    got = FeatureStore.open(tmp_path / "b").get("img")
    assert got.objects_id.tolist() == [1, 2, 3] and got.objects_conf.tolist() == [0.5, 0.25, 0.75]


# -- the dataset card -----------------------------------------------------------------------------


def test_inspect_card_prints_the_card_every_folder_export_carries(store, tmp_path):
    proc = run_cli("inspect", "--card", store, check=True)
    card = proc.stdout
    assert card.startswith("---\npretty_name: 'coco_val: region features (vg-r101)'\nlicense: cc-by-4.0\n")
    assert "vlprep:\n  card: 1\n  format: vlprep-feature-store\n" in card
    for shown in ("| detector | vg-r101 |", "| preprocessing | caffe |", "199 regions: 99–100 per image"):
        assert shown in card
    export("mmf-npy", store, tmp_path / "mmf")
    carried = (tmp_path / "mmf" / "README.md").read_text()
    assert (
        carried.split("## How it was made")[0]
        .replace("format: mmf-npy", "format: vlprep-feature-store")
        .replace("This folder holds them in the `mmf-npy` format (`vlprep formats` lists the formats).\n", "")
        == card.split("## How it was made")[0]
    )


# -- streaming ------------------------------------------------------------------------------------

# In a fresh process: import the export's first shard (what an import costs whatever its size: the
# modules, the writer's buffers, the allocator's arenas), then the whole export; the peak RSS may grow
# by far less than the data.
MEASURE = """
import json, resource, sys
from pathlib import Path
from pipeline.formats.convert import ImportConfig, run_import
fmt, folder, first, dest = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
run_import(ImportConfig(fmt, (first,), dest.with_name("first"), shard_size=16))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run_import(ImportConfig(fmt, (folder,), dest, shard_size=16))
print(json.dumps({"before_mb": before / 1024, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


@pytest.fixture(scope="module")
def big_store(tmp_path_factory):
    """48 MB of float16 features: 192 images of 64 regions x 2048, written in a second."""
    from pipeline.records import RegionFeatures

    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("big") / "store"
    boxes = np.tile(np.array([[1, 2, 30, 40]], np.float32), (64, 1))
    features = rng.standard_normal((64, 2048)).astype(np.float16)
    records = (RegionFeatures(f"img{i:05d}", 100, 100, boxes, np.roll(features, i, axis=0)) for i in range(192))
    write_records(path, records, shard_size=128, cls_prob="none", attr_prob="none")
    return path


@pytest.mark.parametrize(
    "fmt, options, first",
    [
        ("hf-dataset", ("row-group-bytes=2MB", "shard-bytes=6MB", "compression=none"), "data/train-00000-of-*.parquet"),
        ("webdataset", ("shard-bytes=6MB",), "train-000000.tar"),
    ],
)
def test_imports_stream_in_bounded_memory(big_store, tmp_path, fmt, options, first):
    """A 48 MB export imports with the memory its first 6 MB shard needed, give or take 16 MB."""
    export(fmt, big_store, tmp_path / "export", *options)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [fmt, tmp_path / "export", next((tmp_path / "export").glob(first)), tmp_path / "back"]
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *map(str, args)], capture_output=True, text=True, check=True, env=env, cwd=REPO
    )
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["peak_mb"] - measured["before_mb"] < 16, measured
    assert len(FeatureStore.open(tmp_path / "back")) == 192
