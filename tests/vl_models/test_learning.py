"""A learning test: captions are a function of the region features (a colour word <-> a
feature dimension), so training image-text alignment must lift held-out alignment accuracy
and caption->image retrieval far above chance. The alignment objective is isolated with the
configurable task weights (with MLM and the region loss at full weight, the tiny model stays
on the alignment plateau for longer than a CI-sized run)."""

import json

import numpy as np
import yaml
from conftest import VOCAB
from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.records import RegionFeatures
from pipeline.store import write_records
from vl_models.tasks.pretrain import TaskConfig
from vl_models.train.trainer import TrainConfig, run

COLORS = ["red", "green", "blue", "yellow", "purple", "orange"]


def test_alignment_is_learned(tmp_path):
    model = "vilbert-tiny"
    rng = np.random.default_rng(0)
    n = 96
    concepts = rng.integers(0, len(COLORS), n)
    lines, records = [], []
    for i, c in enumerate(concepts):
        split = "val" if i >= 80 else "train"
        lines.append((split, f"a {COLORS[c]} object\thttp://img.example/{i}.jpg\n"))
    for split in ("train", "val"):
        (tmp_path / f"{split}.tsv").write_text("".join(line for s, line in lines if s == split))
    for i, c in enumerate(concepts):
        split, row = ("val", i - 80) if i >= 80 else ("train", i)
        boxes = np.array([[10, 10, 50, 50], [60, 10, 120, 80], [5, 70, 90, 120]], np.float32)
        feats = rng.normal(0, 0.3, (3, 16)).astype(np.float32)
        feats[:, c] += 3.0
        cls = np.full((3, 7), 0.01, np.float32)
        cls[:, c + 1] = 0.94
        records.append(RegionFeatures(f"cc3m-{split}-{row:08d}", 128, 128, boxes, feats, cls_prob=cls,
                                      objects_id=np.full(3, c), objects_conf=np.full(3, 0.94, np.float32),
                                      attrs_id=np.zeros(3, np.int64), attrs_conf=np.full(3, 0.5, np.float32)))
    write_records(tmp_path / "feats", records, feature_dim=16, dtype="float32", attr_prob="none")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"name": "colors", "answers": {"top_k": 0}, "sources": [
        {"name": "cc", "kind": "conceptual_captions", "files": ["train.tsv"]},
        {"name": "cc_val", "kind": "conceptual_captions", "files": ["val.tsv"], "split": "val"}]}))
    build_mixture(MixtureSpec.load(tmp_path / "spec.yaml"), tmp_path / "mix", stores=(tmp_path / "feats",))
    cfg = TrainConfig(model=model, stores=(str(tmp_path / "feats"),), mixture=str(tmp_path / "mix"),
                      out=str(tmp_path / "run"), vocab=str(VOCAB), steps=20000, stop_at=700, batch_size=32, lr=1e-3,
                      warmup=0, checkpoint_every=10000, log_every=100, max_regions=3, max_text=8, seed=0,
                      task=TaskConfig(weights={"mlm": 0.0, "region": 0.0}))
    last = run(cfg)
    assert last["eval_alignment_acc"] > 0.75, json.dumps(last)  # chance: 0.5
    assert last["eval_retrieval_R@5"] > 0.5, json.dumps(last)  # 16 images: chance R@5 = 0.31
