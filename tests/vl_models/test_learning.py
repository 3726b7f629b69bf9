"""Learning tests: the text is a function of the region features (a colour and a shape word
<-> two feature dimensions), so training must lift held-out accuracy far above chance. Every
text names its own image's colour and shape (captions "a red cube", questions "what color is
the cube?"): with one question text for every image, most negative pairs were unlearnable.

ViLBERT-tiny, all three tasks at weight 1 from step 0: image-text alignment (and caption ->
image retrieval). LXMERT-tiny, all five tasks at weight 1: image QA through the
cross-modality layers, and masked-object classification. Both models initialize at their
width's scale (`initializer_range` 0.02 * sqrt(768 / 32)). (LXMERT-tiny's matching head is
still at chance after this CI-sized run, 0.5 at step 500; see docs/fidelity.md.)"""

import json

import numpy as np
import yaml
from train_helpers import VOCAB

from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.records import RegionFeatures
from pipeline.store import write_records
from vl_models.config import TrainConfig
from vl_models.train.trainer import run

COLORS = ["red", "green", "blue", "yellow", "purple", "orange"]
SHAPES = ["cube", "ball", "ring", "cone", "star", "disk"]
N, VAL_FROM = 96, 80


def colour_store(tmp_path, name) -> list[tuple[int, int]]:
    """N images, each of one colour c and one shape s: its 3 regions carry c in feature
    dimension c and s in dimension 6 + s; `name(i)` is image i's id."""
    rng = np.random.default_rng(0)
    concepts = [(int(c), int(s)) for c, s in zip(rng.integers(0, len(COLORS), N), rng.integers(0, len(SHAPES), N))]
    records = []
    for i, (c, s) in enumerate(concepts):
        boxes = np.array([[10, 10, 50, 50], [60, 10, 120, 80], [5, 70, 90, 120]], np.float32)
        feats = rng.normal(0, 0.3, (3, 16)).astype(np.float32)
        feats[:, c] += 3.0
        feats[:, 6 + s] += 3.0
        cls = np.full((3, 7), 0.01, np.float32)
        cls[:, c + 1] = 0.94
        records.append(
            RegionFeatures(
                name(i),
                128,
                128,
                boxes,
                feats,
                cls_prob=cls,
                objects_id=np.full(3, c),
                objects_conf=np.full(3, 0.94, np.float32),
                attrs_id=np.zeros(3, np.int64),
                attrs_conf=np.full(3, 0.5, np.float32),
            )
        )
    write_records(tmp_path / "feats", records, feature_dim=16, dtype="float32", attr_prob="none")
    return concepts


def caption(concept) -> str:
    return f"a {COLORS[concept[0]]} {SHAPES[concept[1]]}"


def train(tmp_path, model, weights, steps) -> dict:
    # Padded to the maximum: dropout's draws depend on the tensors' shapes, and these thresholds
    # were measured on this realization of them (ViLBERT's alignment at 700 steps ranges over
    # 0.56-0.94 between realizations). Dynamic padding computes the same function
    # (tests/vl_models/test_padding.py, a dropout-free run included).
    return run(
        TrainConfig.of(
            model=model,
            stores=(str(tmp_path / "feats"),),
            mixture=str(tmp_path / "mix"),
            out=str(tmp_path / "run"),
            vocab=str(VOCAB),
            steps=20000,
            stop_at=steps,
            batch_size=32,
            lr=1e-3,
            warmup=0,
            checkpoint_every=10000,
            log_every=100,
            max_regions=3,
            max_text=8,
            seed=0,
            weights=weights,
            padding="max",
        )
    )


def test_vilbert_alignment_is_learned(tmp_path):
    def name(i):
        return f"cc3m-val-{i - VAL_FROM:08d}" if i >= VAL_FROM else f"cc3m-train-{i:08d}"

    concepts = colour_store(tmp_path, name)
    for split, rows in (("train", range(VAL_FROM)), ("val", range(VAL_FROM, N))):
        (tmp_path / f"{split}.tsv").write_text(
            "".join(f"{caption(concepts[i])}\thttp://img.example/{i}.jpg\n" for i in rows)
        )
    (tmp_path / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "colors",
                "answers": {"top_k": 0},
                "sources": [
                    {"name": "cc", "kind": "conceptual_captions", "files": ["train.tsv"]},
                    {"name": "cc_val", "kind": "conceptual_captions", "files": ["val.tsv"], "split": "val"},
                ],
            }
        )
    )
    build_mixture(MixtureSpec.load(tmp_path / "spec.yaml"), tmp_path / "mix", stores=(tmp_path / "feats",))
    last = train(tmp_path, "vilbert-tiny", {}, steps=700)  # all three tasks at weight 1
    assert last["eval_alignment_acc"] > 0.85, json.dumps(last)  # chance: 0.5; measured 0.94
    assert last["eval_retrieval_R@5"] > 0.7, json.dumps(last)  # 16 images: chance R@5 = 0.31; measured 1.0


def test_lxmert_qa_is_learned(tmp_path):
    """VQA-format questions on COCO-named images; the held-out images are the val split."""

    def name(i):
        return f"COCO_train2014_{i + 1:012d}"

    concepts = colour_store(tmp_path, name)
    (tmp_path / "heldout.txt").write_text("".join(name(i) + "\n" for i in range(VAL_FROM, N)))
    (tmp_path / "captions_train2014.json").write_text(
        json.dumps(
            {
                "images": [{"id": i + 1, "file_name": name(i) + ".jpg"} for i in range(N)],
                "annotations": [{"image_id": i + 1, "caption": caption(c)} for i, c in enumerate(concepts)],
            }
        )
    )
    (tmp_path / "v2_OpenEnded_mscoco_train2014_questions.json").write_text(
        json.dumps(
            {
                "questions": [
                    {"image_id": i + 1, "question": f"what color is the {SHAPES[s]}?", "question_id": i + 1}
                    for i, (_, s) in enumerate(concepts)
                ]
            }
        )
    )
    (tmp_path / "v2_mscoco_train2014_annotations.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {"question_id": i + 1, "answers": [{"answer": COLORS[c]}] * 10} for i, (c, _) in enumerate(concepts)
                ]
            }
        )
    )
    (tmp_path / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "colors-qa",
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
    build_mixture(MixtureSpec.load(tmp_path / "spec.yaml"), tmp_path / "mix", stores=(tmp_path / "feats",))
    last = train(tmp_path, "lxmert-tiny", {}, steps=500)  # all five tasks at weight 1
    assert last["eval_qa_score"] > 0.8, json.dumps(last)  # chance: 1/6; measured 1.0
    assert last["eval_obj_acc"] > 0.6, json.dumps(last)  # masked regions' object labels; chance: 1/6; measured 0.82
