"""Fixtures of the model and trainer tests: a small store and mixture built with our tools, and
the transfer tests' task world."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import make_record
from task_files import build_task_world

from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.store import write_records


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    ids = [9, 25, 30, 42, 51, 52]  # 51 and 52 are held out: the val split
    stems = [f"COCO_train2014_{i:012d}" for i in ids]
    records = [
        make_record(rng, s, num_boxes=int(rng.integers(5, 12)), feature_dim=16, cls_dim=11, attr_dim=7) for s in stems
    ]
    write_records(root / "feats", records, feature_dim=16, dtype="float32")
    (root / "captions_train2014.json").write_text(
        json.dumps(
            {
                "images": [{"id": i, "file_name": f"{s}.jpg"} for i, s in zip(ids, stems)],
                "annotations": [
                    {"image_id": i, "caption": f"a picture number {i} with a red thing"} for i in ids for _ in range(2)
                ],
            }
        )
    )
    (root / "v2_OpenEnded_mscoco_train2014_questions.json").write_text(
        json.dumps({"questions": [{"image_id": i, "question": "what color is it?", "question_id": i} for i in ids]})
    )
    (root / "v2_mscoco_train2014_annotations.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {"question_id": i, "answers": [{"answer": "red"}] * 7 + [{"answer": "blue"}] * 3} for i in ids
                ]
            }
        )
    )
    (root / "heldout.txt").write_text("COCO_train2014_000000000051\nCOCO_train2014_000000000052\n")
    (root / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "answers": {"top_k": 10},
                "heldout": ["heldout.txt"],
                "sources": [
                    {"name": "mscoco", "kind": "coco_captions", "files": ["captions_train2014.json"]},
                    {
                        "name": "vqa",
                        "kind": "vqa",
                        "files": [
                            "v2_OpenEnded_mscoco_train2014_questions.json",
                            "v2_mscoco_train2014_annotations.json",
                        ],
                    },
                ],
            }
        )
    )
    build_mixture(MixtureSpec.load(root / "spec.yaml"), root / "mix", stores=(root / "feats",))
    return root


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> Path:
    """The task world (`task_files.build_task_world`: the store, the official files, every
    task's dataset), built once per test process and shared by the transfer tests: read it;
    a test that changes a file changes a copy in its tmp_path."""
    return build_task_world(tmp_path_factory.mktemp("tasks"))
