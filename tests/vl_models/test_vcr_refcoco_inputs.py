"""VCR and RefCOCO+ inputs as vilbert-multi-task builds them (`vilbert/datasets/vcr_dataset.py`,
`refer_expression_dataset.py`): pair encoding with the choice alone truncated and token
types, VCR's Q->A and QA->R tasks, its tag rendering with seeded names, and RefCOCO+'s
candidates (detections, the IMG token, ground-truth boxes in training only)."""

import json
import pickle

import numpy as np
import pytest
from train_helpers import VOCAB

from pipeline.errors import ConfigError
from pipeline.records import RegionFeatures
from pipeline.sources.vcr import MT, R2C, name_people, read_names_table, render_tokens
from pipeline.store import write_records
from pipeline.task_data import TaskData
from vl_models import families, transfer
from vl_models.config import DataSettings, EvaluateConfig, FinetuneConfig
from vl_models.data.tokenize import WordPiece
from vl_models.eval.metrics import box_iou_pairs
from vl_models.transfer.build import build_task
from vl_models.transfer.dataset import CANDIDATE_KEYS, TaskDataset
from vl_models.transfer.evaluate import evaluate_checkpoint
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.task import Predictions

VILBERT, LXMERT = families.get("vilbert"), families.get("lxmert")
DIM, SIZE = 8, 100


@pytest.fixture(scope="module")
def tok():
    return WordPiece(VOCAB)


def words(tok, ids) -> str:
    vocab = {i: t for t, i in tok.tok.get_vocab().items()}
    return " ".join(vocab[int(i)] for i in ids if int(i) != tok.pad_id)


# --- pair encoding ----------------------------------------------------------------------------


def test_pair_keeps_the_first_side_whole_and_types_the_second(tok):
    """vcr_dataset.py `_truncate_seq_pair(tokens_b, max - 3 - len(tokens_a))`: only the choice
    loses tokens, from its end; segment ids 0 on [CLS] a [SEP], 1 on b [SEP], 0 on padding."""
    enc = tok.encode_pair("one two three four five", "six seven eight nine", 10)
    assert words(tok, enc.ids) == "[CLS] one two three four five [SEP] six seven [SEP]"
    assert enc.types.tolist() == [0] * 7 + [1] * 3 and enc.types.dtype == np.int64
    assert enc.mask.tolist() == [1] * 10
    short = tok.encode_pair("one", "two three", 8)
    assert words(tok, short.ids) == "[CLS] one [SEP] two three [SEP]"
    assert short.types.tolist() == [0, 0, 0, 1, 1, 1, 0, 0] and short.mask.tolist() == [1] * 6 + [0] * 2
    assert tok.encode("one two", 5).types.tolist() == [0] * 5


def test_qa2r_context_is_question_sep_answer_and_the_pair_pads_beyond_its_limit(tok):
    """QA->R's first side is question + [SEP] + answer (type 0, never truncated); a pair
    limited to 6 tokens padded to 9 (the joint task's Q->A inside QA->R's length)."""
    enc = tok.encode_pair(("why one", "two"), "three four five", 9)
    assert words(tok, enc.ids) == "[CLS] why one [SEP] two [SEP] three four [SEP]"
    assert enc.types.tolist() == [0] * 6 + [1] * 3
    padded = tok.encode_pair("one", "two three four five", 6, pad_to=9)
    assert words(tok, padded.ids) == "[CLS] one [SEP] two three [SEP]" and len(padded.ids) == 9
    assert padded.mask.tolist() == [1] * 6 + [0] * 3 and padded.types.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 0]
    # a first side that leaves no room (the reference fails): cut to leave the choice one token
    cut = tok.encode_pair("a b c d e f g", "h i", 8)
    assert words(tok, cut.ids) == "[CLS] a b c d [SEP] h [SEP]"
    exact = tok.encode_pair("a b c d e", "h i", 8)  # room for none of the choice: as the reference, b empty
    assert words(tok, exact.ids) == "[CLS] a b c d e [SEP] [SEP]"


def test_vcr_text_is_tokenized_twice_as_the_reference(tok):
    """vcr_dataset.py tokenizes each word, joins the pieces with spaces and encodes that again:
    a continuation piece ##x becomes #, #, x; [SEP] stays one token."""
    assert words(tok, tok.pieces("surfing unbelievably")) == "surfing un ##bel ##ie ##va ##bly"
    assert (
        words(tok, tok.pieces("surfing unbelievably", retokenize=True)) == "surfing un # # bel # # ie # # va # # b ##ly"
    )
    assert words(tok, tok.pieces("a [SEP] b", retokenize=True)) == "a [SEP] b"


# --- VCR ---------------------------------------------------------------------------------------


def vcr_line(i: int, split: str, **changes) -> dict:
    row = {
        "annot_id": f"{split}-{i}",
        "objects": ["person", "person", "dog"],
        "img_fn": f"vcr_{i}.jpg",
        "metadata_fn": f"vcr_{i}.json",
        "question": ["why", "is", [0, 2], "near", [1], "?"],
        "answer_choices": [["because", [1], "called", c] for c in ("red", "green", "blue", "gray")],
        "answer_label": i % 4,
        "rationale_choices": [["the", "dog", "is", c] for c in ("red", "green", "blue", "gray")],
        "rationale_label": (i + 1) % 4,
    }
    row.update(changes)
    return row


def write_vcr(root, n=4, names=None, test=False):
    files = []
    for split in ("train", "val") + (("test",) if test else ()):
        rows = [vcr_line(i, split) for i in range(n)]
        if split == "test":
            for r in rows:
                del r["answer_label"], r["rationale_label"]
        path = root / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files.append(path)
    if names:
        table = root / "unisex_names_table.csv"
        table.write_text(",name,total\n" + "".join(f"{k},{name},{k + 1}\n" for k, name in enumerate(names)))
        files.append(table)
    rng = np.random.default_rng(0)
    box = np.array([[0, 0, 50, 50]], np.float32)
    records = [
        RegionFeatures(
            f"vcr_{i}",
            SIZE,
            SIZE,
            box,
            rng.normal(size=(1, DIM)).astype(np.float32),
            cls_prob=np.full((1, 4), 0.25, np.float32),  # ViLBERT's model reads its width
        )
        for i in range(n)
    ]
    write_records(root / "feats", records, feature_dim=DIM, dtype="float32")
    return files


def vcr_view(root, task, split, *, seed=0, train=False, max_text=None):
    return TaskDataset(
        TaskData.open(root / task),
        transfer.get(task),
        [root / "feats"],
        VOCAB,
        VILBERT,
        DataSettings(max_regions=4, max_text=max_text),
        split,
        seed=seed,
        train=train,
    )


@pytest.fixture(scope="module")
def vcr_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("vcr")
    files = write_vcr(root, names=["Alex", "Sam"], test=True)
    for task in ("vcr", "vcr-q2a", "vcr-qa2r"):
        build_task(transfer.get(task), files, root / task)
    return root


def test_vcr_tasks_are_registered_with_the_reference_lengths():
    q2a, qa2r, joint = transfer.get("vcr-q2a"), transfer.get("vcr-qa2r"), transfer.get("vcr")
    assert (q2a.max_text, qa2r.max_text, joint.max_text) == (60, 80, 80)  # vilbert_tasks.yml TASK5, TASK6
    assert q2a.head == qa2r.head == "choice" and q2a.candidates == qa2r.candidates == 4
    assert (q2a.metric, qa2r.metric, joint.metric) == (
        "eval_vcr-q2a_accuracy",
        "eval_vcr-qa2r_accuracy",
        "eval_vcr_q2ar",
    )


def test_tags_render_as_the_reference_with_names_drawn_per_seed(vcr_world, tok):
    """A tag's objects one after the other (no "and"), a person a name of the names table given
    to build-task, the same name in the question and every choice, in every epoch; another
    seed may draw another name."""
    assert render_tokens(["a", [2, 0], "b"], ("person", "cat", "dog"), MT).startswith("a dog ")
    assert render_tokens(["a", [2, 1], "b"], ("person", "cat", "dog"), R2C) == "a dog and cat b"
    assert name_people(render_tokens(["hi", [0, 1]], ("person", "person"), MT), lambda k: f"n{k}") == "hi n0 n1"
    data = TaskData.open(vcr_world / "vcr-q2a")
    assert json.loads((vcr_world / "vcr-q2a" / "vcr_names.json").read_text()) == ["Alex", "Sam"]
    seen = set()
    for seed in range(6):
        view = vcr_view(vcr_world, "vcr-q2a", "val", seed=seed)
        first = view[0]
        for epoch in (0, 3):
            view.set_epoch(epoch)
            assert np.array_equal(view[0]["input_ids"], first["input_ids"])
        texts = [words(tok, ids) for ids in first["input_ids"]]
        person0 = texts[0].split()[3]  # "[CLS] why is <person 0> dog near <person 1> ? [SEP] because <person 1> ..."
        person1 = texts[0].split()[6]
        assert {person0, person1} <= {"alex", "sam"} and texts[0].split()[4] == "dog"
        assert all(t.split()[9:11] == ["because", person1] for t in texts)
        seen.add((person0, person1))
    assert len(seen) > 1  # the seed picks the names
    assert data.column("text")[0].startswith("why is ") and "and" not in data.column("text")[0]


def test_q2a_and_qa2r_examples_are_the_reference_pairs(vcr_world, tok):
    q2a = vcr_view(vcr_world, "vcr-q2a", "train", train=True)
    ex = q2a[1]  # answer 1
    assert set(CANDIDATE_KEYS) <= set(ex) and ex["input_ids"].shape == (4, 60) and ex["label"] == 1
    text = words(tok, ex["input_ids"][2])
    assert text.startswith("[CLS] why is ") and text.endswith(
        "? [SEP] because " + text.split()[6] + " called blue [SEP]"
    )
    n_first = text.split().index("[SEP]") + 1
    assert ex["token_type_ids"][2].tolist() == [0] * n_first + [1] * 5 + [0] * (60 - n_first - 5)
    qa2r = vcr_view(vcr_world, "vcr-qa2r", "train", train=True)
    assert len(qa2r) == 4
    ex = qa2r[1]  # conditioned on the right answer (1: green)
    assert ex["input_ids"].shape == (4, 80) and ex["label"] == 2 and ex["answer"] == 1
    text = words(tok, ex["input_ids"][3])
    question, answer, rationale = text.split(" [SEP] ")[:3]
    assert question.startswith("[CLS] why is") and answer.endswith("called green")
    assert rationale == "the dog is gray [SEP]"
    n = len(text.split())
    assert ex["token_type_ids"][3].tolist() == [0] * (n - 5) + [1] * 5 + [0] * (80 - n)
    short = vcr_view(vcr_world, "vcr-qa2r", "train", train=True, max_text=18)  # only the rationale loses tokens
    text = words(tok, short[1]["input_ids"][3])
    assert text.split(" [SEP] ")[:2] == [question, answer] and text.endswith("[SEP] the dog is [SEP]")
    assert len(text.split()) == 18


def test_joint_vcr_keeps_q2a_within_its_60_tokens(vcr_world, tok):
    view = vcr_view(vcr_world, "vcr", "train", train=True)
    assert len(view) == 8 and view[0]["input_ids"].shape == view[4]["input_ids"].shape == (4, 80)
    assert (
        words(tok, view[0]["input_ids"][0]).count("[SEP]") == 2
        and words(tok, view[4]["input_ids"][0]).count("[SEP]") == 3
    )


def test_vcr_keeps_every_ground_truth_box_and_averages_the_img_token_as_the_reference(vcr_world, tmp_path):
    """vcr_dataset.py: the ground-truth boxes kept first (as many as the slots hold), the
    detections fill the rest, after them in the slots; the IMG feature
    (d (n + 1) + g (m + 1)) / (n + m + 2); in evaluation too."""
    rng = np.random.default_rng(3)
    det = RegionFeatures("vcr_0", SIZE, SIZE, DETECTIONS, rng.normal(size=(3, DIM)).astype(np.float32))
    gt = RegionFeatures("vcr_0", SIZE, SIZE, GROUND_TRUTH, rng.normal(size=(2, DIM)).astype(np.float32))
    write_records(tmp_path / "dets", [det], feature_dim=DIM, dtype="float32")
    write_records(tmp_path / "gt", [gt], feature_dim=DIM, dtype="float32")
    view = TaskDataset(
        TaskData.open(vcr_world / "vcr-q2a"),
        transfer.get("vcr-q2a"),
        [tmp_path / "dets"],
        VOCAB,
        VILBERT,
        DataSettings(max_regions=4),
        "val",
        train=False,
        given_stores=[tmp_path / "gt"],
    )
    feats = view[0]["visual_feats"][0]  # question 0 is on image vcr_0
    img = (det.features.mean(0) * 4 + gt.features.mean(0) * 3) / 7
    assert np.allclose(feats[0], img, atol=1e-6)
    assert np.allclose(feats[1:], np.concatenate([det.features[:2], gt.features]))
    assert np.array_equal(view.image("vcr_0", "keep")["boxes"][1:], np.concatenate([DETECTIONS[:2], GROUND_TRUTH]))


def predictions(view, logits_of):
    """Predictions of every example of `view`, with `logits_of(example)` as its logits."""
    examples = [view[i] for i in range(len(view))]
    values = {
        "logits": np.stack([logits_of(e) for e in examples]),
        "index": np.array([e["index"] for e in examples]),
    }
    for key in ("question", "answer"):
        if key in examples[0]:
            values[key] = np.array([e[key] for e in examples])
    return Predictions(rows=view.rows, values=values)


def test_q2a_and_qa2r_score_accuracy_and_write_probabilities(vcr_world, tmp_path):
    """Per task accuracy; QA->R on val (labels known) conditioned on the right answer, on test
    one example per answer; each task's probabilities as JSON."""
    q2a = vcr_view(vcr_world, "vcr-q2a", "val")
    data = q2a.data
    right = predictions(q2a, lambda e: np.eye(4)[e["label"]] * 3)
    assert transfer.get("vcr-q2a").score(data, right) == {"accuracy": 100.0}
    half = predictions(q2a, lambda e: np.eye(4)[e["label"] if e["index"] % 2 else (e["label"] + 1) % 4])
    assert transfer.get("vcr-q2a").score(data, half) == {"accuracy": 50.0}
    path = transfer.get("vcr-q2a").write_submission(data, right, tmp_path)
    rows = json.loads(path.read_text())
    assert [r["annot_id"] for r in rows] == ["val-0", "val-1", "val-2", "val-3"] and len(rows[0]["probabilities"]) == 4
    qa2r = vcr_view(vcr_world, "vcr-qa2r", "val")
    assert len(qa2r) == 4 and [int(qa2r[i]["answer"]) for i in range(4)] == [0, 1, 2, 3]  # the right answers
    data = qa2r.data
    hit = predictions(qa2r, lambda e: np.eye(4)[e["label"]])
    assert transfer.get("vcr-qa2r").score(data, hit) == {"accuracy": 100.0}
    test = vcr_view(vcr_world, "vcr-qa2r", "test")
    assert len(test) == 16
    pairs = sorted((int(test[i]["question"]), int(test[i]["answer"])) for i in range(16))
    assert pairs == [(q, a) for q in range(4) for a in range(4)]
    path = transfer.get("vcr-qa2r").write_submission(test.data, predictions(test, lambda e: np.zeros(4)), tmp_path)
    rows = json.loads(path.read_text())
    assert len(rows) == 16 and {(r["annot_id"], r["conditioned_on"]) for r in rows} == {
        (f"test-{q}", a) for q in range(4) for a in range(4)
    }
    assert rows[0]["probabilities"] == [0.25] * 4


@pytest.mark.parametrize("task", ["vcr-q2a", "vcr-qa2r"])
def test_q2a_and_qa2r_finetune_and_evaluate(vcr_world, tmp_path, task):
    """Each task fine-tunes on its own (validated by its accuracy) and evaluates a split
    without labels (QA->R: one example per answer) into its probabilities file."""
    cfg = FinetuneConfig.of(
        tasks=(task,),
        task_data=(str(vcr_world / task),),
        stores=(str(vcr_world / "feats"),),
        out=str(tmp_path / "ft"),
        model="vilbert-tiny",
        vocab=str(VOCAB),
        epochs=None,
        steps=2,
        batch_size=2,
        max_regions=4,
        max_text=32,  # vilbert-tiny has 64 positions
        log_every=1,
        checkpoint_every=2,
    )
    last = run_finetune(cfg)
    assert 0 <= last[f"eval_{task}_accuracy"] <= 100
    result = evaluate_checkpoint(
        EvaluateConfig(task, str(tmp_path / "ft"), vcr_world / task, "test", out=tmp_path / "e")
    )
    rows = json.loads((tmp_path / "e" / f"{task}_probabilities.json").read_text())
    assert result["metrics"] == {} and len(rows) == (4 if task == "vcr-q2a" else 16)
    assert all(sum(r["probabilities"]) == pytest.approx(1.0) for r in rows)


def test_names_table_is_read_as_the_reference_reads_it(tmp_path):
    table = tmp_path / "names.csv"
    table.write_text(",name,total\n0,Casey,10\n1,Riley,4\n")
    assert read_names_table(table) == ("Casey", "Riley")
    table.write_text("just one column\n")
    with pytest.raises(ConfigError, match="not a names table"):
        read_names_table(table)
    files = write_vcr(tmp_path, names=["A"])
    other = tmp_path / "other.csv"
    other.write_text(",name\n0,B\n")
    with pytest.raises(ConfigError, match="one names table"):
        build_task(transfer.get("vcr-q2a"), [*files, other], tmp_path / "t")


# --- RefCOCO+ ----------------------------------------------------------------------------------

DETECTIONS = np.array([[0, 0, 40, 40], [50, 50, 99, 99], [10, 60, 30, 90]], np.float32)
GROUND_TRUTH = np.array([[52, 48, 98, 97], [5, 5, 95, 95]], np.float32)  # the referred object: the second


def write_refcoco(root):
    images = [f"COCO_train2014_{i:012d}" for i in range(2)]
    refs, anns = [], []
    for i, name in enumerate(images):
        for k, box in enumerate(GROUND_TRUTH):
            x1, y1, x2, y2 = (float(v) for v in box)
            anns.append({"id": 10 * i + k + 1, "image_id": i + 1, "bbox": [x1, y1, x2 - x1, y2 - y1]})
        refs.append(
            {
                "ref_id": i,
                "ann_id": 10 * i + 2,
                "image_id": i + 1,
                "split": "train" if i == 0 else "val",
                "sentences": [{"sent": "the big one", "raw": "The BIG one!", "tokens": [], "sent_id": i}],
            }
        )
    (root / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    (root / "instances.json").write_text(
        json.dumps(
            {
                "images": [
                    {"id": i + 1, "file_name": f"{n}.jpg", "width": SIZE, "height": SIZE} for i, n in enumerate(images)
                ],
                "annotations": anns,
            }
        )
    )
    rng = np.random.default_rng(1)
    dets = [RegionFeatures(n, SIZE, SIZE, DETECTIONS, rng.normal(size=(3, DIM)).astype(np.float32)) for n in images]
    gts = [RegionFeatures(n, SIZE, SIZE, GROUND_TRUTH, rng.normal(size=(2, DIM)).astype(np.float32)) for n in images]
    write_records(root / "dets", dets, feature_dim=DIM, dtype="float32")
    write_records(root / "gt", gts, feature_dim=DIM, dtype="float32")
    build_task(transfer.get("refcoco+"), [root / "refs(unc).p", root / "instances.json"], root / "task")
    return dets, gts


def ref_view(root, split, train, family=VILBERT, regions=10, given=True):
    return TaskDataset(
        TaskData.open(root / "task"),
        transfer.get("refcoco+"),
        [root / "dets"],
        VOCAB,
        family,
        DataSettings(max_regions=regions),
        split,
        train=train,
        given_stores=[root / "gt"] if given else (),
    )


@pytest.fixture(scope="module")
def ref_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("refcoco")
    return root, *write_refcoco(root)


def test_refcoco_text_is_the_raw_sentence(ref_world, tok):
    root, _, _ = ref_world
    assert TaskData.open(root / "task").column("text") == ["The BIG one!", "The BIG one!"]
    assert words(tok, ref_view(root, "train", True)[0]["input_ids"][0]) == "[CLS] the big one ! [SEP]"


def test_refcoco_training_adds_ground_truth_boxes_and_evaluation_does_not(ref_world):
    """Training: IMG token, the 3 detections, the 2 ground-truth boxes (the referred one among
    them); evaluation: IMG token and the detections only. The IMG token's box is the whole
    image, its target its own IoU (kept when >= 0.5), its feature the detections' mean."""
    root, dets, gts = ref_world
    whole = np.array([0, 0, SIZE, SIZE], np.float32)
    train = ref_view(root, "train", True)[0]
    assert train["region_valid"].tolist() == [True] * 6 + [False] * 5
    assert np.array_equal(train["boxes"][:6], np.concatenate([[whole], DETECTIONS, GROUND_TRUTH]))
    referred = GROUND_TRUTH[1]
    iou = box_iou_pairs(train["boxes"][:6], np.broadcast_to(referred, (6, 4)))
    assert np.allclose(train["region_iou"][:6], iou) and train["region_iou"][5] == pytest.approx(1.0)
    assert iou[0] >= 0.5 and train["region_target"][0] == pytest.approx(iou[0])  # the IMG token is a target
    assert np.allclose(train["visual_feats"][0, 0], dets[0].features.mean(0), atol=1e-6)
    assert np.allclose(train["visual_feats"][0, 4:6], gts[0].features)
    val = ref_view(root, "val", False)[0]
    assert val["region_valid"].tolist() == [True] * 4 + [False] * 7
    assert np.array_equal(val["boxes"][:4], np.concatenate([[whole], DETECTIONS]))
    assert not (val["boxes"] == referred).all(-1).any()  # the referred box is never a candidate
    tight = ref_view(root, "train", True, regions=4)[0]  # the slots left after the detections: one GT box
    assert tight["region_valid"].all() and np.array_equal(tight["boxes"][4], GROUND_TRUTH[0])
    lx = ref_view(root, "train", True, family=LXMERT)[0]  # no IMG token: the regions alone
    assert np.array_equal(lx["boxes"][:5], np.concatenate([DETECTIONS, GROUND_TRUTH]))
    alone = ref_view(root, "train", True, given=False)[0]  # no ground-truth store: detections only
    assert alone["region_valid"].sum() == 4


def test_every_task_example_has_token_types(ref_world, vcr_world):
    root, _, _ = ref_world
    ref = ref_view(root, "val", False)[0]
    assert ref["token_type_ids"].shape == ref["input_ids"].shape == (1, 20) and not ref["token_type_ids"].any()
    vcr = vcr_view(vcr_world, "vcr", "val")
    for i in (0, len(vcr) - 1):
        types = vcr[i]["token_type_ids"]
        assert types.dtype == np.int64 and types.shape == (4, 80) and (types.sum(1) > 0).all()


def test_given_shards_reach_training_and_evaluation(ref_world, tmp_path):
    """`vltrain finetune --given-stores` trains RefCOCO+ on detections + ground truth; the run
    keeps them, and `vltrain evaluate` reads them from the run (or its own --given-stores)."""
    from helpers import run_vltrain

    root, _, _ = ref_world
    image = "COCO_train2014_000000000000"
    narrow = [RegionFeatures(image, SIZE, SIZE, GROUND_TRUTH, np.zeros((2, DIM - 1), np.float32))]
    write_records(tmp_path / "narrow", narrow, feature_dim=DIM - 1, dtype="float32")
    common = [
        "--task", "refcoco+", "--data", str(root / "task"), "--stores", str(root / "dets"),
        "--model", "lxmert-tiny", "--vocab", str(VOCAB), "--max-regions", "10", "--batch-size", "1",
    ]  # fmt: skip
    bad = run_vltrain("finetune", *common, "--given-stores", str(tmp_path / "narrow"), "--out", str(tmp_path / "b"))
    assert bad.returncode == 2 and "different widths" in bad.stderr
    run = tmp_path / "ft"
    ok = run_vltrain("finetune", *common, "--given-stores", str(root / "gt"), "--steps", "1", "--out", str(run))
    assert ok.returncode == 0, ok.stderr
    assert json.loads((run / "config.json").read_text())["train"]["given_stores"] == [str(root / "gt")]
    result = evaluate_checkpoint(EvaluateConfig("refcoco+", str(run), root / "task", "val", out=tmp_path / "e"))
    assert result["examples"] == 1
    with pytest.raises(ConfigError, match="refcoco\\+ read no ground-truth boxes when evaluated"):
        evaluate_checkpoint(
            EvaluateConfig("refcoco+", str(run), root / "task", "val", given_stores=[str(tmp_path / "narrow")])
        )


def test_given_shards_must_be_ground_truth_and_read_by_a_task(ref_world, tmp_path):
    """--given-stores names a store of ground-truth boxes (`vlprep extract --given-boxes`) for a
    task that reads them: the detections store itself is refused by its provenance, and a task
    that reads no ground truth (VQA) refuses the flag."""
    from helpers import run_vltrain

    root, dets, _ = ref_world
    provenance = {"detector": "vg-r101", "box_policy": "butd boxes=10-100, conf>=0.2, nms=0.3 +1px"}
    write_records(tmp_path / "detections", dets, feature_dim=DIM, dtype="float32", provenance=provenance)
    common = [
        "--task", "refcoco+", "--data", str(root / "task"), "--stores", str(root / "dets"),
        "--model", "lxmert-tiny", "--vocab", str(VOCAB), "--max-regions", "10", "--batch-size", "1", "--steps", "1",
    ]  # fmt: skip
    proc = run_vltrain(
        "finetune", *common, "--given-stores", str(tmp_path / "detections"), "--out", str(tmp_path / "a")
    )
    assert proc.returncode == 2 and "its features are a detector's regions (butd boxes=10-100" in proc.stderr
    assert not (tmp_path / "a").exists()
    from vl_models.transfer.dataset import check_given_stores

    with pytest.raises(ConfigError, match="vqa read no ground-truth boxes in training"):
        check_given_stores([transfer.get("vqa")], [root / "gt"], training=True)
