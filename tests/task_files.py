"""Downstream-task files in the official formats over a feature store with a planted signal,
for the transfer tests: every image has a colour class (``COLORS[i % 3]``, written into its
region features) and one marked region (the referred one); questions, statements, captions,
referring expressions and VCR choices are about them, so a model that reads the regions can
learn each task.

`write_task_world(root)` writes ``feats/`` (the store, keys ``img_<i>``) and the official
files under ``files/``; returns their paths by task. `build_task_world(root)` also builds every
task's dataset from them (the transfer tests' session fixture ``world``)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np

from pipeline.records import RegionFeatures
from pipeline.store import write_records

COLORS = ("red", "green", "blue")
IMAGES, VAL_FROM = 36, 24  # images 24.. are the val / dev / test split
REGIONS, DIM, SIZE = 6, 16, 240


def color(i: int) -> int:
    return i % 3


def marked(i: int) -> int:
    """The referred region of image i."""
    return (i * 5) % REGIONS


def boxes() -> np.ndarray:
    """Six disjoint boxes on a 3 x 2 grid (IoU 0 with each other)."""
    return np.array(
        [[x * 80 + 5, y * 120 + 5, x * 80 + 70, y * 120 + 110] for y in range(2) for x in range(3)], np.float32
    )


def key(i: int) -> str:
    return f"img_{i}"


def split_of(i: int, val: str = "val") -> str:
    return "train" if i < VAL_FROM else val


def write_store(path: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    records = []
    for i in range(IMAGES):
        feats = rng.normal(0, 0.3, (REGIONS, DIM)).astype(np.float32)
        feats[:, color(i)] += 3.0
        feats[marked(i), 8] += 4.0
        probs = np.full((REGIONS, 4), 0.25, np.float32)
        records.append(
            RegionFeatures(
                image_id=key(i),
                image_h=SIZE,
                image_w=SIZE,
                boxes=boxes(),
                features=feats,
                cls_prob=probs,
                objects_id=np.zeros(REGIONS, np.int64),
                objects_conf=np.ones(REGIONS, np.float32),
            )
        )
    write_records(path, records, feature_dim=DIM, dtype="float32")


def _dump(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path


def _lines(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_vqa(files: Path) -> list[Path]:
    """VQA v2 questions + annotations for train2014 (images < VAL_FROM) and val2014; images are
    named as COCO stems, mapped to the store keys by ``image_map.tsv``."""
    out = []
    for coco, images in (("train2014", range(VAL_FROM)), ("val2014", range(VAL_FROM, IMAGES))):
        questions, annotations = [], []
        for i in images:
            for j, (text, answer, kind) in enumerate(
                (
                    ("what color is the picture?", COLORS[color(i)], "other"),
                    ("is the picture red?", "yes" if color(i) == 0 else "no", "yes/no"),
                )
            ):
                qid = i * 10 + j
                questions.append({"image_id": i, "question": text, "question_id": qid})
                annotations.append(
                    {
                        "question_id": qid,
                        "image_id": i,
                        "answer_type": kind,
                        "question_type": "what",
                        "multiple_choice_answer": answer,
                        "answers": [{"answer": answer, "answer_id": k + 1} for k in range(10)],
                    }
                )
        out.append(_dump(files / f"v2_OpenEnded_mscoco_{coco}_questions.json", {"questions": questions}))
        out.append(_dump(files / f"v2_mscoco_{coco}_annotations.json", {"annotations": annotations}))
    return out


def write_image_map(files: Path) -> Path:
    lines = [f"COCO_{'train' if i < VAL_FROM else 'val'}2014_{i:012d}\t{key(i)}\n" for i in range(IMAGES)]
    lines += [f"{name}\t{key(i)}\n" for name, i in _nlvr2_images()]
    path = files / "image_map.tsv"
    path.write_text("".join(lines))
    return path


def _pairs():
    """(split, pair number, left image, right image): the left image is red for even pairs and
    not for odd ones (half the statements are true); the right one is another image."""
    for split, images in (("train", range(VAL_FROM)), ("dev", range(VAL_FROM, IMAGES))):
        images = list(images)
        for p in range(len(images)):
            left = (3 * (p // 2) + p % 2) % len(images)  # images[3k] are red
            yield split, p, images[left], images[(left + 2) % len(images)]


def _nlvr2_images():
    for split, p, left, right in _pairs():
        yield f"{split}-{p}-0-img0", left
        yield f"{split}-{p}-0-img1", right


def write_nlvr2(files: Path) -> list[Path]:
    """One statement per pair, 'the left image is red': true for even pairs."""
    out = []
    for split in ("train", "dev"):
        rows = []
        for s, p, left, right in _pairs():
            if s != split:
                continue
            rows.append(
                {
                    "identifier": f"{split}-{p}-0-0",
                    "sentence": "the left image is red",
                    "label": str(color(left) == 0),
                    "left_url": f"http://x/{key(left)}.jpg",
                    "right_url": f"http://x/{key(right)}.jpg",
                }
            )
        out.append(_lines(files / f"{split}.json", rows))
    return out


def write_karpathy(files: Path) -> Path:
    images = []
    for i in range(IMAGES):
        captions = [
            f"a {COLORS[color(i)]} picture",
            f"something {COLORS[color(i)]}",
            f"the colour {COLORS[color(i)]}",
            f"{COLORS[color(i)]} everywhere",
            f"all {COLORS[color(i)]}",
        ]
        images.append(
            {
                "filename": f"{key(i)}.jpg",
                "imgid": i,
                "split": split_of(i, "test"),
                "sentids": [i * 5 + k for k in range(5)],
                "sentences": [
                    {"raw": c, "tokens": c.split(), "imgid": i, "sentid": i * 5 + k} for k, c in enumerate(captions)
                ],
            }
        )
    return _dump(files / "dataset_flickr30k.json", {"dataset": "flickr30k", "images": images})


def write_refcoco(files: Path) -> list[Path]:
    """One ref per image: the marked region's box, 'the marked one'; splits train / val / testA."""
    grid = boxes()
    images, anns, refs = [], [], []
    for i in range(IMAGES):
        name = f"COCO_train2014_{i:012d}"
        images.append({"id": i + 1, "file_name": f"{name}.jpg", "width": SIZE, "height": SIZE})
        x1, y1, x2, y2 = (float(v) for v in grid[marked(i)])
        anns.append(
            {
                "id": i + 1,
                "image_id": i + 1,
                "bbox": [x1, y1, x2 - x1, y2 - y1],
                "category_id": 1,
                "area": (x2 - x1) * (y2 - y1),
                "iscrowd": 0,
            }
        )
        split = "train" if i < VAL_FROM else ("val" if i % 2 else "testA")
        refs.append(
            {
                "ref_id": i,
                "ann_id": i + 1,
                "image_id": i + 1,
                "split": split,
                "category_id": 1,
                "file_name": f"{name}_{i + 1}.jpg",
                "sent_ids": [i],
                "sentences": [
                    {
                        "sent": "the marked one",
                        "raw": "The marked one.",
                        "tokens": ["the", "marked", "one"],
                        "sent_id": i,
                    }
                ],
            }
        )
    refs_path = files / "refcoco+" / "refs(unc).p"
    refs_path.parent.mkdir(parents=True, exist_ok=True)
    refs_path.write_bytes(pickle.dumps(refs, protocol=2))
    inst = _dump(
        files / "refcoco+" / "instances.json",
        {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]},
    )
    map_lines = "".join(f"COCO_train2014_{i:012d}\t{key(i)}\n" for i in range(IMAGES))
    (files / "refcoco+" / "image_map.tsv").write_text(map_lines)
    return [refs_path, inst]


def write_vcr(files: Path) -> list[Path]:
    """'what color is [0] ?' with the four colours (and gray) as choices, the right one at a
    rotating position; rationales 'because [0] looks <colour>'."""
    out = []
    for split, images in (("train", range(VAL_FROM)), ("val", range(VAL_FROM, IMAGES))):
        rows = []
        for i in images:
            options = [*COLORS, "gray"]
            label = i % 4
            order = options[:]
            order.remove(COLORS[color(i)])
            order.insert(label, COLORS[color(i)])
            rows.append(
                {
                    "annot_id": f"{split}-{i}",
                    "objects": ["person", "ball"],
                    "img_fn": f"{key(i)}.jpg",
                    "metadata_fn": f"{key(i)}.json",
                    "question": ["what", "color", "is", [1], "?"],
                    "answer_choices": [["it", "is", c, "."] for c in order],
                    "answer_label": label,
                    "rationale_choices": [["because", [1], "looks", c, "."] for c in order],
                    "rationale_label": label,
                }
            )
        out.append(_lines(files / "vcr" / f"{split}.jsonl", rows))
    return out


def write_gqa(files: Path) -> list[Path]:
    """Balanced questions for train / val / testdev and a submission file without answers."""
    out = []
    for split, images in (("train", range(VAL_FROM)), ("val", range(VAL_FROM, 30)), ("testdev", range(30, IMAGES))):
        questions = {
            f"{split}{i}": {
                "imageId": key(i),
                "question": "which color is the image?",
                "answer": COLORS[color(i)],
                "types": {"structural": "query"},
                "isBalanced": True,
            }
            for i in images
        }
        out.append(_dump(files / f"{split}_balanced_questions.json", questions))
    out.append(
        _dump(
            files / "submission_all_questions.json",
            {f"s{i}": {"imageId": key(i), "question": "which color is the image?"} for i in range(30, IMAGES)},
        )
    )
    return out


def write_task_world(root: Path) -> dict:
    root = Path(root)
    write_store(root / "feats")
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    return {
        "store": root / "feats",
        "image_map": write_image_map(files),
        "vqa": write_vqa(files),
        "nlvr2": write_nlvr2(files),
        "flickr30k": [write_karpathy(files)],
        "refcoco+": write_refcoco(files),
        "vcr": write_vcr(files),
        "gqa": write_gqa(files),
    }


BUILT_TASKS = ("vqa", "gqa", "nlvr2", "flickr30k", "refcoco+", "refcoco", "vcr")


def build_task_world(root: Path) -> Path:
    """`write_task_world`, then each of `BUILT_TASKS` built into ``root/<task>`` (VQA's table:
    every answer, ``min_count=1``; RefCOCO+ and RefCOCO: the same refs file, with its image
    map), and ``tiny.json``: a vilbert-tiny config of the store's width (vilbert-tiny-16)."""
    from vl_models import families, transfer
    from vl_models.transfer.build import build_task

    root = Path(root)
    files = write_task_world(root)
    refs = root / "files" / "refcoco+" / "image_map.tsv"
    for name in BUILT_TASKS:
        official = files["refcoco+" if name == "refcoco" else name]
        image_map = refs if name.startswith("refcoco") else files["image_map"]
        build_task(
            transfer.get(name), official, root / name, image_map=image_map, min_count=1 if name == "vqa" else None
        )
    config = {**families.load_config("vilbert-tiny").to_json(), "model_type": "vilbert", "v_feature_size": DIM}
    (root / "tiny.json").write_text(json.dumps({**config, "name": "vilbert-tiny-16"}))
    return root
