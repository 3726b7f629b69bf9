"""Task inputs and splits as the references build them: VQA's answer
tables normalized as the official evaluator normalizes (grey and gray are two answers),
ViLBERT's minval by question id, split specs with set difference (train + (val - minval)),
LXMERT's minival / nominival from its published minival.json, and retrieval validated on
Karpathy val with 12-in-1's hard negatives as an option."""

import json
import os
import pickle

import numpy as np
import pytest
from helpers import run_cli
from task_files import IMAGES, write_store
from train_helpers import VOCAB

from pipeline.errors import ConfigError
from pipeline.task_data import TaskData
from vl_models import transfer
from vl_models.eval.metrics import vqa_report
from vl_models.transfer.build import build_task
from vl_models.transfer.retrieval import with_hard_negatives


def write_vqa(root, questions: dict) -> list:
    """VQA v2 files: `questions` maps a split (train2014, val2014, test-dev2015) to (question
    id, image id, the 10 answers or None) triples, in file order; the file list for build-task."""
    files = []
    for split, rows in questions.items():
        q = root / f"v2_OpenEnded_mscoco_{split}_questions.json"
        q.write_text(
            json.dumps(
                {"questions": [{"image_id": i, "question": f"q {qid}?", "question_id": qid} for qid, i, _ in rows]}
            )
        )
        files.append(q)
        if split != "test-dev2015":
            annotations = [
                {
                    "question_id": qid,
                    "answer_type": "other",
                    "multiple_choice_answer": max(set(answers), key=answers.count),
                    "answers": [{"answer": a} for a in answers],
                }
                for qid, _, answers in rows
            ]
            a = root / f"v2_mscoco_{split}_annotations.json"
            a.write_text(json.dumps({"annotations": annotations}))
            files.append(a)
    return files


def targets(data, row) -> dict:
    return {data.answers[i]: s for i, s in zip(data.column("answer_ids")[row], data.column("answer_scores")[row])}


# --- answer tables: the official evaluator's normalization -----------------------------------


def test_grey_and_gray_are_two_answers_and_ten_greys_score_grey_fully(tmp_path):
    """The official evaluator has no grey -> gray mapping: the table keeps both, a question
    ten annotators answered 'grey' has target 1.0 on 'grey' (none on 'gray'), and the
    evaluator gives a model answering 'grey' 100."""
    grey, gray, mixed = ["grey"] * 10, ["gray"] * 10, ["Grey"] * 7 + ["gray!"] * 3
    files = write_vqa(
        tmp_path,
        {
            "train2014": [(1, 1, grey), (2, 2, gray), (3, 3, grey)],
            "val2014": [(4, 4, grey), (5, 5, gray), (6, 6, mixed)],
        },
    )
    build_task(transfer.get("vqa"), files, tmp_path / "t", min_count=1)
    data = TaskData.open(tmp_path / "t")
    assert data.answers == ["grey", "gray"]
    uid = data.column("uid")
    row = {u: i for i, u in enumerate(uid)}
    assert targets(data, row["1"]) == {"grey": 1.0} and targets(data, row["2"]) == {"gray": 1.0}
    # BUTD's compute_target (the references' targets) counts the answers as given: "Grey" and
    # "gray!" are no entries of the table, so the question has none (counted in the manifest)
    assert data.column("answer_ids")[row["6"]] is None
    assert data.manifest["answers"]["raw_answers"] == {"no_target": {"val": 1}, "other_targets": {}}
    report = vqa_report(
        [{"question_id": 4, "answer": data.answers[0]}],
        [{"question_id": 4, "answer_type": "other", "answers": [{"answer": a} for a in grey]}],
    )
    assert report["overall"] == 100.0


def test_a_fixed_table_keeps_grey_as_given(tmp_path):
    """--answers-from: entries normalized as the evaluator does ('Grey' -> 'grey'), never
    merged into 'gray' (two entries, two reachable answers)."""
    files = write_vqa(tmp_path, {"train2014": [(1, 1, ["grey"] * 10)], "val2014": [(2, 2, ["gray"] * 10)]})
    (tmp_path / "label2ans.json").write_text(json.dumps(["gray", "Grey", "two"]))
    manifest = build_task(transfer.get("vqa"), files, tmp_path / "t", answers_from=tmp_path / "label2ans.json")
    data = TaskData.open(tmp_path / "t")
    assert data.answers == ["gray", "grey", "2"] and manifest["answers"]["unreachable"] == 0
    assert targets(data, 0) == {"grey": 1.0}


def test_gqa_answers_stay_as_given(tmp_path):
    """GQA's official eval.py compares exact strings and both references' tables hold the
    answers as given: nothing is normalized (grey stays grey)."""
    q = {"1": {"imageId": "n1", "question": "what?", "answer": "grey"}, "2": {"imageId": "n2", "question": "x?"}}
    (tmp_path / "train_balanced_questions.json").write_text(json.dumps(q))
    build_task(transfer.get("gqa"), [tmp_path / "train_balanced_questions.json"], tmp_path / "t")
    assert TaskData.open(tmp_path / "t").answers == ["grey"]


# --- VQA splits ------------------------------------------------------------------------------


def _vqa_world(tmp_path, val_questions: int = 3010):
    """train: 4 questions; val: `val_questions`, their ids in a shuffled file order; test-dev: 2."""
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.permutation(val_questions) * 7 + 100_000]
    answers = ["yes"] * 10
    return write_vqa(
        tmp_path,
        {
            "train2014": [(i + 1, i, answers) for i in range(4)],
            "val2014": [(qid, qid // 3, answers) for qid in ids],
            "test-dev2015": [(900_001, 1, None), (900_002, 2, None)],
        },
    )


@pytest.fixture(scope="module")
def vqa_splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("vqa")
    files = _vqa_world(root)
    build_task(transfer.get("vqa"), files, root / "t", min_count=1)
    return root, files, TaskData.open(root / "t")


def test_vilbert_minval_is_the_last_3000_val_questions_by_question_id(vqa_splits):
    """vilbert-multi-task vqa_dataset.py `_load_dataset`: val sorted by question_id, [-3000:]
    (not the file's last 3,000)."""
    _, _, data = vqa_splits
    uid = data.column("uid")
    val_ids = sorted(int(uid[r]) for r in data.rows("val"))
    assert len(val_ids) == 3010
    assert sorted(int(uid[r]) for r in data.rows("minval")) == val_ids[-3000:]


def test_split_specs_subtract_splits(vqa_splits):
    """train + (val - minval): what ViLBERT trains VQA on (its 'trainval'); names with a
    hyphen (test-dev) stay whole; a misspelt subtracted split is refused, not ignored."""
    _, _, data = vqa_splits
    uid = data.column("uid")
    rows = data.rows("train,val-minval")
    val_ids = sorted(int(uid[r]) for r in data.rows("val"))
    assert sorted(int(uid[r]) for r in rows) == [1, 2, 3, 4, *val_ids[:10]]
    assert list(rows) == sorted(rows)
    assert len(data.rows("test-dev")) == 2 and len(data.rows("test-dev-minval")) == 2
    assert len(data.rows("val - minval")) == 10 and len(data.rows("val-minval-val")) == 0
    with pytest.raises(ConfigError, match=r"'minvla' is not a split of .*a hyphen subtracts a split"):
        data.rows("train,val-minvla")


def test_lxmert_minival_and_nominival_from_its_minival_json(vqa_splits, tmp_path):
    """build-task --minival: LXMERT's minival.json (its question entries) makes the split
    minival, the rest of val nominival; train + nominival is what LXMERT trains on."""
    root, files, data = vqa_splits
    uid = data.column("uid")
    val_ids = [int(uid[r]) for r in data.rows("val")]
    listed = val_ids[5:25]
    entries = [
        {"question_id": q, "img_id": f"COCO_val2014_{q // 3:012d}", "sent": "q?", "label": {"yes": 1}} for q in listed
    ]
    (tmp_path / "minival.json").write_text(json.dumps(entries + [{"img_id": "x"}]))
    proc = run_cli(
        "build-task",
        "--task",
        "vqa",
        "--out",
        str(tmp_path / "t"),
        "--minival",
        str(tmp_path / "minival.json"),
        "--min-count",
        "1",
        *map(str, files),
    )
    assert proc.returncode == 0, proc.stderr
    lx = TaskData.open(tmp_path / "t")
    luid = lx.column("uid")
    assert [int(luid[r]) for r in lx.rows("minival")] == listed
    assert sorted(int(luid[r]) for r in lx.rows("nominival")) == sorted(set(val_ids) - set(listed))
    assert len(lx.rows("train,nominival")) == 4 + 3010 - 20
    assert lx.manifest["minival"]["matched"] == 20 and lx.manifest["minival"]["malformed"] == 1
    assert lx.manifest["splits"]["minival"] == 20 and "minval-lxmert" not in lx.manifest["splits"]
    (tmp_path / "other.json").write_text(json.dumps([{"question_id": 5}]))
    with pytest.raises(ConfigError, match="none of its 1 question ids is a val row"):
        build_task(transfer.get("vqa"), files, tmp_path / "u", minival=tmp_path / "other.json", min_count=1)


# --- retrieval: validated on Karpathy val; 12-in-1's hard negatives -----------------------------

TRAIN, VAL = 24, 30  # images 0..23 train, 24..29 val, 30..35 test (the task world's store: img_0 .. img_35)


def write_karpathy_splits(path, splits=("train", "val", "test")):
    """Karpathy's format over the store's images (``img_<i>.jpg``), every caption its own."""
    images = []
    for i in range(IMAGES):
        split = "train" if i < TRAIN else "val" if i < VAL else "test"
        if split not in splits:
            continue
        sentences = [{"raw": f"photo {i} caption {k}", "sentid": i * 5 + k, "imgid": i} for k in range(5)]
        images.append({"filename": f"img_{i}.jpg", "imgid": i, "split": split, "sentences": sentences})
    path.write_text(json.dumps({"dataset": "flickr30k", "images": images}))
    return path


@pytest.fixture(scope="module")
def karpathy(tmp_path_factory):
    root = tmp_path_factory.mktemp("karpathy")
    write_store(root / "feats")
    build_task(transfer.get("flickr30k"), [write_karpathy_splits(root / "dataset_flickr30k.json")], root / "t")
    return root


def _view(root, task, split, train=True):
    from vl_models.config import DataSettings
    from vl_models.transfer.dataset import TaskDataset
    from vl_models.transfer.runs import model_of

    family, _ = model_of("vilbert-tiny", None, str(root / "feats"), 1)
    data = TaskData.open(root / "t")
    return TaskDataset(
        data, task, [root / "feats"], VOCAB, family, DataSettings(max_regions=8, max_text=12), split, 0, train
    )


def write_pool(path, rows, images=range(TRAIN)):
    """12-in-1's hard_negative.pkl: train_image_list (ids) and train_hard_pool (indices into it)."""
    path.write_bytes(
        pickle.dumps({"train_image_list": np.array(list(images)), "train_hard_pool": np.array(rows, np.int64)})
    )
    return path


def _caption_images(view):
    """input_ids of each caption of the view -> its image number."""
    return {
        tuple(view.text(view.value("text", i))["input_ids"].tolist()): int(view.value("group", i)[4:])
        for i in range(len(view.rows))
    }


def test_retrieval_validates_on_karpathy_val_not_test(karpathy):
    """vltrain finetune validates each task on its val_split when the data has it (and keeps
    checkpoints/best by it): retrieval's is Karpathy's val, never test."""
    assert transfer.get("flickr30k").val_split == "val" and transfer.get("coco-retrieval").val_split == "val"
    data = TaskData.open(karpathy / "t")
    assert data.manifest["splits"] == {"train": 120, "val": 30, "test": 30}
    assert {data.column("group")[r] for r in data.rows(transfer.get("flickr30k").val_split)} == {
        f"img_{i}" for i in range(TRAIN, VAL)
    }


def test_hard_negatives_draw_the_fourth_candidate_from_the_pool_row(karpathy, tmp_path):
    """12-in-1 (RetreivalDataset.__getitem__): 1 the pair, 2 another image's caption with this
    image, 3 this caption with another image, 4 a caption of an image from this image's
    hard pool row, positions 1.. (never position 0); validation draws at random."""
    rows = [[(i + 7) % TRAIN, (i + 1) % TRAIN, (i + 2) % TRAIN] for i in range(TRAIN)]
    pool = write_pool(tmp_path / "hard_negative.pkl", rows)
    (task,) = with_hard_negatives([transfer.get("flickr30k")], pool)
    assert transfer.get("flickr30k").hard_negatives is None  # the registered task is untouched
    view = _view(karpathy, task, "train")
    of = _caption_images(view)
    hard, other = [], []
    for epoch in range(3):
        view.set_epoch(epoch)
        for i in range(len(view.rows)):
            ex = view[i]
            own = int(view.value("group", i)[4:])
            first, second, third, fourth = (of[tuple(ids.tolist())] for ids in ex["input_ids"])
            assert first == third == own and second != own
            assert not np.array_equal(ex["visual_feats"][2], ex["visual_feats"][0])  # another image
            assert all(np.array_equal(ex["visual_feats"][c], ex["visual_feats"][0]) for c in (1, 3))
            hard.append(fourth - own)
            other.append(second)
    assert set(np.mod(hard, TRAIN)) == {1, 2}  # positions 1 and 2 of each row, both drawn; 0 (+7) never
    assert len(set(other)) > 10  # the random negatives spread over the split's images
    plain = _view(karpathy, transfer.get("flickr30k"), "train")
    fourth = [_caption_images(plain)[tuple(plain[i]["input_ids"][3].tolist())] for i in range(len(plain.rows))]
    assert len(set(fourth)) > 10
    val = _view(karpathy, task, "val", train=False)
    assert val[0]["input_ids"].shape[0] == 4  # no pool row needed: random negatives


def test_hard_negative_pool_refusals(karpathy, tmp_path):
    from pipeline.errors import UnsafePickleError

    with pytest.raises(ConfigError, match="only retrieval tasks use a hard-negative pool, not vqa"):
        with_hard_negatives([transfer.get("vqa")], write_pool(tmp_path / "p.pkl", [[0, 1]] * TRAIN))
    (tmp_path / "list.pkl").write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(ConfigError, match="not 12-in-1's hard_negative.pkl"):
        with_hard_negatives([transfer.get("flickr30k")], tmp_path / "list.pkl")
    with pytest.raises(ConfigError, match=r"train_hard_pool \(24, 2\) must have"):
        with_hard_negatives([transfer.get("flickr30k")], write_pool(tmp_path / "p.pkl", [[0, 99]] * TRAIN))
    (tmp_path / "evil.pkl").write_bytes(pickle.dumps(os.system))  # a global beyond numpy and plain values
    with pytest.raises(UnsafePickleError):
        with_hard_negatives([transfer.get("flickr30k")], tmp_path / "evil.pkl")
    short = write_pool(tmp_path / "short.pkl", [[0, 1]] * 20, images=range(20))  # images 20..23 have no row
    (task,) = with_hard_negatives([transfer.get("flickr30k")], short)
    with pytest.raises(ConfigError, match="4 of its 24 images have no pool row"):
        _view(karpathy, task, "train")[0]


def test_finetune_has_a_hard_negatives_flag():
    proc = run_cli("finetune", "--help", tool="vltrain")
    assert "--hard-negatives" in proc.stdout
    from vl_models.config import FinetuneConfig

    cfg = FinetuneConfig.of(tasks=["flickr30k"], task_data=["t"], stores=["s"], out="o", hard_negatives="h.pkl")
    assert cfg.transfer.hard_negatives == "h.pkl"


def test_minival_matches_val_questions_only(vqa_splits, tmp_path):
    """A file may repeat a question id across splits (the shapes world's do): minival takes the
    val rows only and counts the ids it finds in no val row, rather than moving train rows into
    minival."""
    root, files, data = vqa_splits
    uid = data.column("uid")
    val_ids = [int(uid[r]) for r in data.rows("val")]
    train_ids = [int(uid[r]) for r in data.rows("train")]
    listed = val_ids[:3] + train_ids[:2]  # ids of train rows too
    (tmp_path / "minival.json").write_text(json.dumps([{"question_id": q} for q in listed]))
    build_task(transfer.get("vqa"), files, tmp_path / "t", minival=tmp_path / "minival.json", min_count=1)
    lx = TaskData.open(tmp_path / "t")
    luid = lx.column("uid")
    assert sorted(int(luid[r]) for r in lx.rows("minival")) == sorted(val_ids[:3])
    assert len(lx.rows("train")) == len(train_ids)  # no train row moved
    info = lx.manifest["minival"]
    assert (info["matched"], info["not_found"], info["in_other_splits"]) == (3, 2, 2)


def test_a_hard_negative_pool_of_a_billion_entries_is_refused_at_once(tmp_path):
    """~110 bytes of ``range(10**12)`` once iterated until memory died; refused by name now."""
    import pickle
    import time

    from pipeline.errors import UnsafePickleError
    from vl_models.transfer.retrieval import HardNegatives

    path = tmp_path / "hard_negative.pkl"
    path.write_bytes(pickle.dumps({"train_image_list": range(10**12), "train_hard_pool": range(10**12)}))
    assert path.stat().st_size < 150
    started = time.perf_counter()
    with pytest.raises(UnsafePickleError, match="hard_negative.pkl: refused a pickle that expands to over"):
        HardNegatives.read(path)
    assert time.perf_counter() - started < 1
