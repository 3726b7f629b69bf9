import json

import numpy as np
import pyarrow as pa
import pytest
import yaml
from helpers import make_record, run_cli

from pipeline.errors import ConfigError
from pipeline.mixture.answers import answer_table, normalize_answer, soft_scores
from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.store import write_records


def dump(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "data"
    dump(r / "coco/captions_train2014.json", {
        "images": [{"id": 9, "file_name": "COCO_train2014_000000000009.jpg"}, {"id": 25, "file_name": "COCO_train2014_000000000025.jpg"}],
        "annotations": [{"image_id": 9, "caption": "A plate  of food."}, {"image_id": 9, "caption": "Dinner."},
                        {"image_id": 25, "caption": "A giraffe."}]})
    dump(r / "coco/captions_val2014.json", {
        "images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
        "annotations": [{"image_id": 42, "caption": "A dog."}]})
    dump(r / "vg/image_data.json", [{"image_id": 1, "coco_id": 9, "url": "u"}, {"image_id": 2, "coco_id": 42, "url": "u"},
                                    {"image_id": 3, "coco_id": None, "url": "u"}, {"image_id": 4, "coco_id": None, "url": "u"}])
    dump(r / "vg/region_descriptions.json", [
        {"id": 1, "regions": [{"phrase": "red   plate", "image_id": 1}, {"phrase": "fork", "image_id": 1}]},
        {"id": 3, "regions": [{"phrase": "a tall tree", "image_id": 3}]}])
    dump(r / "vqa/v2_OpenEnded_mscoco_train2014_questions.json", {"info": {}, "questions": [
        {"image_id": 9, "question": "What is on the plate?", "question_id": 90},
        {"image_id": 25, "question": "How many giraffes?", "question_id": 250}]})
    dump(r / "vqa/v2_mscoco_train2014_annotations.json", {"annotations": [
        {"question_id": 90, "image_id": 9, "answers": [{"answer": a} for a in ["Food", "food.", "food", "pizza"] + ["the food"] * 6]},
        {"question_id": 250, "image_id": 25, "answers": [{"answer": a} for a in ["two"] * 2 + ["2"] * 2 + ["one"] * 6]}]})
    dump(r / "gqa/train_balanced_questions.json", {"q1": {"imageId": "3", "question": "Is the tree tall?", "answer": "Yes"},
                                                   "q2": {"imageId": "1", "question": "Is there a fork?", "answer": "yes"}})
    dump(r / "vg/question_answers.json", [{"id": 4, "qas": [{"question": "How many birds?", "answer": "Two.", "image_id": 4}]},
                                          {"id": 2, "qas": [{"question": "What animal?", "answer": "A dog", "image_id": 2}]}])
    (r / "minival_ids.txt").write_text("COCO_val2014_000000000042\n")
    spec = {"name": "small", "image_data": "vg/image_data.json", "heldout": ["minival_ids.txt"], "answers": {"top_k": 3},
            "sources": [
                {"name": "mscoco", "kind": "coco_captions", "files": ["coco/captions_train2014.json", "coco/captions_val2014.json"]},
                {"name": "vg", "kind": "vg_regions", "files": ["vg/region_descriptions.json"]},
                {"name": "vqa", "kind": "vqa", "files": ["vqa/v2_OpenEnded_mscoco_train2014_questions.json",
                                                         "vqa/v2_mscoco_train2014_annotations.json"]},
                {"name": "gqa", "kind": "gqa", "files": ["gqa/train_balanced_questions.json"]},
                {"name": "visual7w", "kind": "vgqa", "files": ["vg/question_answers.json"]}]}
    (r / "spec.yaml").write_text(yaml.safe_dump(spec))
    return r


def items(out):
    with pa.ipc.open_file(out / "items.arrow") as f:
        return f.read_all().to_pylist()


def test_lxmert_style_mixture_from_official_files(tmp_path, root):
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    rows = items(tmp_path / "mix")
    by_uid = {r["uid"]: r for r in rows}
    assert manifest["counts"]["mscoco"] == {"train/caption": 3, "val/caption": 1}
    assert manifest["counts"]["vg"] == {"train/caption": 3}
    assert manifest["counts"]["vqa"] == {"train/question": 2}
    assert manifest["counts"]["gqa"] == {"train/question": 2}
    assert manifest["counts"]["visual7w"] == {"train/question": 1, "val/question": 1}
    # VG image 1 is COCO 9: one canonical id; VG 2 is COCO val 42, held out
    assert by_uid["COCO_train2014_000000000009_vg_000"]["text"] == "red plate"
    assert by_uid["COCO_val2014_000000000042_visual7w_000"]["split"] == "val"
    assert all(r["split"] == "val" for r in rows if r["image_id"] == "COCO_val2014_000000000042")
    assert manifest["identity_groups"]["all"] == {"COCO∩VG": 2, "COCO−VG": 1, "VG−COCO": 2}
    # answers: normalized, soft scores, top-3 table over training questions
    answers = json.loads((tmp_path / "mix" / "answers.json").read_text())["answers"]
    # "2" (vqa two/2 + visual7w "Two.") and "yes" (gqa) twice each, then count-1 answers alphabetically;
    # the held-out image's "dog" is not counted
    assert answers == ["2", "yes", "1"]
    vqa = by_uid["COCO_train2014_000000000025_vqa_000"]
    assert [answers[i] for i in vqa["answer_ids"]] == ["2", "1"] and vqa["answer_scores"] == [1.0, 1.0]
    food = by_uid["COCO_train2014_000000000009_vqa_000"]
    assert food["answer_ids"] == []  # "food" is not in a top-3 table
    assert manifest["answers"]["questions_best_answer_covered"] == round(4 / 5, 4)
    report = (tmp_path / "mix" / "report.md").read_text()
    assert "COCO∩VG" in report and "| mscoco |" in report


def test_same_inputs_give_byte_identical_items(tmp_path, root):
    spec = MixtureSpec.load(root / "spec.yaml")
    build_mixture(spec, tmp_path / "a")
    build_mixture(spec, tmp_path / "b")
    assert (tmp_path / "a" / "items.arrow").read_bytes() == (tmp_path / "b" / "items.arrow").read_bytes()
    build_mixture(spec, tmp_path / "a")  # rebuilding over an existing folder replaces it
    assert (tmp_path / "a" / "items.arrow").read_bytes() == (tmp_path / "b" / "items.arrow").read_bytes()


def test_lxmert_json_input(tmp_path):
    r = tmp_path
    dump(r / "lxmert/mscoco_train.json", [
        {"img_id": "COCO_train2014_000000000009", "sentf": {"mscoco": ["A plate."], "vqa": ["What food?"]},
         "labelf": {"vqa": [{"pizza": 1.0, "Food": 0.3}]}}])
    dump(r / "lxmert/vgnococo.json", [{"img_id": "2354786", "sentf": {"vg": ["a tree"], "gqa": ["Is it tall?"]},
                                       "labelf": {"gqa": [{"yes": 1.0}]}}])
    dump(r / "lxmert/mscoco_minival.json", [{"img_id": "COCO_val2014_000000000042", "sentf": {"mscoco": ["A dog."]}}])
    (r / "spec.yaml").write_text(yaml.safe_dump({"name": "lx", "answers": {"top_k": 10}, "sources": [
        {"name": "lxmert", "kind": "lxmert", "files": ["lxmert/mscoco_train.json", "lxmert/vgnococo.json"]},
        {"name": "minival", "kind": "lxmert", "files": ["lxmert/mscoco_minival.json"], "split": "val"}]}))
    manifest = build_mixture(MixtureSpec.load(r / "spec.yaml"), tmp_path / "mix")
    rows = {row["uid"]: row for row in items(tmp_path / "mix")}
    assert set(rows) == {"COCO_train2014_000000000009_mscoco_000", "COCO_train2014_000000000009_vqa_000",
                         "2354786_vg_000", "2354786_gqa_000", "COCO_val2014_000000000042_mscoco_000"}
    assert rows["COCO_val2014_000000000042_mscoco_000"]["split"] == "val"
    answers = json.loads((tmp_path / "mix" / "answers.json").read_text())["answers"]
    q = rows["COCO_train2014_000000000009_vqa_000"]
    assert {answers[i]: s for i, s in zip(q["answer_ids"], q["answer_scores"])} == pytest.approx({"pizza": 1.0, "food": 0.3})
    assert manifest["totals"] == {"train/caption": 2, "train/question": 2, "val/caption": 1}


@pytest.mark.parametrize("raw, clean", [
    ("Yes", "yes"), ("two", "2"), ("A dog.", "dog"), ("the Red one", "red 1"), ("1,000", "1000"), ("2.5", "2.5"),
    ("grey", "gray"), ("dont know", "don't know"), ("tennis-racket", "tennis racket"), ("cat!", "cat"),
    ("None", "0"), ("  Ten ", "10"), ("an apple", "apple"), ("(yes)", "yes"), ("hot dog?", "hot dog"),
])
def test_answer_normalization_follows_the_vqa_evaluation(raw, clean):
    assert normalize_answer(raw) == clean


def test_soft_scores_and_table():
    assert soft_scores(["x", "b", "b", "c", "c", "c", "c", "", "the"]) == {"x": pytest.approx(1 / 3), "b": pytest.approx(2 / 3), "c": 1.0}
    from collections import Counter

    assert answer_table(Counter({"b": 2, "a": 2, "c": 5}), 2) == ["c", "a"]


def test_malformed_inputs_name_file_and_location(tmp_path, root):
    (root / "vg" / "region_descriptions.json").write_text('[{"id": 1, "regions": [{"phrase": "x"}]}, {"id": 2, "regions": ]')
    with pytest.raises(ConfigError, match=r"region_descriptions.json: invalid JSON.*at character"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    dump(root / "vg" / "region_descriptions.json", [{"id": 1}])
    with pytest.raises(ConfigError, match=r"region_descriptions.json: \[0\]: needs regions"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert not (tmp_path / "mix").exists()
    (root / "bad.yaml").write_text(yaml.safe_dump({"name": "x", "sources": [{"kind": "nope", "files": ["a"]}]}))
    with pytest.raises(ConfigError, match="kind"):
        MixtureSpec.load(root / "bad.yaml")


def test_stores_check_lists_missing_images(tmp_path, root):
    rng = np.random.default_rng(0)
    have = ["COCO_train2014_000000000009", "COCO_train2014_000000000025", "COCO_val2014_000000000042", "3"]
    write_records(tmp_path / "feats", [make_record(rng, i, feature_dim=8) for i in have], feature_dim=8)
    proc = run_cli("build-mixture", "--spec", root / "spec.yaml", "--out", tmp_path / "mix", "--stores", tmp_path / "feats")
    assert proc.returncode == 2 and "1 images have no features" in proc.stderr and "(e.g. 4)" in proc.stderr
    proc = run_cli("build-mixture", "--spec", root / "spec.yaml", "--out", tmp_path / "mix", "--stores", tmp_path / "feats",
                   "--drop-missing")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "mix" / "manifest.json").read_text())
    assert manifest["missing_features"] == {"images": 1, "items_dropped": 1, "examples": ["4"]}
    assert all(r["image_id"] != "4" for r in items(tmp_path / "mix"))


def test_shipped_specs_parse(tmp_path):
    from pathlib import Path

    specs = Path(__file__).resolve().parents[2] / "data_manifests" / "mixtures"
    for path in specs.glob("*.yaml"):
        raw = yaml.safe_load(path.read_text())
        assert raw["name"] and raw["sources"]
        with pytest.raises(ConfigError, match="input files not found"):
            MixtureSpec.load(path, root=tmp_path)


def test_question_whose_answers_all_normalize_away(tmp_path, root):
    """Annotators answering only "the" / "a": the question is kept, with no answers."""
    path = root / "vqa/v2_mscoco_train2014_annotations.json"
    annotations = json.loads(path.read_text())
    annotations["annotations"][1]["answers"] = [{"answer": a} for a in ["the", "a", "A."] * 3 + ["an"]]
    dump(path, annotations)
    build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    row = next(r for r in items(tmp_path / "mix") if r["text"] == "How many giraffes?")
    assert row["answer_ids"] == [] and row["answer_scores"] == []


def test_image_map_renames_annotation_ids_to_store_keys(tmp_path, root):
    (root / "map.tsv").write_text("COCO_train2014_000000000009\tcc3m-train-00000007\n\n")
    spec = yaml.safe_load((root / "spec.yaml").read_text())
    (root / "spec.yaml").write_text(yaml.safe_dump({**spec, "image_map": "map.tsv"}))
    build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    rows = items(tmp_path / "mix")
    renamed = [r for r in rows if r["image_id"] == "cc3m-train-00000007"]
    assert {r["source"] for r in renamed} == {"mscoco", "vg", "vqa", "gqa"}  # captions, VG regions via coco_id, questions
    assert all(r["store_key"] == "cc3m-train-00000007" for r in renamed)
    assert not any(r["image_id"] == "COCO_train2014_000000000009" for r in rows)
    (root / "map.tsv").write_text("COCO_train2014_000000000009 cc3m\n")
    with pytest.raises(ConfigError, match="map.tsv:1"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix2")


def test_conceptual_captions_mixture(tmp_path):
    (tmp_path / "cc").mkdir()
    (tmp_path / "cc" / "Train_GCC-training.tsv").write_text("a dog\thttp://x/1\na cat\thttp://x/2\n")
    (tmp_path / "cc" / "Validation_GCC-1.1.0-Validation.tsv").write_text("a bird\thttp://x/3\n")
    spec_path = tmp_path / "vilbert_cc.yaml"
    spec_path.write_text((__import__("pathlib").Path(__file__).resolve().parents[2] / "data_manifests" / "mixtures" /
                          "vilbert_cc.yaml").read_text())
    manifest = build_mixture(MixtureSpec.load(spec_path), tmp_path / "mix")
    rows = items(tmp_path / "mix")
    assert [r["image_id"] for r in rows] == ["cc3m-train-00000000", "cc3m-train-00000001", "cc3m-val-00000000"]
    assert manifest["totals"] == {"train/caption": 2, "val/caption": 1}


def test_shipped_lxmert_spec_builds_from_fixtures(tmp_path, root):
    """data_manifests/mixtures/lxmert.yaml with the fixture files at its paths."""
    import shutil
    from pathlib import Path

    layout = {
        "coco/annotations/captions_train2014.json": "coco/captions_train2014.json",
        "coco/annotations/captions_val2014.json": "coco/captions_val2014.json",
        "vg/image_data.json": "vg/image_data.json",
        "vg/region_descriptions.json": "vg/region_descriptions.json",
        "vqa/v2_OpenEnded_mscoco_train2014_questions.json": "vqa/v2_OpenEnded_mscoco_train2014_questions.json",
        "vqa/v2_mscoco_train2014_annotations.json": "vqa/v2_mscoco_train2014_annotations.json",
        "gqa/train_balanced_questions.json": "gqa/train_balanced_questions.json",
        "vg/question_answers.json": "vg/question_answers.json",
        "lxmert/minival_image_ids.txt": "minival_ids.txt",
    }
    data = tmp_path / "lxmert_data"
    for dest, src in layout.items():
        (data / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / src, data / dest)
    dump(data / "vqa/v2_OpenEnded_mscoco_val2014_questions.json", {"questions": [
        {"image_id": 42, "question": "What animal?", "question_id": 420}]})
    dump(data / "vqa/v2_mscoco_val2014_annotations.json", {"annotations": [
        {"question_id": 420, "answers": [{"answer": "dog"}] * 10}]})
    dump(data / "gqa/val_balanced_questions.json", {})
    spec = Path(__file__).resolve().parents[2] / "data_manifests" / "mixtures" / "lxmert.yaml"
    manifest = build_mixture(MixtureSpec.load(spec, root=data), tmp_path / "mix")
    assert manifest["totals"] == {"train/caption": 6, "train/question": 5, "val/caption": 1, "val/question": 2}
    assert manifest["answers"]["top_k"] == 9500 and manifest["answers"]["table_size"] == 5  # food pizza 2 1 yes
