"""Training on the newer extractors' stores. `vlprep extract --detector grid-*` writes a store
marked as a grid, and `vltrain pretrain` trains on it, refusing by name what a grid cannot give
(detector labels) and what would silently crop it (fewer region slots than cells). A run trained
on a VinVL store answers about a new image through VinVL again (`vltrain predict`)."""

import json

import numpy as np
import pytest
import yaml
from helpers import extract_args, run_cli, run_vltrain
from PIL import Image
from train_helpers import pretrain_args

from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.records import grid_shape
from pipeline.store import FeatureStore

IDS = [9, 25, 30, 42, 51, 52]


def extracted_data(root, *flags):
    """A store of six images extracted with `flags` (random weights) and a caption
    mixture over them, made with our commands."""
    images = root / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    stems = [f"COCO_train2014_{i:012d}" for i in IDS]
    for k, stem in enumerate(stems):
        size = (120 + 20 * k, 160 - 10 * k, 3)
        Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8)).save(images / f"{stem}.png")
    proc = run_cli(*extract_args(root / "feats", images=images, detector=None), *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (root / "captions_train2014.json").write_text(
        json.dumps(
            {
                "images": [{"id": i, "file_name": f"{s}.jpg"} for i, s in zip(IDS, stems)],
                "annotations": [{"image_id": i, "caption": f"a picture number {i} with a red thing"} for i in IDS],
            }
        )
    )
    (root / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "g",
                "answers": {"top_k": 10},
                "sources": [{"name": "mscoco", "kind": "coco_captions", "files": ["captions_train2014.json"]}],
            }
        )
    )
    build_mixture(MixtureSpec.load(root / "spec.yaml"), root / "mix", stores=(root / "feats",))
    return root


@pytest.fixture(scope="module")
def grid_data(tmp_path_factory):
    """grid-tiny, pooled to 3x3 cells."""
    return extracted_data(tmp_path_factory.mktemp("grid"), "--detector", "grid-tiny", "--grid-pool", "3x3")


def test_the_store_says_it_holds_grids(grid_data):
    store = FeatureStore.open(grid_data / "feats")
    assert store.layout.regions == "grid" and store.layout.feature_dim == 128
    prov = store.manifest.provenance
    assert prov["extractor"]["backend"] == "grid" and prov["extractor"]["config"]["name"] == "grid-tiny"
    assert prov["box_policy"] == "grid cells pooled to 3x3" and prov["max_regions"] == 9
    rec = store.record_at(0)
    assert rec.num_boxes == 9 and grid_shape(rec.boxes) == (3, 3) and rec.objects_id is None


@pytest.mark.parametrize(
    "model,off",
    [("lxmert-tiny", ("obj", "attr")), ("vilbert-tiny", ("region",))],
)
def test_pretraining_on_a_grid_store_turns_off_the_label_losses_by_name(grid_data, tmp_path, model, off):
    refused = run_vltrain(*pretrain_args(grid_data, tmp_path / "no", model=model), "--max-regions", "9")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "holds grid features, which carry no detector labels" in refused.stderr
    assert " ".join(f"--loss-weight {t}=0" for t in off) in refused.stderr
    assert not (tmp_path / "no").exists()  # refused before anything is written

    weights = [a for t in off for a in ("--loss-weight", f"{t}=0")]
    proc = run_vltrain(*pretrain_args(grid_data, tmp_path / "run", model=model), "--max-regions", "9", *weights)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    feat = "loss_feat" if model.startswith("lxmert") else "loss_alignment"
    assert [r["step"] for r in rows if feat in r] == [1, 2, 3, 4]
    assert all(np.isfinite(r[feat]) for r in rows if feat in r)
    assert all(r[f"loss_{t}"] == 0 for r in rows for t in off if f"loss_{t}" in r)  # weighted 0: logged as 0


def test_fewer_slots_than_cells_would_crop_the_grid_and_are_refused(grid_data, tmp_path):
    proc = run_vltrain(
        *pretrain_args(grid_data, tmp_path / "run"),
        "--max-regions",
        "4",
        "--loss-weight",
        "obj=0",
        "--loss-weight",
        "attr=0",
    )
    assert proc.returncode == 2
    assert "holds grid features of up to 9 cells per image" in proc.stderr and "--max-regions 9" in proc.stderr


def test_a_run_on_a_vinvl_store_predicts_through_vinvl(tmp_path_factory, tmp_path):
    """Pretrain on a vinvl-tiny store, then ask the run's pair head about a new image file:
    `vltrain predict` rebuilds the store's VinVL extractor from its provenance (bitwise the
    store's own records: tests/pipeline/test_vinvl.py) and answers."""
    data = extracted_data(tmp_path_factory.mktemp("vinvl"), "--detector", "vinvl-tiny", "--boxes", "4-6")
    prov = FeatureStore.open(data / "feats").manifest.provenance
    assert prov["extractor"]["backend"] == "vinvl-x152c4"
    proc = run_vltrain(*pretrain_args(data, tmp_path / "run"), "--max-regions", "6")
    assert proc.returncode == 0, proc.stderr[-3000:]
    image = next((data / "images").iterdir())
    out = tmp_path / "answer.json"
    proc = run_vltrain(
        "predict", "--checkpoint", tmp_path / "run", "--image", image, "--text", "a picture number 9", "--out", out
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer = json.loads(out.read_text())
    assert answer["task"] == "pair-head" and 0 <= answer["probability"] <= 1
