"""Transfer: task datasets from official-format files (`vlprep build-task`), fine-tuning on
each head kind with a planted signal, resume and DDP exactness, evaluation with the official
metrics and the official submission files, the command lines."""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import REPO, free_port, run_cli, run_vltrain
from retrieval_helpers import assert_scores_as_full_forwards, full_pair_scores, spy_on_pair_scores
from task_files import COLORS, IMAGES
from train_helpers import VOCAB, finetune_config, no_dropout_config

from pipeline.errors import ConfigError
from pipeline.task_data import TaskData
from vl_models import transfer
from vl_models.config import EvaluateConfig, FinetuneConfig
from vl_models.data.sampler import TaskBatchSampler
from vl_models.eval.metrics import vqa_report
from vl_models.transfer.build import build_task
from vl_models.transfer.evaluate import evaluate_checkpoint
from vl_models.transfer.finetune import run_finetune

TASKS = ("vqa", "gqa", "nlvr2", "flickr30k", "refcoco+", "vcr")


def settings(world, tmp_path, tasks, model="lxmert-tiny", **kw):
    return finetune_config(world, kw.pop("out", tmp_path / "ft"), tasks, model=model, **{"warmup": 2, **kw})


# --- task datasets -------------------------------------------------------------------------


def test_each_task_reads_its_official_files(world):
    expect = {
        "vqa": {"train": 48, "val": 24, "minval": 24},
        "gqa": {"train": 24, "val": 6, "testdev": 6, "submission": 6, "minval": 30},
        "nlvr2": {"train": 24, "dev": 12},
        "flickr30k": {"train": 120, "test": 60},
        "refcoco+": {"train": 24, "val": 6, "testA": 6},
        "vcr": {"train": 24, "val": 12},
    }
    for name, splits in expect.items():
        data = TaskData.open(world / name, task=name)
        assert data.manifest["splits"] == splits, name
        assert data.manifest["malformed"]["count"] == 0
        keys = data.store_keys(np.arange(len(data)))
        assert keys <= {f"img_{i}" for i in range(IMAGES)}, (name, sorted(keys)[:3])  # mapped to store keys
    vqa = TaskData.open(world / "vqa")
    assert set(vqa.answers) == {*COLORS, "yes", "no"}
    row = vqa.rows("train")[0]  # 'what color is the picture?' of image 0: red by all 10 annotators
    assert vqa.answers[vqa.column("answer_ids")[row][0]] == "red" and vqa.column("answer_scores")[row] == [1.0]
    assert vqa.column("answers")[row] == ["red"] * 10 and vqa.column("answer_type")[row] == "other"
    nlvr2 = TaskData.open(world / "nlvr2")
    assert nlvr2.column("images")[:3] == [["img_0", "img_2"], ["img_1", "img_3"], ["img_3", "img_5"]]
    assert nlvr2.column("label")[:4] == [1, 0, 1, 0]
    ref = TaskData.open(world / "refcoco+")
    assert ref.column("box")[0] == [5.0, 5.0, 70.0, 110.0]  # image 0's marked region: the grid's first box
    given = json.loads((world / "refcoco+" / "given_boxes.json").read_text())  # for extract --given-boxes
    assert given["COCO_train2014_000000000000"] == [[5.0, 5.0, 70.0, 110.0]] and len(given) == IMAGES
    from pipeline.detect.given_boxes import read_given_boxes

    assert read_given_boxes(world / "refcoco+" / "given_boxes.json")["COCO_train2014_000000000001"].shape == (1, 4)
    vcr = TaskData.open(world / "vcr")
    assert vcr.column("text")[0] == "what color is ball ?" and vcr.column("choices")[0][0] == "it is red ."


def test_vqa_named_splits_answer_table_and_soft_scores(tmp_path):
    """The table counts multiple_choice_answer over train+val (>= --min-count); soft targets
    are the official ones (3 of 10 annotators: 0.9); ViLBERT's minval is the last 3,000 val
    questions by question id; test-dev has no labels."""
    qs = {"train2014": [], "val2014": [], "test-dev2015": []}
    anns = {"train2014": [], "val2014": []}
    for s, split in enumerate(qs):
        for qid in range(20):
            image = qid // 4 + (0 if split == "train2014" else 100)
            qs[split].append({"image_id": image, "question": f"q {qid}?", "question_id": qid + 1000 * s})
            if split in anns:
                answers = ["dog"] * 7 + ["bird"] * 3 if qid % 2 else ["cat"] * 10
                anns[split].append(
                    {
                        "question_id": qid + 1000 * s,
                        "answer_type": "other",
                        "multiple_choice_answer": answers[0],
                        "answers": [{"answer": a} for a in answers],
                    }
                )
    files = []
    for split, questions in qs.items():
        (tmp_path / f"v2_OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps({"questions": questions}))
        files.append(tmp_path / f"v2_OpenEnded_mscoco_{split}_questions.json")
        if split in anns:
            (tmp_path / f"v2_mscoco_{split}_annotations.json").write_text(json.dumps({"annotations": anns[split]}))
            files.append(tmp_path / f"v2_mscoco_{split}_annotations.json")
    with pytest.raises(ConfigError, match="no answer occurs 21 times"):  # 'dog' and 'cat': 20 times each
        build_task(transfer.get("vqa"), files, tmp_path / "t", min_count=21)
    manifest = build_task(transfer.get("vqa"), files, tmp_path / "t", min_count=20)
    data = TaskData.open(tmp_path / "t")
    assert data.answers == ["cat", "dog"] and manifest["answers"]["train_rows_with_target"] == 20
    odd = data.rows("train")[1]
    assert dict(zip(data.column("answer_ids")[odd], data.column("answer_scores")[odd])) == {
        1: 1.0
    }  # 'bird' not in the table
    assert data.column("answers")[odd].count("bird") == 3
    val = [int(r) for r in data.rows("val")]
    assert [int(r) for r in data.rows("minval")] == val[-3000:] and len(data.rows("test-dev")) == 20
    assert data.column("label")[int(data.rows("test-dev")[0])] is None
    assert data.column("images")[val[0]] == ["COCO_val2014_000000000100"]
    (tmp_path / "ans2label.json").write_text(json.dumps({"dog": 1, "cat": 0, "bird": 2}))  # LXMERT's table format
    build_task(transfer.get("vqa"), files, tmp_path / "t", answers_from=tmp_path / "ans2label.json")
    data = TaskData.open(tmp_path / "t")
    assert data.answers == ["cat", "dog", "bird"]
    assert dict(zip(data.column("answer_ids")[odd], data.column("answer_scores")[odd])) == pytest.approx(
        {1: 1.0, 2: 0.9}
    )


def test_malformed_rows_are_named_counted_and_left_out(world, tmp_path):
    good = (world / "files" / "dev.json").read_text().splitlines()
    bad = tmp_path / "dev.json"
    bad.write_text(
        "\n".join([good[0], "{not json", good[1].replace('"True"', '"maybe"').replace('"False"', '"maybe"'), *good[2:]])
        + "\n"
    )
    manifest = build_task(transfer.get("nlvr2"), [bad], tmp_path / "t")
    assert manifest["malformed"]["count"] == 2
    assert [e.split(":")[:2] for e in manifest["malformed"]["examples"]] == [["dev.json", "2"], ["dev.json", "3"]]
    assert manifest["rows"] == len(good) - 1
    report = (tmp_path / "t" / "report.md").read_text()
    assert "Malformed rows: 2" in report and "dev.json:2" in report


def test_task_data_refusals(world, tmp_path):
    with pytest.raises(ConfigError, match="holds 'vqa' data, not 'gqa'"):
        TaskData.open(world / "vqa", task="gqa")
    with pytest.raises(ConfigError, match="not a task dataset"):
        TaskData.open(tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        build_task(transfer.get("vqa"), [tmp_path / "missing.json"], tmp_path / "t")
    with pytest.raises(ConfigError, match="has no answer table"):
        build_task(transfer.get("nlvr2"), [world / "files" / "dev.json"], tmp_path / "t", min_count=3)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("x")
    with pytest.raises(ConfigError):
        build_task(transfer.get("nlvr2"), [world / "files" / "dev.json"], tmp_path / "taken")
    assert (tmp_path / "taken" / "mine.txt").read_text() == "x"


# --- learning: one task of each head kind, a planted signal --------------------------------

LEARNING = {  # task: (model, steps, lr, metric, at least; chance)
    "vqa": ("lxmert-tiny", 60, 1e-3, "eval_vqa_accuracy", 75.0),  # answer classifier; chance 42 (yes/no + 3 colours)
    "nlvr2": ("lxmert-tiny", 40, 1e-3, "eval_nlvr2_accuracy", 90.0),  # pair classifier; 50
    "refcoco+": ("lxmert-tiny", 30, 1e-3, "eval_refcoco+_accuracy", 90.0),  # per-region scorer; 1 of 6 regions
    "vcr": ("vilbert-tiny", 80, 3e-3, "eval_vcr_q2a", 50.0),  # 4-way choice; 25
}
TEXT = {"vcr": 24}  # QA->R keeps the question and answer whole: 12 tokens would leave each rationale one word


@pytest.mark.parametrize("task", LEARNING)
def test_each_head_kind_learns_a_planted_signal(world, tmp_path, task):
    """Held-out images (val / dev / testA): what a head learned is the planted signal, read
    from the regions (and, for VCR, matched with the choice's words)."""
    model, steps, lr, metric, floor = LEARNING[task]
    last = run_finetune(
        settings(
            world,
            tmp_path,
            [task],
            model,
            steps=steps,
            lr=lr,
            batch_size=8,
            warmup=4,
            checkpoint_every=1000,
            log_every=10,
            max_text=TEXT.get(task, 12),
        )
    )
    assert last[metric] >= floor, last


# --- resume, multi-task, DDP ---------------------------------------------------------------


def test_finetune_resume_is_bit_exact_and_multitask_batches_alternate(world, tmp_path):
    """Two tasks round-robin: 6 steps straight equal 3 + resume + 3 (weights bit for bit);
    each step trains one task, alternating, and both are validated."""
    straight = run_finetune(settings(world, tmp_path / "a", ["vqa", "nlvr2"], steps=6, checkpoint_every=3))
    run_finetune(settings(world, tmp_path / "b", ["vqa", "nlvr2"], steps=6, checkpoint_every=3, stop_at=3))
    resumed = run_finetune(settings(world, tmp_path / "b", ["vqa", "nlvr2"], steps=6, checkpoint_every=3, resume="yes"))
    a = torch.load(tmp_path / "a" / "ft" / "checkpoints" / "step_0000006.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "ft" / "checkpoints" / "step_0000006.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert straight["eval_vqa_accuracy"] == resumed["eval_vqa_accuracy"]
    rows = [json.loads(line) for line in (tmp_path / "a" / "ft" / "metrics.jsonl").read_text().splitlines()]
    trained = [("loss_vqa" in r, "loss_nlvr2" in r) for r in rows if "loss_vqa" in r or "loss_nlvr2" in r]
    assert trained == [(True, False), (False, True)] * 3
    assert {"eval_vqa_accuracy", "eval_nlvr2_accuracy", "eval_nlvr2_consistency"} <= set(straight)
    assert (tmp_path / "a" / "ft" / "checkpoints" / "best").is_file()  # kept by the first task's metric


def test_task_batch_sampler_orders_and_resumes():
    rr = TaskBatchSampler([8, 4, 12], batch_size=2, seed=1)
    assert rr.order(0) == [0, 1, 2, 0, 1, 2, 0, 2, 0, 2, 2, 2]
    prop = TaskBatchSampler([8, 4, 12], batch_size=2, seed=1, mode="proportional")
    assert sorted(prop.order(0)) == sorted(rr.order(0)) and prop.order(0) != prop.order(1)
    batches = list(iter(rr))
    assert all(len(b) == 2 for b in batches) and sorted(i for b in batches for i in b) == list(range(24))
    assert all(len({0 if i < 8 else 1 if i < 12 else 2 for i in b}) == 1 for b in batches)  # one task per batch
    again = TaskBatchSampler([8, 4, 12], batch_size=2, seed=1)
    again.load_state_dict({**rr.state_dict(), "position": 10})  # 5 batches consumed
    assert list(iter(again)) == batches[5:]
    with pytest.raises(ValueError, match="another"):
        again.load_state_dict({**rr.state_dict(), "sizes": [8, 4]})


def test_torchrun_two_processes_finetune_like_one(world, tmp_path):
    """`vltrain finetune` under torchrun: 2 ranks x batch 2 = 1 process x batch 4, to float noise;
    the validation the 2 ranks shared (a batch each) scores as one process scores the same weights."""
    common = [
        "-m",
        "vl_models.cli",
        "finetune",
        "--task",
        "vqa",
        "--data",
        str(world / "vqa"),
        "--stores",
        str(world / "feats"),
        "--model",
        no_dropout_config(tmp_path),
        "--vocab",
        str(VOCAB),
        "--epochs",
        "0",
        "--steps",
        "3",
        "--lr",
        "1e-2",
        "--warmup",
        "1",
        "--optimizer",
        "sgd",
        "--max-regions",
        "8",
        "--eval-items",
        "4",
    ]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            *common,
            "--batch-size",
            "2",
            "--out",
            str(tmp_path / "ddp"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run(
        [sys.executable, *common, "--batch-size", "4", "--out", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    a = torch.load(tmp_path / "ddp" / "checkpoints" / "step_0000003.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "one" / "checkpoints" / "step_0000003.pt", weights_only=True)["model"]
    assert max((a[k].float() - b[k].float()).abs().max().item() for k in a) < 1e-5
    shared = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()][-1]
    alone = evaluate_checkpoint(
        EvaluateConfig(
            "vqa",
            str(tmp_path / "ddp"),
            world / "vqa",
            transfer.get("vqa").val_split,
            out=tmp_path / "eval",
            batch_size=2,
            limit=4,
        )
    )["metrics"]
    assert shared == {"step": 3, **{f"eval_vqa_{k}": v for k, v in alone.items()}}


# --- evaluation: official metrics, submission files ----------------------------------------


@pytest.fixture(scope="module")
def finetuned(world, tmp_path_factory):
    """One short fine-tuning run per task with a submission format (and retrieval)."""
    root = tmp_path_factory.mktemp("runs")
    runs = {}
    for task in ("vqa", "gqa", "nlvr2", "vcr", "flickr30k", "refcoco+"):
        amp = "bf16" if task == "gqa" else "none"  # mixed precision on CPU, as on GPUs
        run_finetune(settings(world, root / task, [task], steps=2, eval_items=4, amp=amp))
        runs[task] = root / task / "ft"
    return runs


def test_vqa_evaluation_writes_the_official_results_json(world, finetuned, tmp_path):
    result = evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned["vqa"]), world / "vqa", "val", out=tmp_path / "e"))
    results = json.loads((tmp_path / "e" / "vqa_results.json").read_text())
    data = TaskData.open(world / "vqa")
    rows = data.rows("val")
    assert sorted(r["question_id"] for r in results) == sorted(int(data.column("uid")[r]) for r in rows)
    annotations = [
        {
            "question_id": int(data.column("uid")[r]),
            "answer_type": data.column("answer_type")[r],
            "answers": [{"answer": a} for a in data.column("answers")[r]],
        }
        for r in rows
    ]
    official = vqa_report(results, annotations)  # the official evaluator's numbers on the written file
    assert result["metrics"]["accuracy"] == official["overall"]
    assert result["metrics"]["accuracy_yes_no"] == official["perAnswerType"]["yes/no"]
    saved = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert saved["metrics"] == result["metrics"] and saved["rows"] == 24


def test_gqa_nlvr2_vcr_submissions_are_in_the_official_formats(world, finetuned, tmp_path):
    gqa = evaluate_checkpoint(
        EvaluateConfig("gqa", str(finetuned["gqa"]), world / "gqa", "submission", out=tmp_path / "g")
    )
    assert gqa["metrics"] == {}  # the submission file has no answers: predictions only
    rows = json.loads((tmp_path / "g" / "gqa_predictions.json").read_text())
    assert {r["questionId"] for r in rows} == {f"s{i}" for i in range(30, IMAGES)}
    assert all(r["prediction"] in COLORS for r in rows)
    nlvr2 = evaluate_checkpoint(
        EvaluateConfig("nlvr2", str(finetuned["nlvr2"]), world / "nlvr2", "dev", out=tmp_path / "n")
    )
    lines = (tmp_path / "n" / "nlvr2_predictions.csv").read_text().splitlines()
    assert len(lines) == 12 and all(line.split(",")[1] in ("True", "False") for line in lines)
    assert set(nlvr2["metrics"]) == {"accuracy", "consistency"}
    vcr = evaluate_checkpoint(EvaluateConfig("vcr", str(finetuned["vcr"]), world / "vcr", "val", out=tmp_path / "v"))
    with open(tmp_path / "v" / "vcr_submission.csv") as f:
        table = list(csv.reader(f))
    assert len(table[0]) == 21 and table[0][:2] == ["annot_id", "answer_0"] and len(table) == 13
    probs = np.array([[float(v) for v in r[1:]] for r in table[1:]])
    assert np.allclose(probs[:, :4].sum(1), 1) and np.allclose(probs[:, 4:].reshape(-1, 4, 4).sum(2), 1)
    assert set(vcr["metrics"]) == {"q2a", "qa2r", "q2ar"}


def test_retrieval_scores_every_pair_and_zero_shot_uses_the_pair_head(world, finetuned, tmp_path):
    seen = []
    result = evaluate_checkpoint(
        EvaluateConfig("flickr30k", str(finetuned["flickr30k"]), world / "flickr30k", "test", out=tmp_path / "r"),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert seen[-1] == (60 * 12, 60 * 12)  # 60 captions x 12 images
    assert {"text_to_image_R@1", "image_to_text_R@10", "text_to_image_median_rank"} <= set(result["metrics"])
    ranked = json.loads((tmp_path / "r" / "flickr30k_rankings.json").read_text())
    assert len(ranked) == 60 and all(len(r["images"]) == 10 for r in ranked)
    zero = evaluate_checkpoint(
        EvaluateConfig(
            "flickr30k", str(finetuned["vqa"]), world / "flickr30k", "test", out=tmp_path / "z", zero_shot=True, limit=4
        )
    )
    assert zero["examples"] == 20  # the captions of the first 4 images
    with pytest.raises(ConfigError, match="needs a fine-tuned head"):
        evaluate_checkpoint(EvaluateConfig("vqa", str(finetuned["vqa"]), world / "vqa", "val", zero_shot=True))
    with pytest.raises(ConfigError, match="no fine-tuning run of nlvr2"):
        evaluate_checkpoint(EvaluateConfig("nlvr2", str(finetuned["vqa"]), world / "nlvr2", "dev"))


def test_grounding_is_scored_on_the_chosen_region_box(world, finetuned, tmp_path):
    result = evaluate_checkpoint(
        EvaluateConfig("refcoco+", str(finetuned["refcoco+"]), world / "refcoco+", "testA", out=tmp_path / "g")
    )
    chosen = json.loads((tmp_path / "g" / "refcoco+_predictions.json").read_text())
    data = TaskData.open(world / "refcoco+")
    truth = [data.column("box")[int(r)] for r in data.rows("testA")]
    hits = [c["box"] == t for c, t in zip(chosen, truth)]  # disjoint boxes: IoU > 0.5 only for the referred one
    assert result["metrics"]["accuracy"] == pytest.approx(100 * np.mean(hits))


# --- the command lines ---------------------------------------------------------------------


def test_command_lines_build_finetune_and_evaluate(world, tmp_path):
    files = world / "files"
    build = run_cli(
        "build-task",
        "--task",
        "nlvr2",
        "--out",
        tmp_path / "t",
        files / "train.json",
        files / "dev.json",
        "--image-map",
        files / "image_map.tsv",
    )
    assert build.returncode == 0, build.stderr
    assert "nlvr2: 36 rows (dev 12, train 24)" in build.stdout
    bad = run_cli("build-task", "--task", "nlvr3", "--out", tmp_path / "u", files / "dev.json")
    assert bad.returncode != 0 and "unknown task 'nlvr3'" in bad.stderr
    ft = run_vltrain(
        "finetune",
        "--task",
        "nlvr2",
        "--data",
        tmp_path / "t",
        "--stores",
        world / "feats",
        "--model",
        "vilbert-tiny",
        "--vocab",
        VOCAB,
        "--epochs",
        "0",
        "--steps",
        "2",
        "--batch-size",
        "4",
        "--max-regions",
        "6",
        "--out",
        tmp_path / "run",
    )
    assert ft.returncode == 0, ft.stderr[-2000:]
    assert "eval_nlvr2_accuracy" in ft.stdout
    ev = run_vltrain(
        "evaluate",
        "--task",
        "nlvr2",
        "--checkpoint",
        tmp_path / "run",
        "--step",
        "best",
        "--data",
        tmp_path / "t",
        "--split",
        "dev",
    )
    assert ev.returncode == 0, ev.stderr[-2000:]
    assert "accuracy" in ev.stdout and (tmp_path / "run" / "eval" / "nlvr2-dev" / "nlvr2_predictions.csv").is_file()
    mismatch = run_vltrain(
        "finetune",
        "--task",
        "vqa",
        "--task",
        "gqa",
        "--data",
        world / "vqa",
        "--stores",
        world / "feats",
        "--out",
        tmp_path / "x",
    )
    assert mismatch.returncode != 0 and "one task dataset per --task" in mismatch.stderr


def test_every_finetune_config_field_has_a_flag_and_every_flag_a_field():
    import dataclasses

    import typer

    from vl_models.cli import app
    from vl_models.config import FINETUNE_SECTIONS

    params = {p.name for p in typer.main.get_command(app).commands["finetune"].params}
    # masking and the pair task's texts: not in fine-tuning
    pretraining_only = {"region_overlap", "mlm_prob", "region_prob", "mismatch_prob", "pair_texts"}
    own = {f.name for f in dataclasses.fields(FinetuneConfig)} - set(FINETUNE_SECTIONS)
    fields = own | {f.name for cls in FINETUNE_SECTIONS.values() for f in dataclasses.fields(cls)}
    assert sorted(fields - params - pretraining_only) == []
    assert sorted(params - fields) == ["recipe"]  # --recipe sets the others' defaults


def test_wordpiece_pairs_truncate_the_second_side():
    """As vilbert-multi-task's VCR pairs: the question stays whole, the choice loses tokens."""
    from vl_models.data.tokenize import WordPiece

    tok = WordPiece(VOCAB)
    enc = tok.encode_pair("what color is the ball", "it is red", 9)
    words = tok.tok.decode(enc.ids.tolist(), skip_special_tokens=False).split()
    assert words == ["[CLS]", "what", "color", "is", "the", "ball", "[SEP]", "it", "[SEP]"]
    assert enc.mask.tolist() == [1] * 9 and enc.special.tolist() == [True] + [False] * 5 + [True, False, True]
    assert enc.types.tolist() == [0] * 7 + [1] * 2


@pytest.mark.parametrize("head", ["pretraining", "new"])
@pytest.mark.parametrize("model", ["vilbert-tiny", "lxmert-tiny"])
def test_retrieval_reuses_single_stream_states_with_the_same_scores(world, model, head):
    """`score_pairs` runs each caption's and each image's single-modality layers once (captions
    sorted by length, each batch and each image padded to what it uses): its scores equal full
    pair forwards (`ModelFamily.encode`, padded to the maximum) of the same pairs to 1e-5, with
    the pretraining pair head and with a new scorer of the pooled pair (``retrieval_head="new"``:
    a `ChoiceHead`, 12-in-1's ``vil_logit``)."""
    from vl_models.config import DataSettings
    from vl_models.transfer.dataset import TaskDataset
    from vl_models.transfer.evaluate import score_pairs
    from vl_models.transfer.heads import ChoiceHead, RetrievalHead, build_transfer_model
    from vl_models.transfer.runs import model_of

    data = TaskData.open(world / "flickr30k")
    family, mcfg = model_of(model, None, str(world / "feats"), 1)
    torch.manual_seed(0)
    tmodel = build_transfer_model(family, mcfg, [transfer.get("flickr30k")], [data], retrieval_head=head).eval()
    assert isinstance(tmodel.heads["flickr30k"], RetrievalHead if head == "pretraining" else ChoiceHead)
    view = TaskDataset(
        data,
        transfer.get("flickr30k"),
        [world / "feats"],
        VOCAB,
        family,
        DataSettings(max_regions=8, max_text=12),
        "test",
        train=False,
    )
    assert view.cfg.padding == "batch"
    found = score_pairs(tmodel, view, "cpu", batch_size=7, limit=3)
    scores, images = found.values["scores"], found.values["images"]
    assert scores.shape == (15, 3) and images == ["img_24", "img_25", "img_26"]
    lengths = [int(view.text(view.value("text", int(np.nonzero(view.rows == r)[0][0])))["attention_mask"].sum())
               for r in found.rows]  # fmt: skip
    assert len(set(lengths)) > 1  # captions of several lengths: batches padded differently
    full = full_pair_scores(tmodel, view, found.rows, images)
    assert np.abs(full - scores).max() < 1e-5, np.abs(full - scores).max()


def test_zero_shot_retrieval_reuses_single_stream_states_with_the_same_scores(world, finetuned, tmp_path, monkeypatch):
    """`vltrain evaluate --zero-shot` (the pretraining pair head on a run's backbone) scores
    through the cached path: its scores equal full pair forwards to 1e-5."""
    from vl_models.transfer import evaluate as ev

    seen = spy_on_pair_scores(monkeypatch, ev)
    result = ev.evaluate_checkpoint(
        EvaluateConfig(
            "flickr30k", str(finetuned["vqa"]), world / "flickr30k", "test", out=tmp_path / "z", zero_shot=True, limit=3
        )
    )
    assert result["examples"] == 15 and seen["scores"].shape == (15, 3)
    assert_scores_as_full_forwards(seen)  # `predict` gave the model back in the mode it was built in


# --- where the model comes from: a pretraining run of ours, HF LXMERT, vilbert-multi-task ---


def test_finetune_from_a_pretraining_run_copies_the_qa_rows_by_answer(world, data, tmp_path):
    """LXMERT pretrained on a mixture whose answers include 'red': the VQA head starts with the
    QA head's hidden layers and its 'red' row (lr 0: the checkpoint holds the initialization)."""
    from train_helpers import config

    from vl_models.train.trainer import run as pretrain

    pretrain(config(data, tmp_path, "lxmert-tiny", steps=2, max_regions=8))
    pretrained = torch.load(tmp_path / "run" / "checkpoints" / "step_0000002.pt", weights_only=True)
    old_answers = json.loads((data / "mix" / "answers.json").read_text())["answers"]
    run_finetune(
        settings(
            world,
            tmp_path,
            ["vqa"],
            model=None,
            vocab=None,
            init=str(tmp_path / "run"),
            lr=0.0,
            steps=1,
            out=str(tmp_path / "ft"),
        )
    )
    tuned = torch.load(tmp_path / "ft" / "checkpoints" / "step_0000001.pt", weights_only=True)
    new_answers = TaskData.open(world / "vqa").answers
    head, qa = "heads.vqa.logit_fc.", "answer_head.logit_fc."
    for layer in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert torch.equal(tuned["model"][head + layer], pretrained["model"][qa + layer])
    shared = set(old_answers) & set(new_answers)
    assert "red" in shared
    for answer in shared:
        assert torch.equal(
            tuned["model"][head + "3.weight"][new_answers.index(answer)],
            pretrained["model"][qa + "3.weight"][old_answers.index(answer)],
        )
    backbone = {k[len("backbone.") :]: v for k, v in tuned["model"].items() if k.startswith("backbone.")}
    assert all(torch.equal(v, pretrained["model"][k]) for k, v in backbone.items())
    assert tuned["run"]["model"] == pretrained["run"]["model"]  # the model config came with the run
    run_finetune(
        settings(
            world,
            tmp_path,
            ["nlvr2"],
            model=None,
            vocab=None,
            init=str(tmp_path / "ft"),
            lr=0.0,
            steps=1,
            out=str(tmp_path / "ft2"),
        )
    )  # from a fine-tuned backbone: its heads stay behind
    again = torch.load(tmp_path / "ft2" / "checkpoints" / "step_0000001.pt", weights_only=True)["model"]
    assert all(torch.equal(again[k], v) for k, v in tuned["model"].items() if k.startswith("backbone."))
    assert not any(k.startswith("heads.vqa.") for k in again)


def test_finetune_from_hf_lxmert_and_vilbert_multi_task_checkpoints(world, tmp_path):
    """--init a transformers LxmertForPreTraining folder (with --model and --init-answers) and a
    vilbert-multi-task ``pretrained_model.bin``: the backbone holds their tensors."""
    import transformers

    from pipeline.store import FeatureStore
    from vl_models import families

    store = FeatureStore.open(world / "feats").layout
    lxmert = families.get("lxmert")
    mcfg = lxmert.fit(families.load_config("lxmert-tiny"), store, 3, "feats")
    torch.manual_seed(1)
    hf = transformers.LxmertForPreTraining(transformers.LxmertConfig(**mcfg.hf_config()))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    (tmp_path / "all_ans.json").write_text(json.dumps([{"ans": a} for a in ("blue", "zebra", "red")]))
    run_finetune(
        settings(
            world,
            tmp_path / "a",
            ["vqa"],
            init=str(tmp_path / "hf"),
            lr=0.0,
            steps=1,
            init_answers=str(tmp_path / "all_ans.json"),
        )
    )
    tuned = torch.load(tmp_path / "a" / "ft" / "checkpoints" / "step_0000001.pt", weights_only=True)["model"]
    hf_state = hf.state_dict()
    assert torch.equal(
        tuned["backbone.lxmert.encoder.x_layers.0.visual_attention.att.query.weight"],
        hf_state["lxmert.encoder.x_layers.0.visual_attention.att.query.weight"],
    )
    answers = TaskData.open(world / "vqa").answers
    assert torch.equal(
        tuned["heads.vqa.logit_fc.3.weight"][answers.index("red")], hf_state["answer_head.logit_fc.3.weight"][2]
    )

    vilbert = families.get("vilbert")
    vcfg = vilbert.fit(families.load_config("vilbert-tiny"), store, 0, "feats")
    torch.manual_seed(2)
    source = vilbert.build(vcfg)
    torch.save(source.state_dict(), tmp_path / "pretrained_model.bin")  # vilbert-multi-task's layout: bert.*, cls.*
    run_finetune(
        settings(
            world,
            tmp_path / "b",
            ["nlvr2"],
            model="vilbert-tiny",
            init=str(tmp_path / "pretrained_model.bin"),
            lr=0.0,
            steps=1,
        )
    )
    tuned = torch.load(tmp_path / "b" / "ft" / "checkpoints" / "step_0000001.pt", weights_only=True)["model"]
    assert all(torch.equal(tuned[f"backbone.{k}"], v) for k, v in source.state_dict().items())


@pytest.mark.parametrize("model", ["vilbert-tiny", "lxmert-tiny"])
@pytest.mark.parametrize("task", TASKS)
def test_each_task_scores_alike_on_batches_cut_to_what_they_use(world, model, task):
    """Dynamic padding (`vl_models.data.padding`) in fine-tuning and evaluation: examples padded
    to 40 tokens and 20 region slots, cut to what the batch uses, give every candidate the logits
    (RefCOCO+: on the slots kept; the cut ones are padding) and the batch the loss of the fully
    padded batch, within 1e-5."""
    from vl_models.config import DataSettings
    from vl_models.data.padding import trim_padding
    from vl_models.transfer.dataset import TaskDataset
    from vl_models.transfer.heads import build_transfer_model
    from vl_models.transfer.runs import model_of

    data, spec = TaskData.open(world / task), transfer.get(task)
    family, mcfg = model_of(model, None, str(world / "feats"), len(data.answers))
    torch.manual_seed(0)
    tmodel = build_transfer_model(family, mcfg, [spec], [data]).eval()
    split = "train" if "train" in data.splits else data.splits[0]
    view = TaskDataset(
        data, spec, [world / "feats"], VOCAB, family, DataSettings(max_regions=20, max_text=40), split, train=True
    )
    full = torch.utils.data.default_collate([view[i] for i in range(min(6, len(view)))])
    cut = trim_padding(full)
    assert cut["input_ids"].shape[-1] < 40 and cut["visual_mask"].shape[-1] < 20
    with torch.no_grad():
        a, b = tmodel(task, full), tmodel(task, cut)
        a = a[..., : b.shape[-1]] if spec.head == "regions" else a
        assert a.shape == b.shape and (a - b).abs().max() < 1e-5
        head = tmodel.heads[task]
        assert abs(float(head.loss(tmodel(task, full), full)[0]) - float(head.loss(b, cut)[0])) < 1e-5
