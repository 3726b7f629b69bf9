"""Which rows vilbert-multi-task trains and validates on once it drops its test sets' images
(``clean_datasets``, on by default), for `tests/vl_models/test_fidelity_data.py`.

The fixture (``vilbert_mt_clean.json`` beside this file) holds a small VQA world (train and
val questions by image, 3,010 val questions so that its minval is not all of val), a COCO and a
Flickr30k retrieval training file (its ``all_data_final_train_2014.jsonline`` format), the
image ids of its ``cache/*_test_ids.npy``, and the question ids / image ids the reference's
own loaders keep: ``vilbert/datasets/vqa_dataset.py`` `_load_dataset` for its ``trainval``
(what vilbert_tasks.yml trains VQA on) and ``minval``, ``retreival_dataset.py``
`_load_annotations` for ``train``, each with ``clean_datasets=True``.

Made once, on CPU, with the reference code (never vendored; fetch
github:facebookresearch/vilbert-multi-task):

    python tests/reference/vilbert_mt_clean.py --reference /path/to/vilbert-multi-task

It runs the reference modules unchanged in a temporary folder laid out as its data root;
only imports this environment lacks or that need torch's image readers are replaced:
``._image_features_reader`` and ``pytorch_transformers`` by empty modules, ``jsonlines`` by
a reader of one JSON value a line (all `_load_annotations` uses of it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pickle
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).with_suffix(".json")


def world() -> dict:
    """Question ids by image: train 40 questions on images 1..20; val 3,010 questions on images
    1000.., their ids not in image order; test ids hitting train, val - minval and minval
    images, and an image no question has; retrieval training images, some listed."""
    train = [{"question_id": 10 * i + k, "image_id": 1 + i} for i in range(20) for k in range(2)]
    val_ids = [int(q) for q in np.random.default_rng(0).permutation(3010) * 3 + 500_000]
    val = [{"question_id": q, "image_id": 1000 + (q - 500_000) // 6} for q in val_ids]
    ordered = sorted(val, key=lambda v: v["question_id"])
    test_ids = [3, 7, ordered[5]["image_id"], ordered[-1]["image_id"], 999_999]
    coco = [{"id": 400 + i, "sentences": [f"coco {i} a", f"coco {i} b"]} for i in range(12)]
    flickr = [{"img_path": f"{7000 + i}.jpg", "sentences": [f"flickr {i}"]} for i in range(8)]
    return {
        "train": train,
        "val": val,
        "coco_test_ids": test_ids,
        "coco_retrieval_train": coco,
        "coco_retrieval_test_ids": [401, 405, 1],
        "flickr_retrieval_train": flickr,
        "flickr_test_ids": [7002, 9999],
    }


def _write_vqa(root: Path, w: dict) -> None:
    (root / "cache").mkdir(parents=True)
    for split in ("train", "val"):
        questions = [{**q, "question": f"q {q['question_id']}?"} for q in w[split]]
        (root / f"v2_OpenEnded_mscoco_{split}2014_questions.json").write_text(json.dumps({"questions": questions}))
        targets = [{**q, "labels": [0], "scores": [1.0]} for q in w[split]]
        (root / "cache" / f"{split}_target.pkl").write_bytes(pickle.dumps(targets))
    np.save(root / "cache" / "coco_test_ids.npy", np.array(w["coco_test_ids"]))


def _package(reference: Path):
    """vilbert/datasets as package ``mt_datasets`` with its unavailable imports stubbed."""
    package = types.ModuleType("mt_datasets")
    package.__path__ = [str(reference / "vilbert" / "datasets")]
    sys.modules["mt_datasets"] = package
    reader = types.ModuleType("mt_datasets._image_features_reader")
    reader.ImageFeaturesH5Reader = object
    sys.modules[reader.__name__] = reader
    bert = types.ModuleType("pytorch_transformers.tokenization_bert")
    bert.BertTokenizer = object
    sys.modules["pytorch_transformers"] = types.ModuleType("pytorch_transformers")
    sys.modules[bert.__name__] = bert

    class _Lines:
        def __init__(self, path):
            self.f = open(path)

        def __enter__(self):
            return (json.loads(line) for line in self.f if line.strip())

        def __exit__(self, *exc):
            self.f.close()
            return False

    lines = types.ModuleType("jsonlines")
    lines.open = _Lines
    sys.modules["jsonlines"] = lines


def _load(name: str, reference: Path):
    spec = importlib.util.spec_from_file_location(
        f"mt_datasets.{name}", reference / "vilbert" / "datasets" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="a vilbert-multi-task checkout")
    args = parser.parse_args()
    _package(args.reference)
    vqa = _load("vqa_dataset", args.reference)
    retrieval = _load("retreival_dataset", args.reference)
    w = world()
    out: dict = {
        "source": "github.com/facebookresearch/vilbert-multi-task (vilbert/datasets/vqa_dataset.py, "
        "retreival_dataset.py)",
        # questions as [question_id, image_id] pairs
        "world": {**w, **{s: [[q["question_id"], q["image_id"]] for q in w[s]] for s in ("train", "val")}},
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "VQA"
        _write_vqa(root, w)
        out["vqa"] = {
            name: [e["question_id"] for e in vqa._load_dataset(str(root), name, True)]
            for name in ("trainval", "minval")
        }
        out["retrieval"] = {}
        for task, key, ids in (
            ("RetrievalCOCO", "coco", "coco_retrieval_test_ids"),
            ("RetrievalFlickr30k", "flickr", "flickr_test_ids"),
        ):
            data = Path(tmp) / key
            (data / "cache").mkdir(parents=True)
            np.save(data / "cache" / f"{key}_test_ids.npy", np.array(w[ids]))
            path = data / "train.jsonline"
            path.write_text("".join(json.dumps(a) + "\n" for a in w[f"{key}_retrieval_train"]))
            _, image_entries = retrieval._load_annotations("train", str(path), task, str(data), True)
            out["retrieval"][key] = [int(i) for i in image_entries]
    FIXTURE.write_text(json.dumps(out) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
