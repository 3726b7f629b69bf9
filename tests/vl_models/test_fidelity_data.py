"""Task data as the references build it (issue 39, round 3): VQA targets as BUTD's
compute_target makes them (answers counted as given; checked against its own functions'
output), 12-in-1's clean_datasets (the rows on its test sets' images kept out of training:
``build-task --test-images``, checked against its own loaders' output), GQA's minval over
question ids sorted as strings, LXMERT's nominival.json, and COCO retrieval's 1K test (12-in-1's
one 1K set and the five 1K folds the literature averages)."""

from __future__ import annotations

import copy
import json
import os
import pickle
from collections import Counter

import numpy as np
import pytest
from helpers import REPO, run_cli

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.items.answers import evaluator_answer
from pipeline.sources.base import Malformed
from pipeline.sources.image_ids import image_number, read_image_ids
from pipeline.task_data import TaskData
from vl_models import transfer
from vl_models.eval.metrics import retrieval_metrics
from vl_models.train.recipes import FINETUNE_RECIPE_DIR, load_recipe
from vl_models.transfer.build import build_task
from vl_models.transfer.retrieval import COCO
from vl_models.transfer.task import Predictions, Row

REFERENCE = REPO / "tests" / "reference"


def _fixture(name: str) -> dict:
    return json.loads((REFERENCE / f"{name}.json").read_text())


def write_vqa(root, splits: dict) -> list:
    """VQA v2 files: `splits` maps train2014 / val2014 to (question id, image id, multiple-choice
    answer, answers) rows; returns the file list for build-task."""
    files = []
    for split, rows in splits.items():
        q = root / f"v2_OpenEnded_mscoco_{split}_questions.json"
        questions = [{"image_id": i, "question": f"q {qid}?", "question_id": qid} for qid, i, _, _ in rows]
        q.write_text(json.dumps({"questions": questions}))
        a = root / f"v2_mscoco_{split}_annotations.json"
        annotations = [
            {
                "question_id": qid,
                "answer_type": "other",
                "multiple_choice_answer": mc,
                "answers": [{"answer": x} for x in ans],
            }
            for qid, _, mc, ans in rows
        ]
        a.write_text(json.dumps({"annotations": annotations}))
        files += [q, a]
    return files


def targets_of(data, row) -> dict:
    ids, scores = data.column("answer_ids")[row], data.column("answer_scores")[row]
    return {data.answers[i]: s for i, s in zip(ids or [], scores or [])}


def recipe_split(name: str, key: str = "train_split", task: str = "") -> str:
    values = load_recipe(name, FINETUNE_RECIPE_DIR)[1]
    return values[key][task] if task else values[key]


# --- VQA targets: BUTD's compute_target ------------------------------------------------------


@pytest.fixture(scope="module")
def butd():
    return _fixture("butd_softscore")


def test_the_table_normalization_is_butds_preprocess_answer(butd):
    """The answer tables' normalization (the official evaluator's) gives the strings BUTD's
    ``preprocess_answer`` gives, on every answer of the fixture (t-shirt, Two, 1,000, st.
    patrick's day, dont know, ...)."""
    assert len(butd["preprocess_answer"]) > 60
    assert {a: evaluator_answer(a) for a in butd["preprocess_answer"]} == butd["preprocess_answer"]


def test_vqa_targets_are_butds_compute_target(butd, tmp_path):
    """Each question's targets are what BUTD's ``compute_target`` makes of its ten answers with
    its table (run on the reference code: tests/reference/butd_softscore.py): the answers
    counted as given, so an answer written otherwise than the table's normal form (``T-shirt``,
    ``Two``, ten times ``t-shirt``) scores nothing. The build counts the questions this leaves
    without a target or with other targets than normalized answers would give."""
    questions = butd["questions"]
    files = write_vqa(tmp_path, {"train2014": questions})
    (tmp_path / "label2ans.json").write_text(json.dumps(butd["label2ans"]))
    manifest = build_task(transfer.get("vqa"), files, tmp_path / "t", answers_from=tmp_path / "label2ans.json")
    data = TaskData.open(tmp_path / "t")
    assert data.answers == butd["label2ans"]
    uid = data.column("uid")
    got = {uid[r]: targets_of(data, r) for r in range(len(uid))}
    assert got.keys() == butd["targets"].keys()
    for qid, expected in butd["targets"].items():
        assert got[qid] == pytest.approx(expected), qid
    table, pre = set(butd["label2ans"]), butd["preprocess_answer"]
    wasted = [
        q for q, *_, answers in questions if not butd["targets"][str(q)] and any(pre[a] in table for a in answers)
    ]
    unanimous = [q for q, *_, answers in questions if len(set(answers)) == 1 and pre[answers[0]] != answers[0]]
    assert len(wasted) >= 40 and len(unanimous) >= 20  # the fixture holds both kinds
    assert all(not got[str(q)] for q in unanimous)  # as in the references: no target
    raw = manifest["answers"]["raw_answers"]
    assert raw["no_target"] == {"train": len(wasted)}
    assert raw["other_targets"]["train"] > 0
    assert manifest["answers"]["train_rows_with_target"] == sum(1 for t in butd["targets"].values() if t)
    report = (tmp_path / "t" / "report.md").read_text()
    assert f"{len(wasted)} questions (train {len(wasted)}) have no target" in report


def test_vqa_targets_normalized_train_every_question_an_answer_of_the_table_was_given(butd, tmp_path):
    """``--answer-targets normalized`` counts every annotator answer normalized as the table is
    (what BUTD's ``compute_target`` docstring asks for): ten times ``t-shirt`` trains ``t shirt``
    at 1.0, every question with an answer of the table has a target, and the report names the
    rule; an unknown rule, or one for a task without annotators' answers, is refused."""
    questions = butd["questions"]
    files = write_vqa(tmp_path, {"train2014": questions})
    (tmp_path / "label2ans.json").write_text(json.dumps(butd["label2ans"]))
    table, pre = set(butd["label2ans"]), butd["preprocess_answer"]
    manifest = build_task(
        transfer.get("vqa"),
        files,
        tmp_path / "t",
        answers_from=tmp_path / "label2ans.json",
        answer_targets="normalized",
    )
    data = TaskData.open(tmp_path / "t")
    uid = data.column("uid")
    got = {uid[r]: targets_of(data, r) for r in range(len(uid))}
    for q, *_, answers in questions:
        counts = Counter(pre[a] for a in answers)
        expected = {a: min(1.0, 0.3 * n) if n < 4 else 1.0 for a, n in counts.items() if a in table}
        assert got[str(q)] == pytest.approx(expected), q
    assert manifest["answers"]["targets"] == "normalized"
    assert manifest["answers"]["train_rows_with_target"] == sum(1 for *_, a in questions if {pre[x] for x in a} & table)
    assert "--answer-targets normalized" in (tmp_path / "t" / "report.md").read_text()
    with pytest.raises(ConfigError, match="--answer-targets"):
        build_task(transfer.get("vqa"), files, tmp_path / "x", answer_targets="official")
    with pytest.raises(ConfigError, match="only VQA"):
        build_task(transfer.get("nlvr2"), files, tmp_path / "y", answer_targets="normalized")


# --- 12-in-1's clean_datasets: split test_images --------------------------------------------


@pytest.fixture(scope="module")
def mt_clean():
    return _fixture("vilbert_mt_clean")


@pytest.fixture(scope="module")
def mt_vqa(mt_clean, tmp_path_factory):
    """The fixture's VQA world in the official files, built with and without its test ids."""
    root = tmp_path_factory.mktemp("mt_vqa")
    w = mt_clean["world"]
    yes = ["yes"] * 10
    files = write_vqa(root, {f"{split}2014": [(q, i, "yes", yes) for q, i in w[split]] for split in ("train", "val")})
    np.save(root / "coco_test_ids.npy", np.array(w["coco_test_ids"], np.int64))
    build_task(transfer.get("vqa"), files, root / "clean", min_count=1, test_images=[root / "coco_test_ids.npy"])
    build_task(transfer.get("vqa"), files, root / "plain", min_count=1)
    return root, files


def _uids(data, spec: str) -> list[int]:
    uid = data.column("uid")
    return sorted(int(uid[r]) for r in data.rows(spec))


def test_vqa_recipe_trains_on_what_12in1_keeps_after_clean_datasets(mt_clean, mt_vqa):
    """vilbert-multi-task's ``_load_dataset(..., 'trainval', clean_datasets=True)`` (run on its
    code: tests/reference/vilbert_mt_clean.py) drops the questions on coco_test_ids.npy's images
    from train and from val - minval, never from minval: the recipes' split specs over
    ``test_images`` select exactly its questions, in the single-task and the 12-in-1 recipe."""
    root, _ = mt_vqa
    data = TaskData.open(root / "clean")
    spec = recipe_split("vilbert-vqa")
    assert spec == recipe_split("vilbert-12in1", "task_train_split", "vqa")
    assert _uids(data, spec) == sorted(mt_clean["vqa"]["trainval"])
    assert _uids(data, recipe_split("vilbert-vqa", "val_split")) == sorted(mt_clean["vqa"]["minval"])
    held = data.manifest["test_images"]
    assert (held["ids"], held["images"]) == (5, 4)  # 999999 is no image of the data
    assert held["rows"] == {"train": 4, "val": 2 + 2}  # two questions an image
    assert held["files"][0]["path"].endswith("coco_test_ids.npy") and held["reference_file"] == "coco_test_ids.npy"
    assert "split test_images holds their 8 rows (train 4, val 4)" in (root / "clean" / "report.md").read_text()


def test_recipes_run_on_data_built_without_the_lists(mt_vqa):
    """Without --test-images the split is declared and empty: the recipes' specs take what
    they took before (train + val - minval), and the report says that nothing was held out."""
    root, _ = mt_vqa
    data = TaskData.open(root / "plain")
    assert "test_images" in data.manifest["named_splits"] and "test_images" not in data.splits
    assert _uids(data, recipe_split("vilbert-vqa")) == _uids(data, "train,val-minval")
    assert len(data.rows("train-test_images")) == 40
    assert data.manifest["test_images"]["files"] == []
    assert "No --test-images: split test_images is empty" in (root / "plain" / "report.md").read_text()
    assert "coco_test_ids.npy" in (root / "plain" / "report.md").read_text()


def test_a_task_dataset_of_an_older_build_is_told_to_rebuild(mt_vqa, tmp_path):
    """A folder built before build-task declared its splits has no test_images: subtracting it is
    refused (a misspelling would be) with a word on rebuilding."""
    import shutil

    root, _ = mt_vqa
    shutil.copytree(root / "plain", tmp_path / "old")
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    del manifest["named_splits"]
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="'test_images' is not a split of .*lacks the splits build-task declares now"):
        TaskData.open(tmp_path / "old").rows("train-test_images")


def test_retrieval_training_drops_the_listed_images_as_12in1_does(mt_clean, tmp_path):
    """``_load_annotations('train', ..., clean_datasets=True)`` of RetrievalCOCO and
    RetrievalFlickr30k (run on its code) keeps the training images its coco_test_ids.npy /
    flickr_test_ids.npy do not list: ``train-test_images`` keeps the same images (COCO by cocoid,
    Flickr30k by the number of its file name)."""
    w = mt_clean["world"]
    for task, key, name, ids in (
        ("coco-retrieval", "coco", lambda a: f"COCO_train2014_{a['id']:012d}.jpg", "coco_retrieval_test_ids"),
        ("flickr30k", "flickr", lambda a: a["img_path"], "flickr_test_ids"),
    ):
        images = [
            {
                "filename": name(a),
                "split": "train",
                "sentences": [{"raw": s, "sentid": 100 * i + k} for k, s in enumerate(a["sentences"])],
            }
            for i, a in enumerate(w[f"{key}_retrieval_train"])
        ]
        images.append(
            {"filename": "COCO_val2014_000000000001.jpg", "split": "test", "sentences": [{"raw": "t", "sentid": 9}]}
        )
        (tmp_path / f"{key}.json").write_text(json.dumps({"images": images}))
        (tmp_path / f"{key}_ids.txt").write_text("# listed\n" + "\n".join(map(str, w[ids])) + "\n")
        build_task(
            transfer.get(task), [tmp_path / f"{key}.json"], tmp_path / key, test_images=[tmp_path / f"{key}_ids.txt"]
        )
        data = TaskData.open(tmp_path / key)
        spec = recipe_split("vilbert-12in1", "task_train_split", task)
        kept = sorted({image_number(data.column("group")[r]) for r in data.rows(spec)})
        assert kept == mt_clean["retrieval"][key], task
        assert data.manifest["test_images"]["rows"].get("test", 0) == (key == "coco"), task  # image 1 is listed too
    assert recipe_split("vilbert-flickr30k") == "train-test_images"


def test_gqa_and_refcoco_rows_match_by_their_image_ids(tmp_path):
    """GQA's Visual Genome ids (``2354786``; ``n161313`` is never an integer) and RefCOCO's
    COCO images match the lists as 12-in-1 compares them; the recipes subtract test_images."""
    q = {
        "01": {"imageId": "2354786", "question": "a?", "answer": "x"},
        "02": {"imageId": "n161313", "question": "b?", "answer": "x"},
        "03": {"imageId": "2354787", "question": "c?", "answer": "x"},
    }
    (tmp_path / "train_balanced_questions.json").write_text(json.dumps(q))
    np.save(tmp_path / "genome_test_ids.npy", np.array(["2354786", "161313"]))  # strings, as int() reads them
    build_task(
        transfer.get("gqa"),
        [tmp_path / "train_balanced_questions.json"],
        tmp_path / "g",
        test_images=[tmp_path / "genome_test_ids.npy"],
    )
    data = TaskData.open(tmp_path / "g")
    assert [data.column("uid")[r] for r in data.rows("train-test_images")] == ["02", "03"]
    assert data.manifest["test_images"]["rows"] == {"train": 1}
    assert recipe_split("vilbert-gqa") == "train-minval-test_images,val-minval-test_images"
    assert recipe_split("vilbert-gqa") == recipe_split("vilbert-12in1", "task_train_split", "gqa")
    assert recipe_split("vilbert-refcoco+") == "train-test_images"
    for name in ("refcoco", "refcoco+", "refcocog", "coco-retrieval"):
        assert recipe_split("vilbert-12in1", "task_train_split", name) == "train-test_images"
    assert transfer.get("refcoco+").test_images_file == "coco_test_ids.npy"


def test_image_lists_are_read_as_12in1_keeps_them(tmp_path):
    """.npy arrays of integers, strings or objects (through the restricted unpickler) and text
    lists; names read as their number; what is no id is Malformed; a pickle of anything else is
    refused; a list without an id is refused by build-task."""
    np.save(tmp_path / "ints.npy", np.array([[1, 2], [3, 391895]], np.int64))
    np.save(tmp_path / "names.npy", np.array(["COCO_val2014_000000391895", "n12", "7.0"]))
    np.save(tmp_path / "objects.npy", np.array([5, "6", 7.0, 7.5, None], dtype=object), allow_pickle=True)
    (tmp_path / "list.txt").write_text("# the test images\n\nCOCO_train2014_000000000042.jpg\n  17 \n")
    assert list(read_image_ids(tmp_path / "ints.npy")) == [1, 2, 3, 391895]
    assert list(read_image_ids(tmp_path / "names.npy")) == [391895, "n12", "7.0"]
    objects = list(read_image_ids(tmp_path / "objects.npy"))
    assert objects[:3] == [5, 6, 7] and all(isinstance(o, Malformed) for o in objects[3:])
    assert str(objects[3]) == "objects.npy:[3]: not an image id (an integer or a name)"
    assert list(read_image_ids(tmp_path / "list.txt")) == [42, 17]
    assert image_number("COCO_train2014_000000000042") == 42 and image_number("1000092795.jpg") == 1000092795
    assert image_number("n161313") == "n161313" and image_number("dev-850-0-img0") == "dev-850-0-img0"
    np.save(tmp_path / "evil.npy", np.array([os.system], dtype=object), allow_pickle=True)
    with pytest.raises(UnsafePickleError, match="evil.npy"):
        list(read_image_ids(tmp_path / "evil.npy"))
    (tmp_path / "empty.txt").write_text("# nothing\n")
    files = write_vqa(tmp_path, {"train2014": [(1, 1, "yes", ["yes"] * 10)]})
    with pytest.raises(ConfigError, match="--test-images .*empty.txt: no image ids in it"):
        build_task(transfer.get("vqa"), files, tmp_path / "t", test_images=[tmp_path / "empty.txt"])
    with pytest.raises(ConfigError, match="--test-images .*missing.npy: no such file"):
        build_task(transfer.get("vqa"), files, tmp_path / "t", test_images=[tmp_path / "missing.npy"])


def test_build_task_cli_takes_lists_and_nominival(mt_vqa, tmp_path):
    """The flags: --test-images (repeatable: the union) and --nominival."""
    root, files = mt_vqa
    (tmp_path / "a.txt").write_text("3\n")
    (tmp_path / "b.txt").write_text("COCO_train2014_000000000007\n")
    data = TaskData.open(root / "plain")
    uid = data.column("uid")
    val = [int(uid[r]) for r in data.rows("val")]
    (tmp_path / "nominival.json").write_text(json.dumps([{"question_id": q} for q in val[10:]]))
    args = ["build-task", "--task", "vqa", "--out", str(tmp_path / "t"), "--min-count", "1"]
    args += ["--test-images", str(tmp_path / "a.txt"), "--test-images", str(tmp_path / "b.txt")]
    proc = run_cli(*args, "--nominival", str(tmp_path / "nominival.json"), *map(str, files))
    assert proc.returncode == 0, proc.stderr
    assert "test_images: 4 rows on 2 of the 2 listed images (train 4)" in proc.stdout
    built = TaskData.open(tmp_path / "t")
    assert _uids(built, "nominival") == sorted(val[10:]) and _uids(built, "minival") == sorted(val[:10])
    assert built.manifest["nominival"]["matched"] == len(val) - 10 and "minival" not in built.manifest
    assert "--test-images" in run_cli("build-task", "--help").stdout


# --- LXMERT's nominival.json --------------------------------------------------------------------


def test_nominival_is_read_from_lxmerts_file(mt_vqa, tmp_path):
    """With both files each split is its file's (val questions neither lists are in neither);
    files that share a question are refused."""
    root, files = mt_vqa
    uid = TaskData.open(root / "plain").column("uid")
    val = [int(uid[r]) for r in TaskData.open(root / "plain").rows("val")]
    (tmp_path / "minival.json").write_text(json.dumps([{"question_id": q} for q in val[:5]]))
    (tmp_path / "nominival.json").write_text(json.dumps([{"question_id": q} for q in val[7:]]))
    build_task(
        transfer.get("vqa"),
        files,
        tmp_path / "t",
        min_count=1,
        minival=tmp_path / "minival.json",
        nominival=tmp_path / "nominival.json",
    )
    data = TaskData.open(tmp_path / "t")
    assert _uids(data, "minival") == sorted(val[:5]) and _uids(data, "nominival") == sorted(val[7:])
    assert len(data.rows("train,nominival")) == 40 + len(val) - 7
    report = (tmp_path / "t" / "report.md").read_text()
    assert "LXMERT's nominival from" in report and "(the rest of val" not in report
    (tmp_path / "nominival.json").write_text(json.dumps([{"question_id": q} for q in val[3:]]))
    with pytest.raises(ConfigError, match="both list 2 val questions"):
        build_task(
            transfer.get("vqa"),
            files,
            tmp_path / "u",
            minival=tmp_path / "minival.json",
            nominival=tmp_path / "nominival.json",
        )


# --- GQA minval: question ids sorted as strings -----------------------------------------------


def test_gqa_minval_sorts_question_ids_as_the_strings_they_are(tmp_path):
    """12-in-1 sorts its cached GQA items by question_id, GQA's JSON keys (strings: it converts
    them with int() only after sorting): ``"1000"`` comes before ``"995"``, so minval (the last
    3,000) holds "995".."999" and leaves out "1000".."1009", where integer order would leave out
    995..1004."""
    ids = [str(i) for i in range(995, 4005)]
    np.random.default_rng(0).shuffle(ids)
    q = {i: {"imageId": "1", "question": "q?", "answer": "a"} for i in ids[:2000]}
    v = {i: {"imageId": "1", "question": "q?", "answer": "a"} for i in ids[2000:]}
    (tmp_path / "train_balanced_questions.json").write_text(json.dumps(q))
    (tmp_path / "val_balanced_questions.json").write_text(json.dumps(v))
    files = [tmp_path / "train_balanced_questions.json", tmp_path / "val_balanced_questions.json"]
    build_task(transfer.get("gqa"), files, tmp_path / "t")
    data = TaskData.open(tmp_path / "t")
    uid = data.column("uid")
    held = {uid[r] for r in data.rows("minval")}
    assert held == set(sorted(ids)[-3000:])
    assert {"995", "999"} <= held and not {"1000", "1009"} & held and "1010" in held
    # 12-in-1 trains on (train + val)[:-3000]: minval holds train questions too, left out of training
    assert sorted(uid[r] for r in data.rows(recipe_split("vilbert-gqa"))) == [str(i) for i in range(1000, 1010)]


# --- COCO retrieval: the 1K test -----------------------------------------------------------------


def _karpathy_rows(test_images: int) -> list[Row]:
    """Rows of a Karpathy file: 3 train images, then `test_images` test images (ids shuffled,
    so file order is no id order), two captions each."""
    numbers = np.random.default_rng(1).permutation(test_images) + 10_000
    rows = [Row(uid=f"t{i}", split="train", images=(f"tr{i}",), text="x", group=f"tr{i}") for i in range(3)]
    for n in numbers:
        name = f"COCO_val2014_{n:012d}"
        rows += [Row(uid=f"{n}-{k}", split="test", images=(name,), text="x", group=name) for k in range(2)]
    return rows


def test_coco_1k_test_is_the_first_1000_test_images_in_file_order_and_five_folds():
    """``test1k`` (12-in-1's one 1K set: the first 1,000 test images of dataset_coco.json, all
    their captions) and ``test1k_0`` .. ``test1k_4``, consecutive 1,000-image folds in file order
    (VSE++ / SCAN's five folds); only whole folds, at most five; Flickr30k has none."""
    rows = _karpathy_rows(5300)
    splits = COCO.named_splits(rows)
    assert sorted(splits) == ["test1k", "test1k_0", "test1k_1", "test1k_2", "test1k_3", "test1k_4"]
    order = list(dict.fromkeys(r.group for r in rows if r.split == "test"))
    for k in range(5):
        assert [rows[i].group for i in splits[f"test1k_{k}"]] == [
            g for g in order[1000 * k : 1000 * (k + 1)] for _ in (0, 1)
        ]
    assert splits["test1k"] == splits["test1k_0"]
    assert sorted(COCO.named_splits(_karpathy_rows(2500))) == ["test1k", "test1k_0", "test1k_1"]
    assert COCO.named_splits(_karpathy_rows(999)) == {}
    assert transfer.get("flickr30k").named_splits(rows) == {}


@pytest.fixture(scope="module")
def coco_folds(tmp_path_factory):
    """A COCO task dataset whose test has 5 folds of 4 images (the task's fold size made 4),
    two captions an image."""
    root = tmp_path_factory.mktemp("coco")
    images = [
        {"filename": "COCO_train2014_000000000001.jpg", "split": "train", "sentences": [{"raw": "a", "sentid": 1}]}
    ]
    for t in range(20):
        sentences = [{"raw": f"c {t} {k}", "sentid": 100 + 2 * t + k} for k in range(2)]
        images.append({"filename": f"COCO_val2014_{500 - t:012d}.jpg", "split": "test", "sentences": sentences})
    (root / "dataset_coco.json").write_text(json.dumps({"images": images}))
    task = copy.copy(COCO)
    task.fold_images = 4
    build_task(task, [root / "dataset_coco.json"], root / "t")
    return TaskData.open(root / "t", task="coco-retrieval")


def _predictions(data, spec: str) -> Predictions:
    """Scores over the rows of `spec`: each caption's own image 1.0, the image at its position
    in the next fold 2.0, the others 0: right first within its fold, second over all."""
    rows = data.rows(spec)
    names = [data.column("images")[r][0] for r in rows]
    images = list(dict.fromkeys(names))
    number = {name: 500 - int(name[-12:]) for name in images}  # t
    of_caption = np.array([images.index(n) for n in names])
    scores = np.zeros((len(rows), len(images)), np.float32)
    for c, name in enumerate(names):
        scores[c, images.index(name)] = 1.0
        partner = f"COCO_val2014_{500 - (number[name] + 4) % 20:012d}"
        if partner in images:
            scores[c, images.index(partner)] = 2.0
    return Predictions(rows=rows, values={"scores": scores, "image_of_caption": of_caption, "images": images})


def test_scoring_the_5k_test_reports_the_five_fold_1k_mean(coco_folds):
    """``vltrain evaluate --split test`` (the task's score) reports the whole test's metrics and
    each averaged over the five 1K folds (``1k5fold_``: each fold's captions against its own
    images, VSE++'s mean metrics); ``--split test1k`` is 12-in-1's one 1K set."""
    data = coco_folds
    assert data.manifest["splits"]["test1k_4"] == 8 and data.manifest["splits"]["test"] == 40
    metrics = COCO.score(data, _predictions(data, "test"))
    assert metrics["text_to_image_R@1"] == 0.0 and metrics["text_to_image_R@5"] == 100.0
    assert metrics["1k5fold_text_to_image_R@1"] == 100.0 and metrics["1k5fold_image_to_text_R@1"] == 100.0
    assert metrics["1k5fold_text_to_image_median_rank"] == 1.0
    folds = []
    for k in range(5):
        p = _predictions(data, f"test1k_{k}")
        folds.append(retrieval_metrics(p.values["scores"], p.values["image_of_caption"])["text_to_image_mean_rank"])
    assert metrics["1k5fold_text_to_image_mean_rank"] == pytest.approx(np.mean(folds)) == 1.0
    one = COCO.score(data, _predictions(data, "test1k"))  # fold 0 alone: its scores, no fold mean
    assert one["text_to_image_R@1"] == 100.0 and not any(k.startswith("1k5fold_") for k in one)
    partial = _predictions(data, "test")
    partial = Predictions(
        rows=partial.rows[:-1],
        values={
            **partial.values,
            "scores": partial.values["scores"][:-1],
            "image_of_caption": partial.values["image_of_caption"][:-1],
        },
    )
    assert not any(k.startswith("1k5fold_") for k in COCO.score(data, partial))  # a fold not whole: no mean
    assert transfer.get("coco-retrieval").val_split == "val"


def test_hard_negative_pools_still_read_image_numbers(tmp_path):
    """`image_number` moved to the image-list reader; the hard-negative pool reads ids with it."""
    from vl_models.transfer.retrieval import HardNegatives

    path = tmp_path / "hard_negative.pkl"
    path.write_bytes(
        pickle.dumps({"train_image_list": np.array([391895, 42]), "train_hard_pool": np.array([[0, 1], [1, 0]])})
    )
    assert HardNegatives.read(path).images == (391895, 42)
