"""Legacy feature files written the way the reference extractors write them, and read
the way the reference loaders read them (from the published field specs)."""

from __future__ import annotations

import base64
import csv
import os
import pickle
import sys
from pathlib import Path

import lmdb
import numpy as np

from pipeline.records import RegionFeatures

LXMERT_FIELDNAMES = [
    "img_id",
    "img_h",
    "img_w",
    "objects_id",
    "objects_conf",
    "attrs_id",
    "attrs_conf",
    "num_boxes",
    "boxes",
    "features",
]
BUTD_FIELDNAMES = ["image_id", "image_w", "image_h", "num_boxes", "boxes", "features"]


def _b64(arr, dtype) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype)).decode()


def write_lxmert_tsv(path: Path, records: list[RegionFeatures]) -> None:
    """As airsplay/lxmert's extract scripts: csv.DictWriter, tab, no header."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, delimiter="\t", fieldnames=LXMERT_FIELDNAMES)
        for r in records:
            writer.writerow(
                {
                    "img_id": r.image_id,
                    "img_h": r.image_h,
                    "img_w": r.image_w,
                    "objects_id": _b64(r.objects_id, np.int64),
                    "objects_conf": _b64(r.objects_conf, np.float32),
                    "attrs_id": _b64(r.attrs_id, np.int64),
                    "attrs_conf": _b64(r.attrs_conf, np.float32),
                    "num_boxes": r.num_boxes,
                    "boxes": _b64(r.boxes, np.float32),
                    "features": _b64(r.features, np.float32),
                }
            )


def write_butd_tsv(path: Path, records: list[RegionFeatures], with_cls_prob: bool) -> None:
    """As bottom-up-attention generate_tsv.py (7th field: jiasenlu's fork for ViLBERT)."""
    names = BUTD_FIELDNAMES + (["cls_prob"] if with_cls_prob else [])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, delimiter="\t", fieldnames=names)
        for r in records:
            row = {
                "image_id": r.image_id,
                "image_w": r.image_w,
                "image_h": r.image_h,
                "num_boxes": r.num_boxes,
                "boxes": _b64(r.boxes, np.float32),
                "features": _b64(r.features, np.float32),
            }
            if with_cls_prob:
                row["cls_prob"] = _b64(r.cls_prob, np.float32)
            writer.writerow(row)


def load_obj_tsv(path: Path) -> list[dict]:
    """airsplay/lxmert src/utils.py::load_obj_tsv, restated from its spec."""
    csv.field_size_limit(sys.maxsize)
    data = []
    with open(path) as f:
        for item in csv.DictReader(f, LXMERT_FIELDNAMES, delimiter="\t"):
            for key in ["img_h", "img_w", "num_boxes"]:
                item[key] = int(item[key])
            boxes = item["num_boxes"]
            decode_config = [
                ("objects_id", (boxes,), np.int64),
                ("objects_conf", (boxes,), np.float32),
                ("attrs_id", (boxes,), np.int64),
                ("attrs_conf", (boxes,), np.float32),
                ("boxes", (boxes, 4), np.float32),
                ("features", (boxes, -1), np.float32),
            ]
            for key, shape, dtype in decode_config:
                item[key] = np.frombuffer(base64.b64decode(item[key]), dtype=dtype).reshape(shape)
            data.append(item)
    return data


def read_butd_tsv(path: Path, with_cls_prob: bool) -> list[dict]:
    """bottom-up-attention tools/read_tsv.py, restated."""
    csv.field_size_limit(sys.maxsize)
    names = BUTD_FIELDNAMES + (["cls_prob"] if with_cls_prob else [])
    out = []
    with open(path) as f:
        for item in csv.DictReader(f, delimiter="\t", fieldnames=names):
            for key in ["image_w", "image_h", "num_boxes"]:
                item[key] = int(item[key])
            for key in names[4:]:
                item[key] = np.frombuffer(base64.b64decode(item[key]), dtype=np.float32).reshape(item["num_boxes"], -1)
            out.append(item)
    return out


def write_vilbert_lmdb(path: Path, records: list[RegionFeatures], style: str = "multitask") -> None:
    """multitask: vilbert-multi-task convert_to_lmdb.py (numpy dict); beta: vilbert_beta
    convert_trainval_lmdb.py (the raw TSV row dict, base64 strings); mmf: MMF lmdb_conversion."""
    env = lmdb.open(str(path), map_size=1 << 28)
    ids = []
    with env.begin(write=True) as txn:
        for r in records:
            if style == "multitask":
                item = {
                    "image_id": r.image_id,
                    "image_h": r.image_h,
                    "image_w": r.image_w,
                    "num_boxes": r.num_boxes,
                    "boxes": np.asarray(r.boxes, np.float32),
                    "features": np.asarray(r.features, np.float32),
                }
            elif style == "beta":
                item = {
                    "image_id": r.image_id,
                    "image_h": str(r.image_h),
                    "image_w": str(r.image_w),
                    "num_boxes": str(r.num_boxes),
                    "boxes": _b64(r.boxes, np.float32),
                    "features": _b64(r.features, np.float32),
                    "cls_prob": _b64(r.cls_prob, np.float32),
                }
            else:
                item = {
                    "feature_path": r.image_id,
                    "features": np.asarray(r.features, np.float32),
                    "image_height": r.image_h,
                    "image_width": r.image_w,
                    "num_boxes": np.int64(r.num_boxes),
                    "objects": r.objects_id,
                    "cls_prob": np.asarray(r.cls_prob, np.float32)[:, 1:],
                    "bbox": np.asarray(r.boxes, np.float32),
                }
            key = str(r.image_id).encode()
            txn.put(key, pickle.dumps(item))
            ids.append(key)
        txn.put(b"keys", pickle.dumps(ids))
    env.close()


def write_mmf_npy(folder: Path, records: list[RegionFeatures]) -> None:
    """MMF extract_features_vmb.py: <id>.npy features + <id>_info.npy dict (no background)."""
    folder.mkdir(parents=True, exist_ok=True)
    for r in records:
        np.save(folder / f"{r.image_id}.npy", np.asarray(r.features, np.float32))
        info = {
            "bbox": np.asarray(r.boxes, np.float32),
            "num_boxes": r.num_boxes,
            "objects": np.asarray(r.cls_prob)[:, 1:].argmax(1),
            "cls_prob": np.asarray(r.cls_prob, np.float32)[:, 1:],
            "image_width": r.image_w,
            "image_height": r.image_h,
        }
        np.save(folder / f"{r.image_id}_info.npy", info, allow_pickle=True)


class RunsCode:
    """A pickle payload that runs a shell command when loaded by a plain unpickler."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def vilbert_features_reader(path: Path, image_id) -> dict:
    """vilbert-multi-task vilbert/datasets/_image_features_reader.py
    (`ImageFeaturesH5Reader.__getitem__`, not in memory), restated: plain pickle.loads, the
    `keys` list looked up with list.index, features reshaped to (-1, 2048), the mean feature
    prepended as the IMG token and 5-d locations."""
    env = lmdb.open(str(path), max_readers=1, readonly=True, lock=False, readahead=False, meminit=False)
    with env.begin(write=False) as txn:
        image_ids = pickle.loads(txn.get("keys".encode()))
        key = str(image_id).encode()
        image_ids.index(key)
        item = pickle.loads(txn.get(key))
    env.close()
    image_h, image_w = int(item["image_h"]), int(item["image_w"])
    features = item["features"].reshape(-1, 2048)
    boxes = item["boxes"].reshape(-1, 4)
    num_boxes = features.shape[0]
    g_feat = np.sum(features, axis=0) / num_boxes
    features = np.concatenate([np.expand_dims(g_feat, axis=0), features], axis=0)
    location = np.zeros((boxes.shape[0], 5), dtype=np.float32)
    location[:, :4] = boxes
    location[:, 4] = (
        (location[:, 3] - location[:, 1]) * (location[:, 2] - location[:, 0]) / (float(image_w) * float(image_h))
    )
    location[:, 0] /= float(image_w)
    location[:, 1] /= float(image_h)
    location[:, 2] /= float(image_w)
    location[:, 3] /= float(image_h)
    location = np.concatenate([np.array([[0, 0, 1, 1, 1]], np.float32), location], axis=0)
    return {
        "image_ids": image_ids,
        "item": item,
        "features": features,
        "num_boxes": num_boxes + 1,
        "image_location": location,
    }
