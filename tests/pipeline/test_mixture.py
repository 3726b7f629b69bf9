import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from helpers import make_record, run_cli

from pipeline.errors import ConfigError
from pipeline.items.answers import answer_table, normalize_answer, soft_scores
from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.store import write_records


def dump(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "data"
    dump(
        r / "coco/captions_train2014.json",
        {
            "images": [
                {"id": 9, "file_name": "COCO_train2014_000000000009.jpg"},
                {"id": 25, "file_name": "COCO_train2014_000000000025.jpg"},
            ],
            "annotations": [
                {"image_id": 9, "caption": "A plate  of food."},
                {"image_id": 9, "caption": "Dinner."},
                {"image_id": 25, "caption": "A giraffe."},
            ],
        },
    )
    dump(
        r / "coco/captions_val2014.json",
        {
            "images": [{"id": 42, "file_name": "COCO_val2014_000000000042.jpg"}],
            "annotations": [{"image_id": 42, "caption": "A dog."}],
        },
    )
    dump(
        r / "vg/image_data.json",
        [
            {"image_id": 1, "coco_id": 9, "url": "u"},
            {"image_id": 2, "coco_id": 42, "url": "u"},
            {"image_id": 3, "coco_id": None, "url": "u"},
            {"image_id": 4, "coco_id": None, "url": "u"},
        ],
    )
    dump(
        r / "vg/region_descriptions.json",
        [
            {"id": 1, "regions": [{"phrase": "red   plate", "image_id": 1}, {"phrase": "fork", "image_id": 1}]},
            {"id": 3, "regions": [{"phrase": "a tall tree", "image_id": 3}]},
        ],
    )
    dump(
        r / "vqa/v2_OpenEnded_mscoco_train2014_questions.json",
        {
            "info": {},
            "questions": [
                {"image_id": 9, "question": "What is on the plate?", "question_id": 90},
                {"image_id": 25, "question": "How many giraffes?", "question_id": 250},
            ],
        },
    )
    dump(
        r / "vqa/v2_mscoco_train2014_annotations.json",
        {
            "annotations": [
                {
                    "question_id": 90,
                    "image_id": 9,
                    "answers": [{"answer": a} for a in ["Food", "food.", "food", "pizza"] + ["the food"] * 6],
                },
                {
                    "question_id": 250,
                    "image_id": 25,
                    "answers": [{"answer": a} for a in ["two"] * 2 + ["2"] * 2 + ["one"] * 6],
                },
            ]
        },
    )
    dump(
        r / "gqa/train_balanced_questions.json",
        {
            "q1": {"imageId": "3", "question": "Is the tree tall?", "answer": "Yes"},
            "q2": {"imageId": "1", "question": "Is there a fork?", "answer": "yes"},
        },
    )
    dump(
        r / "vg/question_answers.json",
        [
            {"id": 4, "qas": [{"question": "How many birds?", "answer": "Two.", "image_id": 4}]},
            {"id": 2, "qas": [{"question": "What animal?", "answer": "A dog", "image_id": 2}]},
        ],
    )
    (r / "minival_ids.txt").write_text("COCO_val2014_000000000042\n")
    spec = {
        "name": "small",
        "image_data": "vg/image_data.json",
        "heldout": ["minival_ids.txt"],
        "answers": {"top_k": 3},
        "sources": [
            {
                "name": "mscoco",
                "kind": "coco_captions",
                "files": ["coco/captions_train2014.json", "coco/captions_val2014.json"],
            },
            {"name": "vg", "kind": "vg_regions", "files": ["vg/region_descriptions.json"]},
            {
                "name": "vqa",
                "kind": "vqa",
                "files": [
                    "vqa/v2_OpenEnded_mscoco_train2014_questions.json",
                    "vqa/v2_mscoco_train2014_annotations.json",
                ],
            },
            {"name": "gqa", "kind": "gqa", "files": ["gqa/train_balanced_questions.json"]},
            {"name": "visual7w", "kind": "vgqa", "files": ["vg/question_answers.json"]},
        ],
    }
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
    dump(
        r / "lxmert/mscoco_train.json",
        [
            {
                "img_id": "COCO_train2014_000000000009",
                "sentf": {"mscoco": ["A plate."], "vqa": ["What food?"]},
                "labelf": {"vqa": [{"pizza": 1.0, "Food": 0.3}]},
            }
        ],
    )
    dump(
        r / "lxmert/vgnococo.json",
        [{"img_id": "2354786", "sentf": {"vg": ["a tree"], "gqa": ["Is it tall?"]}, "labelf": {"gqa": [{"yes": 1.0}]}}],
    )
    dump(r / "lxmert/mscoco_minival.json", [{"img_id": "COCO_val2014_000000000042", "sentf": {"mscoco": ["A dog."]}}])
    (r / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "lx",
                "answers": {"top_k": 10},
                "sources": [
                    {"name": "lxmert", "kind": "lxmert", "files": ["lxmert/mscoco_train.json", "lxmert/vgnococo.json"]},
                    {"name": "minival", "kind": "lxmert", "files": ["lxmert/mscoco_minival.json"], "split": "val"},
                ],
            }
        )
    )
    manifest = build_mixture(MixtureSpec.load(r / "spec.yaml"), tmp_path / "mix")
    rows = {row["uid"]: row for row in items(tmp_path / "mix")}
    assert set(rows) == {
        "COCO_train2014_000000000009_mscoco_000",
        "COCO_train2014_000000000009_vqa_000",
        "2354786_vg_000",
        "2354786_gqa_000",
        "COCO_val2014_000000000042_mscoco_000",
    }
    assert rows["COCO_val2014_000000000042_mscoco_000"]["split"] == "val"
    answers = json.loads((tmp_path / "mix" / "answers.json").read_text())["answers"]
    q = rows["COCO_train2014_000000000009_vqa_000"]
    assert {answers[i]: s for i, s in zip(q["answer_ids"], q["answer_scores"])} == pytest.approx(
        {"pizza": 1.0, "food": 0.3}
    )
    assert manifest["totals"] == {"train/caption": 2, "train/question": 2, "val/caption": 1}


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("Yes", "yes"),
        ("two", "2"),
        ("A dog.", "dog"),
        ("the Red one", "red 1"),
        ("1,000", "1000"),
        ("2.5", "2.5"),
        ("grey", "gray"),
        ("dont know", "don't know"),
        ("tennis-racket", "tennis racket"),
        ("cat!", "cat"),
        ("None", "0"),
        ("  Ten ", "10"),
        ("an apple", "apple"),
        ("(yes)", "yes"),
        ("hot dog?", "hot dog"),
        # the official contraction table exactly: "shed", "wed", "lets" are words, "oclock" is one
        ("shed", "shed"),
        ("wed", "wed"),
        ("lets", "lets"),
        ("oclock", "o'clock"),
        ("somebody'd", "somebodyd"),
    ],
)
def test_answer_normalization_follows_the_vqa_evaluation(raw, clean):
    assert normalize_answer(raw) == clean


def test_soft_scores_and_table():
    # BUTD's get_score on the number of annotators giving the answer: the official VQA
    # accuracy averaged over the 10-choose-9 annotator subsets when 10 annotators answer
    ten = ["x"] + ["b"] * 2 + ["c"] * 3 + ["d"] * 4
    assert soft_scores(ten) == {"x": 0.3, "b": 0.6, "c": 0.9, "d": 1.0}
    assert soft_scores(["e"] * 7 + ["", "the", "f"]) == {"e": 1.0, "f": 0.3}
    from collections import Counter

    assert answer_table(Counter({"b": 2, "a": 2, "c": 5}), 2) == ["c", "a"]


def test_malformed_inputs_name_file_and_location(tmp_path, root):
    (root / "vg" / "region_descriptions.json").write_text(
        '[{"id": 1, "regions": [{"phrase": "x"}]}, {"id": 2, "regions": ]'
    )
    with pytest.raises(ConfigError, match=r"region_descriptions.json: invalid JSON.*at character"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    dump(root / "vg" / "region_descriptions.json", [{"id": 1}])
    with pytest.raises(ConfigError, match=r"region_descriptions.json:\[0\]: needs regions"):  # file:where
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert not (tmp_path / "mix").exists()
    (root / "bad.yaml").write_text(yaml.safe_dump({"name": "x", "sources": [{"kind": "nope", "files": ["a"]}]}))
    with pytest.raises(ConfigError, match="kind"):
        MixtureSpec.load(root / "bad.yaml")


def test_stores_check_lists_missing_images(tmp_path, root):
    rng = np.random.default_rng(0)
    have = ["COCO_train2014_000000000009", "COCO_train2014_000000000025", "COCO_val2014_000000000042", "3"]
    write_records(tmp_path / "feats", [make_record(rng, i, feature_dim=8) for i in have], feature_dim=8)
    proc = run_cli(
        "build-mixture", "--spec", root / "spec.yaml", "--out", tmp_path / "mix", "--stores", tmp_path / "feats"
    )
    assert proc.returncode == 2 and "1 images have no features" in proc.stderr and "(e.g. 4)" in proc.stderr
    proc = run_cli(
        "build-mixture",
        "--spec",
        root / "spec.yaml",
        "--out",
        tmp_path / "mix",
        "--stores",
        tmp_path / "feats",
        "--drop-missing",
    )
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
    assert {r["source"] for r in renamed} == {
        "mscoco",
        "vg",
        "vqa",
        "gqa",
    }  # captions, VG regions via coco_id, questions
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
    spec_path.write_text(
        (
            __import__("pathlib").Path(__file__).resolve().parents[2]
            / "data_manifests"
            / "mixtures"
            / "vilbert_cc.yaml"
        ).read_text()
    )
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
    dump(
        data / "vqa/v2_OpenEnded_mscoco_val2014_questions.json",
        {"questions": [{"image_id": 42, "question": "What animal?", "question_id": 420}]},
    )
    dump(
        data / "vqa/v2_mscoco_val2014_annotations.json",
        {"annotations": [{"question_id": 420, "answers": [{"answer": "dog"}] * 10}]},
    )
    dump(data / "gqa/val_balanced_questions.json", {})
    spec = Path(__file__).resolve().parents[2] / "data_manifests" / "mixtures" / "lxmert.yaml"
    manifest = build_mixture(MixtureSpec.load(spec, root=data), tmp_path / "mix")
    assert manifest["totals"] == {"train/caption": 6, "train/question": 5, "val/caption": 1, "val/question": 2}
    assert manifest["answers"]["top_k"] == 9500 and manifest["answers"]["table_size"] == 5  # food pizza 2 1 yes


# ----------------------------------------------------------------------------- hardening


def edit_spec(root, **changes):
    """Rewrite root/spec.yaml with top-level keys changed (None removes a key)."""
    spec = yaml.safe_load((root / "spec.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    return spec


def tree(path):
    """Every file under `path` (relative name -> bytes), to show nothing was touched."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_out_onto_a_folder_with_user_files_is_refused(tmp_path, root):
    mine = tmp_path / "thesis"
    (mine / "chapters").mkdir(parents=True)
    (mine / "chapters" / "one.tex").write_text("my work")
    before = tree(mine)
    with pytest.raises(ConfigError, match=r"thesis.*not written by vlprep build-mixture.*chapters"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), mine)
    assert tree(mine) == before


def test_out_onto_a_feature_store_is_refused(tmp_path, root):
    write_records(
        tmp_path / "feats",
        [make_record(np.random.default_rng(0), "COCO_train2014_000000000009", feature_dim=8)],
        feature_dim=8,
    )
    before = tree(tmp_path / "feats")
    with pytest.raises(ConfigError, match="feats"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "feats")
    assert tree(tmp_path / "feats") == before


@pytest.mark.parametrize("out", ["..", "."])
def test_out_onto_the_current_folder_or_its_parent_is_refused(tmp_path, root, monkeypatch, out):
    sub = tmp_path / "work" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "work" / "notes.txt").write_text("keep me")
    (sub / "draft.txt").write_text("keep me too")
    monkeypatch.chdir(sub)
    before = tree(tmp_path / "work")
    with pytest.raises(ConfigError, match="current folder"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), Path(out))
    assert tree(tmp_path / "work") == before


def test_out_onto_the_specs_folder_is_refused(tmp_path, root):
    before = tree(root)
    with pytest.raises(ConfigError, match=r"spec\.yaml"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), root)
    assert tree(root) == before


def test_out_onto_a_symlink_or_a_file_is_refused(tmp_path, root):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "x.txt").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match="symbolic link"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "link")
    (tmp_path / "file").write_text("f")
    with pytest.raises(ConfigError, match="not a folder"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "file")
    assert (tmp_path / "real" / "x.txt").read_text() == "x" and (tmp_path / "file").read_text() == "f"


def test_cli_out_parent_folder_exits_2_and_deletes_nothing(tmp_path, root):
    sub = tmp_path / "work" / "sub"
    sub.mkdir(parents=True)
    (tmp_path / "work" / "notes.txt").write_text("keep me")
    proc = run_cli("build-mixture", "--spec", root / "spec.yaml", "--out", "..", cwd=sub)
    assert proc.returncode == 2, proc.stderr
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "work" / "notes.txt").read_text() == "keep me" and sub.is_dir()


def test_out_onto_an_earlier_mixture_or_an_empty_folder(tmp_path, root):
    spec = MixtureSpec.load(root / "spec.yaml")
    (tmp_path / "empty").mkdir()
    build_mixture(spec, tmp_path / "empty")
    assert (tmp_path / "empty" / "items.arrow").exists()
    build_mixture(spec, tmp_path / "mix")
    (tmp_path / "mix" / "items.arrow").write_bytes(b"old")
    build_mixture(spec, tmp_path / "mix")  # an earlier mixture is replaced
    assert items(tmp_path / "mix") == items(tmp_path / "empty")
    # a mixture written before the ownership marker existed (manifest.json only) is ours too
    (tmp_path / "mix" / ".vlprep-output.json").unlink()
    build_mixture(spec, tmp_path / "mix")
    assert items(tmp_path / "mix") == items(tmp_path / "empty")
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert leftovers == []


def test_missing_stores_path_is_a_config_error(tmp_path, root):
    proc = run_cli(
        "build-mixture", "--spec", root / "spec.yaml", "--out", tmp_path / "mix", "--stores", tmp_path / "nope"
    )
    assert proc.returncode == 2 and "--stores" in proc.stderr and "nope" in proc.stderr, proc.stderr
    assert not (tmp_path / "mix").exists()


# -- item 13: specs are validated against a schema


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda s: s.update(heldot=["minival_ids.txt"]),
            r"spec\.yaml: unknown key 'heldot' \(did you mean 'heldout'\?\)",
        ),
        (lambda s: s.update(imagemap="map.tsv"), r"unknown key 'imagemap' \(did you mean 'image_map'\?\)"),
        (lambda s: s.update(answers={"topk": 5}), r"answers: unknown key 'topk' \(did you mean 'top_k'\?\)"),
        (lambda s: s["sources"][2].update(topk=5), r"sources\[2\]: unknown key 'topk'"),
        (
            lambda s: s["sources"][3].update(split="validation"),
            r"sources\[3\]\.split: must be one of train, val \(got 'validation'\)",
        ),
        (lambda s: s.update(answers={"top_k": -1}), r"answers\.top_k: must be >= 0 \(got -1\)"),
        (lambda s: s["sources"][0].update(weight=float("nan")), r"sources\[0\]\.weight: must be a finite number"),
        (lambda s: s["sources"][0].update(weight=float("inf")), r"sources\[0\]\.weight: must be a finite number"),
        (lambda s: s["sources"][0].update(weight=0), r"sources\[0\]\.weight: must be > 0"),
        (lambda s: s["sources"][0].update(repeat="abc"), r"sources\[0\]\.repeat: must be an integer \(got 'abc'\)"),
        (lambda s: s["sources"][0].update(repeat=0), r"sources\[0\]\.repeat: must be >= 1"),
        (lambda s: s["sources"][0].update(repeat=True), r"sources\[0\]\.repeat: must be an integer"),
        (
            lambda s: s["sources"][0].update(files="coco/captions_train2014.json"),
            r"sources\[0\]\.files: must be a list of strings",
        ),
        (lambda s: s["sources"][0].update(kind="coco"), r"sources\[0\]\.kind: must be one of coco_captions, "),
        (lambda s: s.update(heldout="minival_ids.txt"), r"heldout: must be a list of strings"),
        (lambda s: s.update(drop_coco_test="yes"), r"drop_coco_test: must be true or false"),
        (lambda s: s.pop("sources"), r"missing required key 'sources'"),
    ],
)
def test_spec_is_validated_with_the_key_and_file_named(root, change, message):
    spec = yaml.safe_load((root / "spec.yaml").read_text())
    change(spec)
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=message):
        MixtureSpec.load(root / "spec.yaml")


def test_spec_lists_every_problem_at_once(root):
    spec = yaml.safe_load((root / "spec.yaml").read_text())
    spec["sources"][1]["file"] = spec["sources"][1].pop("files")
    spec["sources"][4]["repeat"] = -2
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError) as err:
        MixtureSpec.load(root / "spec.yaml")
    text = str(err.value)
    assert "sources[1]: unknown key 'file' (did you mean 'files'?)" in text
    assert "sources[1]: missing required key 'files'" in text and "sources[4].repeat: must be >= 1" in text


def test_top_k_zero_and_the_cli_override(tmp_path, root):
    assert MixtureSpec.load(root / "spec.yaml", top_k=0).top_k == 0  # 0: no answer table (captions only)
    with pytest.raises(ConfigError, match="--top-k"):
        MixtureSpec.load(root / "spec.yaml", top_k=-1)


def test_schema_helper_on_its_own():
    from pipeline.schema import Field, Schema

    item = Schema(
        {
            "name": Field(str, required=True),
            "n": Field(int, default=3, ge=1),
            "tags": Field(str, many=True, default=()),
            "mode": Field(str, choices=("a", "b")),
        }
    )
    outer = Schema({"items": Field(item, many=True, required=True), "scale": Field(float, gt=0, default=1.0)})
    got = outer.validate({"items": [{"name": "x"}, {"name": "y", "n": 5, "tags": ["t"], "mode": "b"}]}, "f.yaml")
    assert got == {
        "items": ({"name": "x", "n": 3, "tags": (), "mode": None}, {"name": "y", "n": 5, "tags": ("t",), "mode": "b"}),
        "scale": 1.0,
    }
    with pytest.raises(ConfigError, match=r"f\.yaml: items\[1\]\.tags: must be a list of strings \(got a string\)"):
        outer.validate({"items": [{"name": "x"}, {"name": "y", "tags": "t"}]}, "f.yaml")
    with pytest.raises(ConfigError, match=r"f\.yaml: must be a mapping"):
        outer.validate(["x"], "f.yaml")


# -- item 14: image map duplicates, empty and null texts and answers


def test_image_map_duplicate_id_with_another_target_is_refused(tmp_path, root):
    (root / "map.tsv").write_text(
        "COCO_train2014_000000000009\tcc-7\n"
        "COCO_train2014_000000000025\tcc-8\n"
        "COCO_train2014_000000000009\tcc-7\n"  # the same line again: accepted
        "COCO_train2014_000000000009\tcc-9\n"
    )
    edit_spec(root, image_map="map.tsv")
    with pytest.raises(ConfigError, match=r"map\.tsv:4: .*'COCO_train2014_000000000009'.*'cc-9'.*line 1.*'cc-7'"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    (root / "map.tsv").write_text("COCO_train2014_000000000009\tcc-7\nCOCO_train2014_000000000009\tcc-7\n")
    build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert any(r["image_id"] == "cc-7" for r in items(tmp_path / "mix"))


def test_empty_and_null_texts_and_answers_are_skipped_and_counted(tmp_path, root):
    path = root / "coco/captions_train2014.json"
    coco = json.loads(path.read_text())
    coco["annotations"] += [
        {"image_id": 25, "caption": "   "},
        {"image_id": 25, "caption": None},
        {"image_id": 25, "caption": ""},
    ]
    dump(path, coco)
    dump(
        root / "vg/region_descriptions.json",
        [
            {"id": 1, "regions": [{"phrase": "red   plate", "image_id": 1}, {"phrase": None, "image_id": 1}]},
            {"id": 3, "regions": [{"phrase": "a tall tree", "image_id": 3}, {"phrase": " \n", "image_id": 3}]},
        ],
    )
    dump(
        root / "vg/question_answers.json",
        [
            {
                "id": 4,
                "qas": [
                    {"question": "How many birds?", "answer": "Two.", "image_id": 4},
                    {"question": "What colour?", "answer": None, "image_id": 4},
                    {"question": None, "answer": "red", "image_id": 4},
                ],
            },
            {"id": 2, "qas": [{"question": "What animal?", "answer": "A dog", "image_id": 2}]},
        ],
    )
    path = root / "vqa/v2_mscoco_train2014_annotations.json"
    vqa = json.loads(path.read_text())
    vqa["annotations"][1]["answers"][0]["answer"] = None  # one annotator's answer is null: the others count
    dump(path, vqa)
    dump(
        root / "gqa/train_balanced_questions.json",
        {
            "q1": {"imageId": "3", "question": "Is the tree tall?", "answer": "Yes"},
            "q2": {"imageId": "1", "question": "Is there a fork?", "answer": None},
        },
    )
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    rows = items(tmp_path / "mix")
    assert all(r["text"].strip() and r["text"] != "None" for r in rows)
    assert manifest["skipped"] == {
        "mscoco": {"empty text": 2, "null text": 1},
        "vg": {"empty text": 1, "null text": 1},
        "gqa": {"null answer": 1},
        "visual7w": {"null answer": 1, "null text": 1},
    }
    assert manifest["counts"]["vqa"] == {"train/question": 2}
    giraffes = next(r for r in rows if r["text"] == "How many giraffes?")
    assert len(giraffes["answer_ids"]) >= 1
    report = (tmp_path / "mix" / "report.md").read_text()
    assert "## Skipped annotations" in report and "| mscoco | 2 | 0 | 1 |" in report


# -- item 15: held-out and drop lists


def test_heldout_and_drop_ids_given_as_vg_ids_match_renamed_images(tmp_path, root):
    (root / "gqa_heldout.txt").write_text("1\n")  # VG 1 is COCO_train2014_...09: GQA names it by its VG id
    (root / "drop.txt").write_text("2\n")  # VG 2 is COCO_val2014_...42
    edit_spec(root, heldout=["minival_ids.txt", "gqa_heldout.txt"], drop=["drop.txt"])
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    rows = items(tmp_path / "mix")
    nine = [r for r in rows if r["image_id"] == "COCO_train2014_000000000009"]
    assert {r["source"] for r in nine} == {"mscoco", "vg", "vqa", "gqa"} and {r["split"] for r in nine} == {"val"}
    assert not any(r["image_id"] == "COCO_val2014_000000000042" for r in rows)
    assert manifest["heldout"] == [
        {"path": str(root / "minival_ids.txt"), "ids": 1, "matched": 1, "unmatched": 0, "unmatched_examples": []},
        {"path": str(root / "gqa_heldout.txt"), "ids": 1, "matched": 1, "unmatched": 0, "unmatched_examples": []},
    ]
    assert manifest["drop"] == [
        {"path": str(root / "drop.txt"), "ids": 1, "matched": 1, "unmatched": 0, "unmatched_examples": []}
    ]


def test_heldout_list_matching_nothing_is_an_error_and_partial_matches_are_counted(tmp_path, root, caplog):
    (root / "minival_ids.txt").write_text("COCO_val2014_000000000042\nCOCO_val2014_000000099999\n")
    with caplog.at_level("WARNING"):
        manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert manifest["heldout"][0] == {
        "path": str(root / "minival_ids.txt"),
        "ids": 2,
        "matched": 1,
        "unmatched": 1,
        "unmatched_examples": ["COCO_val2014_000000099999"],
    }
    assert "minival_ids.txt" in caplog.text and "1 of its 2 ids match no image" in caplog.text
    (root / "minival_ids.txt").write_text("val_000042\nval_000043\n")
    with pytest.raises(ConfigError, match=r"minival_ids\.txt: none of its 2 ids .*val_000042"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix2")
    assert not (tmp_path / "mix2").exists() and not list(tmp_path.glob(".tmp-*"))


def test_drop_missing_counts_answers_after_dropping(tmp_path, root):
    rng = np.random.default_rng(0)
    have = ["COCO_train2014_000000000009", "COCO_train2014_000000000025", "COCO_val2014_000000000042", "3"]
    write_records(tmp_path / "feats", [make_record(rng, i, feature_dim=8) for i in have], feature_dim=8)
    manifest = build_mixture(
        MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix", stores=(tmp_path / "feats",), drop_missing=True
    )
    table = json.loads((tmp_path / "mix" / "answers.json").read_text())
    counts = dict(zip(table["answers"], table["counts"]))
    assert counts["2"] == 1  # VQA's "How many giraffes?"; image 4's "How many birds?" ("Two.") is dropped
    assert manifest["answers"]["distinct_train_answers"] == 5  # food pizza 2 1 yes


# -- item 16: temporary folders of failed and killed builds


def test_a_failed_build_removes_its_temporary_folder(tmp_path, root):
    (root / "vg" / "region_descriptions.json").write_text(
        '[{"id": 1, "regions": [{"phrase": "x"}]}, {"id": 2, "regions": ]'
    )
    with pytest.raises(ConfigError, match="invalid JSON"):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert not (tmp_path / "mix").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_killed_build_leftovers_are_removed_and_a_second_writer_is_refused(tmp_path, root):
    """A build blocked reading its input (a FIFO) holds the out's lock: a second build of the
    same out exits 75 at once; after SIGKILL the next build removes the killed one's temp folder."""
    import os
    import signal
    import subprocess
    import sys
    import time

    fifo_root = tmp_path / "fifo"
    fifo_root.mkdir()
    os.mkfifo(fifo_root / "regions.json")
    (fifo_root / "spec.yaml").write_text(
        yaml.safe_dump(
            {"name": "blocked", "sources": [{"name": "vg", "kind": "vg_regions", "files": ["regions.json"]}]}
        )
    )
    from helpers import REPO

    blocked = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "build-mixture",
            "--spec",
            str(fifo_root / "spec.yaml"),
            "--out",
            str(tmp_path / "mix"),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob(".tmp-mix.*")):
            assert blocked.poll() is None, blocked.stderr.read()
            assert time.monotonic() < deadline, "the blocked build never made its temporary folder"
            time.sleep(0.05)
        second = run_cli("build-mixture", "--spec", root / "spec.yaml", "--out", tmp_path / "mix")
        assert second.returncode == 75 and "another process" in second.stderr, second.stderr
        assert list(tmp_path.glob(".tmp-mix.*"))  # the live build's folder was left alone
    finally:
        blocked.send_signal(signal.SIGKILL)
        blocked.wait()
    assert list(tmp_path.glob(".tmp-mix.*"))  # SIGKILL runs no cleanup
    run_cli("build-mixture", "--spec", root / "spec.yaml", "--out", tmp_path / "mix", check=True)
    assert (tmp_path / "mix" / "items.arrow").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_demo_spec_for_a_relative_out_folder_loads(tmp_path, monkeypatch):
    """`vlprep demo` (default --out vlprep_demo, relative) writes its mixture spec beside the
    world: the file paths in it must not be taken relative to the spec's folder twice."""
    from pipeline.synthetic import write_world
    from vl_models.demo import mixture_spec

    monkeypatch.chdir(tmp_path)
    world = Path("vlprep_demo") / "world"
    write_world(world, 4, 0, val_fraction=0.25)
    spec_path = Path("vlprep_demo") / "lxmert_mix_spec.yaml"
    spec_path.write_text(yaml.safe_dump(mixture_spec(world)))
    manifest = build_mixture(MixtureSpec.load(spec_path), Path("vlprep_demo") / "lxmert_mix")
    assert manifest["totals"]["train/caption"] > 0 and manifest["totals"]["val/question"] > 0


# -- official VQA soft scores; mixture schema 2


def test_official_steps_are_reusable_without_lxmerts_rules():
    from pipeline.items.answers import process_digit_article, process_punctuation

    assert process_punctuation("hot-dog") == "hot dog" and process_punctuation("1,000") == "1000"
    assert process_punctuation("yes!").strip() == "yes" and process_punctuation("2.5") == "2.5"
    assert process_digit_article("The Two dogs") == "2 dogs" and process_digit_article("dont") == "don't"
    assert process_digit_article("grey") == "grey" and normalize_answer("grey") == "gray"  # LXMERT's rule only


def test_mixture_records_schema_2_and_official_scores(tmp_path, root):
    edit_spec(root, answers={"top_k": 10})
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert manifest["schema_version"] == 2 and manifest["answer_scores"] == "vqa-official"
    on_disk = json.loads((tmp_path / "mix" / "manifest.json").read_text())
    assert on_disk["schema_version"] == 2 and on_disk["answer_scores"] == "vqa-official"
    with pa.ipc.open_file(tmp_path / "mix" / "items.arrow") as f:
        assert f.schema.metadata[b"vlprep.mixture_schema_version"] == b"2"
    answers = json.loads((tmp_path / "mix" / "answers.json").read_text())["answers"]
    food = next(r for r in items(tmp_path / "mix") if r["text"] == "What is on the plate?")
    scores = {answers[i]: s for i, s in zip(food["answer_ids"], food["answer_scores"])}
    # 9 of 10 annotators say food (Food, food., food, the food x6), 1 says pizza
    assert scores == {"food": 1.0, "pizza": np.float32(0.3)}


# -- a fixed answer table (answers_from)

TABLE = ["yes", "2", "food", "dog"]


@pytest.mark.parametrize(
    "name, content",
    [
        ("label2ans.json", json.dumps(TABLE)),  # VQA's trainval_label2ans.json
        ("all_ans.json", json.dumps([{"ans": a, "dsets": ["vqa"]} for a in TABLE])),  # LXMERT's all_ans.json
        ("answers.json", json.dumps({"answers": TABLE, "counts": [0, 0, 0, 0]})),  # another mixture's table
        ("answers.txt", "\n".join(TABLE) + "\n"),  # one answer a line
    ],
)
def test_answers_from_each_format_keeps_the_files_order(tmp_path, root, name, content):
    (root / "tables").mkdir()
    (root / "tables" / name).write_text(content)
    edit_spec(root, answers_from=f"tables/{name}", answers=None)
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    table = json.loads((tmp_path / "mix" / "answers.json").read_text())
    assert table["answers"] == TABLE  # the file's order, not by frequency
    assert table["counts"] == [2, 2, 1, 0]  # train questions: yes (gqa x2), 2 (vqa, visual7w), food (vqa)
    import hashlib

    assert manifest["answers"]["file"] == {
        "path": str(root / "tables" / name),
        "name": name,
        "entries": 4,
        "sha256": hashlib.sha256(content.encode()).hexdigest(),
    }
    assert manifest["answers"]["table_size"] == 4 and manifest["answers"]["top_k"] is None
    assert str(root / "tables" / name) in [i["path"] for i in manifest["inputs"]]
    rows = {r["text"]: r for r in items(tmp_path / "mix")}
    giraffes = rows["How many giraffes?"]
    assert [TABLE[i] for i in giraffes["answer_ids"]] == ["2"]  # "1" is not in the table: dropped
    assert f"from {name}" in (tmp_path / "mix" / "report.md").read_text()


def test_answers_from_normalizes_entries_and_keeps_every_position(tmp_path, root, caplog):
    """LXMERT's all_ans.json holds entries that our normalization merges ("above the bed" and
    "above bed") or empties ("a"): they keep their position (answer ids stay the file's, so
    a 9500-way head lines up with LXMERT's) but no item maps to them; the manifest counts them."""
    entries = ['"stop"', "Two", "2", "a", "the food", "food", "yes"]
    dump(root / "all_ans.json", [{"ans": a} for a in entries])
    edit_spec(root, answers_from="all_ans.json", answers=None)
    with caplog.at_level("WARNING"):
        manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    table = json.loads((tmp_path / "mix" / "answers.json").read_text())
    assert table["answers"] == ["stop", "2", "2", "", "food", "food", "yes"]
    assert table["unreachable"] == [2, 3, 5] and table["counts"] == [0, 2, 0, 0, 1, 0, 2]
    assert manifest["answers"]["table_size"] == 7 and manifest["answers"]["unreachable"] == 3
    assert manifest["answers"]["unreachable_examples"][0] == {"id": 2, "entry": "2", "answer": "2", "first_id": 1}
    assert manifest["answers"]["unreachable_examples"][1] == {"id": 3, "entry": "a", "answer": "", "first_id": None}
    assert "all_ans.json: 3 of its 7 entries" in caplog.text
    giraffes = next(r for r in items(tmp_path / "mix") if r["text"] == "How many giraffes?")
    assert giraffes["answer_ids"] == [1]  # "2" maps to its first position


def test_answers_from_with_top_k_takes_the_first_k_entries(tmp_path, root):
    dump(root / "label2ans.json", TABLE)
    edit_spec(root, answers_from="label2ans.json", answers={"top_k": 2})
    build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert json.loads((tmp_path / "mix" / "answers.json").read_text())["answers"] == ["yes", "2"]
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml", top_k=3), tmp_path / "mix")  # --top-k
    assert manifest["answers"]["table_size"] == 3 and manifest["answers"]["top_k"] == 3
    assert manifest["answers"]["file"]["entries"] == 4
    edit_spec(root, answers={"top_k": 0})
    with pytest.raises(ConfigError, match=r"answers\.top_k: 0 .*label2ans\.json"):
        MixtureSpec.load(root / "spec.yaml")


def test_answers_from_coverage(tmp_path, root):
    dump(root / "label2ans.json", ["yes", "dog"])
    edit_spec(root, answers_from="label2ans.json", answers=None)
    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    a = manifest["answers"]
    # 5 answered train questions (food, giraffes, 2 x gqa yes, birds); their best answers food, 2, yes, yes, 2
    assert a["questions_best_answer_covered"] == round(2 / 5, 4)
    # score mass: food 1 + pizza 0.3, 2 + 1, yes, yes, 2 -> 6.3, of which yes + yes
    assert a["score_mass_covered"] == round(2 / 6.3, 4)
    assert a["distinct_train_answers"] == 5
    report = (tmp_path / "mix" / "report.md").read_text()
    assert "training questions whose best answer is in the table: 0.4" in report


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("t.json", '{"label2ans": ["yes"]}', r"t\.json: an answer table is a JSON list of strings"),
        ("t.json", '["yes", 3]', r"t\.json: entry 1: must be a string \(got 3\)"),
        ("t.json", '[{"ans": "yes"}, {"answer": "no"}]', r"t\.json: entry 1: .*\"ans\""),
        ("t.json", '{"answers": "yes"}', r"t\.json: an answer table is a JSON list"),
        ("t.json", '["yes",', r"t\.json: invalid JSON"),
        ("t.json", "[]", r"t\.json: no answers"),
        ("t.txt", "\n\nthe\n", r"t\.txt: no answers"),
    ],
)
def test_answers_from_errors_name_the_file_and_entry(tmp_path, root, name, content, message):
    (root / name).write_text(content)
    edit_spec(root, answers_from=name, answers=None)
    with pytest.raises(ConfigError, match=message):
        build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    assert not (tmp_path / "mix").exists()


def test_answers_from_is_validated_and_must_exist(tmp_path, root):
    edit_spec(root, answers_from=["a.json"])
    with pytest.raises(ConfigError, match=r"answers_from: must be a string"):
        MixtureSpec.load(root / "spec.yaml")
    edit_spec(root, answers_from="nope.json")
    with pytest.raises(ConfigError, match=r"input files not found: .*nope\.json"):
        MixtureSpec.load(root / "spec.yaml")


# -- one reader of the format, `Mixture.open`


def test_mixture_open_gives_items_answers_splits_and_rows(tmp_path, root):
    import pickle

    from pipeline.mixture import Mixture

    manifest = build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    before = pa.total_allocated_bytes()
    mix = Mixture.open(tmp_path / "mix")
    assert pa.total_allocated_bytes() == before  # items.arrow is memory-mapped, not read into memory
    rows = items(tmp_path / "mix")
    assert (
        mix.manifest == json.loads((tmp_path / "mix" / "manifest.json").read_text())
        and mix.manifest["totals"] == manifest["totals"]
    )
    assert mix.answers == json.loads((tmp_path / "mix" / "answers.json").read_text())["answers"] == ["2", "yes", "1"]
    assert len(mix) == len(rows) and mix.items.to_pylist() == rows
    assert mix.splits == ("train", "val")
    for split in mix.splits:
        assert mix.rows(split).tolist() == [i for i, r in enumerate(rows) if r["split"] == split]
    assert mix.rows("test").tolist() == []
    assert mix.store_keys.tolist() == [r["store_key"] for r in rows] and mix.kinds.tolist() == [r["kind"] for r in rows]
    giraffes = next(i for i, r in enumerate(rows) if r["text"] == "How many giraffes?")
    assert mix.text(giraffes) == "How many giraffes?"
    ids, scores = mix.labels(giraffes)
    assert [mix.answers[i] for i in ids] == ["2", "1"] and scores == [1.0, 1.0]
    assert mix.labels(0) == ([], [])  # a caption
    assert mix.file("items.arrow") == tmp_path / "mix" / "items.arrow"
    copy = pickle.loads(blob := pickle.dumps(mix))  # DataLoader workers: reopened, not copied
    assert len(blob) < 1000 and copy.path == mix.path and copy.items.equals(mix.items)


def test_mixture_open_errors_are_named(tmp_path, root):
    from pipeline.errors import DataError
    from pipeline.mixture import Mixture

    with pytest.raises(ConfigError, match="not a mixture"):
        Mixture.open(root)
    build_mixture(MixtureSpec.load(root / "spec.yaml"), tmp_path / "mix")
    mix = tmp_path / "mix"
    manifest = json.loads((mix / "manifest.json").read_text())
    for version, message in ((1, r"schema 1 stores the old answer scores min\(1, k/3\)"), (3, "schema 3 .*newer")):
        (mix / "manifest.json").write_text(json.dumps({**manifest, "schema_version": version}))
        with pytest.raises(ConfigError, match=message):
            Mixture.open(mix)
    (mix / "manifest.json").write_text(json.dumps(manifest))
    good = {name: (mix / name).read_bytes() for name in ("items.arrow", "answers.json")}
    for name in good:
        (mix / name).unlink()
        with pytest.raises(DataError, match=f"{mix / name} is missing.*vlprep build-mixture"):
            Mixture.open(mix)
        (mix / name).write_bytes(good[name])
    (mix / "answers.json").write_text('{"answer": []}')
    with pytest.raises(DataError, match=r"answers.json: unreadable answer table \(KeyError"):
        Mixture.open(mix)
    (mix / "answers.json").write_bytes(good["answers.json"])
    (mix / "items.arrow").write_bytes(b"not arrow")
    with pytest.raises(DataError, match=r"items.arrow: unreadable"):
        Mixture.open(mix)
    with (
        pa.OSFile(str(mix / "items.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, pa.schema([("uid", pa.string())])) as w,
    ):
        w.write_table(pa.table({"uid": ["a"]}, schema=pa.schema([("uid", pa.string())])))
    with pytest.raises(DataError, match=r"items.arrow: no column image_id, store_key"):
        Mixture.open(mix)


def test_the_item_folder_format_has_one_owner():
    """Mixtures and task datasets are item folders: `pipeline.items` alone names their files,
    and its writer alone writes them (the two builders hand it rows); everything else opens
    them with `Mixture.open` / `TaskData.open`."""
    from pipeline.mixture import build, mixture

    assert build.ITEMS_SCHEMA is mixture.ITEMS_SCHEMA
    repo = Path(__file__).resolve().parents[2]
    modules = sorted(
        [*(repo / "pipeline").rglob("*.py"), *(repo / "vl_models").rglob("*.py"), *(repo / "bench").glob("*.py")]
    )
    owner = repo / "pipeline" / "items" / "folder.py"
    named = [
        str(p.relative_to(repo))
        for p in modules
        if p != owner and any(f'"{name}"' in p.read_text() for name in ("items.arrow", "answers.json"))
    ]
    assert named == []
    builders = [repo / "pipeline" / "mixture" / "build.py", repo / "vl_models" / "transfer" / "build.py"]
    for path in builders:
        text = path.read_text()
        assert "ItemsWriter(" in text and "pa.ipc.new_file" not in text and "atomic_write_json" not in text, path


def test_a_spec_with_yaml_aliases_or_deep_nesting_is_refused_at_once(tmp_path):
    """A "billion laughs" spec (aliases of aliases) would expand to gigabytes; it is refused
    before anything is expanded, as is nesting that would overflow the loader, in one line."""
    laughs = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    laughs += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    (tmp_path / "laughs.yaml").write_text("\n".join(laughs) + "\nname: x\nsources: *i\n")
    with pytest.raises(ConfigError, match="alias") as err:
        MixtureSpec.load(tmp_path / "laughs.yaml")
    assert "\n" not in str(err.value)
    (tmp_path / "deep.yaml").write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="deep"):
        MixtureSpec.load(tmp_path / "deep.yaml")
