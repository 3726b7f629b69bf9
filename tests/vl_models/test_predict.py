"""Asking a model about raw images (`vltrain predict`, `load_predictor`), on the shapes world:
features bitwise equal to the store `vlprep extract` wrote, every task's prediction equal to
`vltrain evaluate` on the same split, zero-shot heads of a pretraining run, named errors with
exit 2, the command line's JSON lines and picture."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, extract_shapes_world, run_vltrain
from train_helpers import config, finetune_config

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.weights import save_detector
from pipeline.detect.config import ExtractConfig
from pipeline.detect.like_store import ImageInputError, ProvenanceError, StoreDetector
from pipeline.detect.run import run_extract
from pipeline.download.fetch import FetchConfig
from pipeline.mixture import Mixture
from pipeline.store import FeatureStore
from pipeline.task_data import TaskData
from vl_models import load_predictor, transfer
from vl_models.config import EvaluateConfig
from vl_models.demo import build_task_datasets, make_mixture
from vl_models.predict import PredictError, StoreImage
from vl_models.train.trainer import run as run_pretraining
from vl_models.transfer.evaluate import evaluate_checkpoint
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.task import Predictions

TASKS = ("vqa", "nlvr2", "flickr30k", "refcoco+", "vcr")


def image_file(world: Path, key: str) -> str:
    """The world's image file of a store key (``cc3m-val-00000003`` -> images/shapes_val_00000003.jpg)."""
    _, split, number = key.split("-")
    return str(world / "images" / f"shapes_{split}_{number}.jpg")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """A 16-scene world extracted with the shapes detector (as the demo: through the download
    path), its task datasets, a fine-tuning run of every task and a pretraining run."""
    root = tmp_path_factory.mktemp("predict")
    world = extract_shapes_world(root, 16)
    build_task_datasets(root)
    run_finetune(
        finetune_config(
            root / "tasks",
            root / "finetuned",
            TASKS,
            stores=(str(root / "features"),),
            steps=3,
            max_regions=20,
            max_text=24,
            checkpoint_every=3,
        )
    )
    make_mixture(world, root / "features", root / "mixture", ("coco_captions", "vqa"))
    make_mixture(world, root / "features", root / "captions", ("coco_captions",))
    for model, mixture, out in (("lxmert-tiny", "mixture", "pretrained"), ("vilbert-tiny", "captions", "vilbert")):
        run_pretraining(
            config(
                root,
                root,
                model,
                stores=(str(root / "features"),),
                mixture=str(root / mixture),
                out=str(root / out),
                steps=2,
                max_regions=20,
                max_text=24,
            )
        )
    return root


@pytest.fixture(scope="module")
def predictor(shapes):
    return load_predictor(shapes / "finetuned")


def val_rows(shapes: Path, task: str, split: str = "val") -> tuple[TaskData, np.ndarray]:
    data = TaskData.open(shapes / "tasks" / task, task=task)
    return data, data.rows(split)


def test_new_images_get_the_stores_own_features_bitwise(shapes):
    detector = StoreDetector.of(shapes / "features")
    store = FeatureStore.open(shapes / "features", dtype="float32")
    keys = [f"cc3m-val-{i:08d}" for i in range(3)] + ["cc3m-train-00000005"]
    images = [detector.load(image_file(shapes / "world", k)) for k in keys]
    for key, record in zip(keys, detector.extract(images)):
        stored = store.get(key)
        assert record.num_boxes == stored.num_boxes
        for field in ("boxes", "features", "objects_id", "objects_conf", "cls_prob"):
            assert np.array_equal(getattr(record, field), getattr(stored, field)), (key, field)
        assert (record.image_h, record.image_w) == (stored.image_h, stored.image_w)


def test_a_folder_store_of_random_weights_is_rebuilt_bitwise_and_is_not_the_runs_detector(shapes, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(3):
        (folder / f"p{i}.jpg").write_bytes(Path(image_file(shapes / "world", f"cc3m-val-{i:08d}")).read_bytes())
    run_extract(
        ExtractConfig(out=tmp_path / "store", images=folder, random_weights=True, seed=3, detector="shapes-tiny")
    )
    torch.manual_seed(7)
    before = torch.rand(3)
    torch.manual_seed(7)
    detector = StoreDetector.of(tmp_path / "store")  # the untrained detector rebuilt from its seed
    assert torch.equal(torch.rand(3), before)  # ... without touching the caller's random stream
    store = FeatureStore.open(tmp_path / "store", dtype="float32")
    for i, record in enumerate(detector.extract([detector.load(str(folder / f"p{i}.jpg")) for i in range(3)])):
        assert np.array_equal(record.features, store.get(f"p{i}").features)
        assert np.array_equal(record.boxes, store.get(f"p{i}").boxes)
    with pytest.raises(ProvenanceError, match="weights_sha256 'random-seed-3'"):
        load_predictor(shapes / "finetuned", store=tmp_path / "store")


def test_every_task_predicts_what_evaluate_scores(shapes, predictor, tmp_path):
    world, run = shapes / "world", shapes / "finetuned"

    def evaluated(task: str, split: str) -> Path:
        out = tmp_path / task
        evaluate_checkpoint(EvaluateConfig(task, str(run), shapes / "tasks" / task, split, out=out, given_stores=[]))
        return out

    # VQA: the answers of the official results file
    data, rows = val_rows(shapes, "vqa")
    results = json.loads((evaluated("vqa", "val") / "vqa_results.json").read_text())
    asked = predictor.ask(
        [{"image": image_file(world, data.images(r)[0]), "question": data.column("text")[r]} for r in rows], k=3
    )
    assert [a["answer"] for a in asked] == [r["answer"] for r in results]
    assert all(len(a["top_k"]) == 3 and a["top_k"][0]["score"] >= a["top_k"][1]["score"] for a in asked)
    # NLVR2: the verdicts of lil-lab's CSV
    data, rows = val_rows(shapes, "nlvr2", "dev")
    with open(evaluated("nlvr2", "dev") / "nlvr2_predictions.csv") as f:
        verdicts = {line[0]: line[1] == "True" for line in csv.reader(f)}
    for r in rows:
        left, right = (image_file(world, k) for k in data.images(r))
        label, probability = predictor.verify(left, right, data.column("text")[r])
        assert label == verdicts[data.column("uid")[r]] and (probability > 0.5) == label
    # RefCOCO+: the chosen boxes
    data, rows = val_rows(shapes, "refcoco+")
    chosen = json.loads((evaluated("refcoco+", "val") / "refcoco+_predictions.json").read_text())
    for r, expected in zip(rows, chosen):
        box, score = predictor.ground(image_file(world, data.images(r)[0]), data.column("text")[r])
        assert np.allclose(box, expected["box"]) and 0 < score < 1
    # VCR: the leaderboard CSV's answer and rationale probabilities
    data, rows = val_rows(shapes, "vcr")
    with open(evaluated("vcr", "val") / "vcr_submission.csv") as f:
        submitted = list(csv.DictReader(f))
    for r, line in zip(rows, submitted):
        got = predictor.choose(
            image_file(world, data.images(r)[0]),
            data.column("text")[r],
            data.column("choices")[r],
            data.column("rationales")[r],
        )
        assert np.allclose(got["answer_probabilities"], [float(line[f"answer_{a}"]) for a in range(4)], atol=1e-6)
        for a in range(4):
            expect = [float(line[f"rationale_conditioned_on_a{a}_{k}"]) for k in range(4)]
            assert np.allclose(got["rationale_probabilities"][a], expect, atol=1e-6)
    # Flickr30k: every caption ranks the split's images; the metrics are evaluate's
    metrics = json.loads((evaluated("flickr30k", "val") / "metrics.json").read_text())["metrics"]
    assert ranked(shapes, predictor) == pytest.approx(metrics, abs=1e-9)


def ranked(shapes: Path, predictor) -> dict:
    """Flickr30k's metrics on its val split from `predictor.rank`: each caption ranks the images."""
    data, rows = val_rows(shapes, "flickr30k")
    keys = list(dict.fromkeys(data.images(r)[0] for r in rows))
    files = [image_file(shapes / "world", k) for k in keys]
    scores = np.stack([[dict(predictor.rank(data.column("text")[r], files))[f] for f in files] for r in rows])
    truth = np.array([keys.index(data.images(r)[0]) for r in rows])
    return transfer.get("flickr30k").score(
        data, Predictions(rows, {"scores": scores, "image_of_caption": truth, "images": keys})
    )


def test_store_ids_answer_as_their_images_do(shapes, predictor):
    world = shapes / "world"
    key = "cc3m-val-00000001"
    assert predictor.answer(StoreImage(key), "what color is the cube?") == predictor.answer(
        image_file(world, key), "what color is the cube?"
    )


def test_a_pretraining_run_answers_zero_shot(shapes, tmp_path):
    p = load_predictor(shapes / "pretrained")
    image = image_file(shapes / "world", "cc3m-val-00000000")
    answers = p.answer(image, "what color is the ball?", k=4)
    table = set(Mixture.open(shapes / "mixture").answers)
    assert len(answers) == 4 and {a for a, _ in answers} <= table
    every = p.ask([{"image": image, "question": "what?"}], k=len(table))[0]
    assert every["zero_shot"] and abs(sum(a["score"] for a in every["top_k"]) - 1) < 1e-4  # softmax over the table
    probability = p.match(image, "a red ball")
    assert 0 < probability < 1
    zero_shot = evaluate_checkpoint(
        EvaluateConfig(
            "flickr30k", str(shapes / "pretrained"), shapes / "tasks" / "flickr30k", "val", out=tmp_path, zero_shot=True
        )
    )
    assert ranked(shapes, p) == pytest.approx(zero_shot["metrics"], abs=1e-9)  # the pair head, as --zero-shot
    with pytest.raises(PredictError, match="no head"):
        p.ground(image, "the red ball")
    vilbert = load_predictor(shapes / "vilbert")  # ViLBERT's alignment head; no QA head
    assert vilbert.tasks == ["pair-head"] and 0 < vilbert.match(image, "a red ball") < 1
    with pytest.raises(PredictError, match="no head for a question"):
        vilbert.answer(image, "what color is the ball?")


def test_bad_input_is_a_named_error_that_costs_only_its_query(shapes, predictor, tmp_path):
    world = shapes / "world"
    good = image_file(world, "cc3m-val-00000000")
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"\xff\xd8\xff" + b"not a jpeg" * 10)
    (tmp_path / "empty").mkdir()
    results = predictor.ask(
        [
            {"id": 1, "image": str(garbage), "question": "what?"},
            {"id": 2, "image": good, "question": "  "},
            {"id": 3, "image": "http://127.0.0.1:9/x.jpg", "question": "what?"},
            {"id": 4, "image": good, "question": "what color is the cube?"},
            {"id": 5, "image": str(tmp_path / "missing.jpg"), "question": "what?"},
            {"id": 6, "image": good, "text": "a ball"},
            {"id": 7, "images": [good], "statement": "there is a ball"},
            {"id": 8, "image": str(tmp_path / "empty"), "question": "what?"},
        ]
    )
    assert [r.get("error") for r in results] == [
        "decode error",
        "empty text",
        "private address",
        None,
        "file not found",
        None,  # the retrieval head scores a text against an image
        "bad query",
        "a folder",
    ]
    assert results[3]["task"] == "vqa" and results[3]["id"] == 4
    small = load_predictor(shapes / "finetuned", fetch=FetchConfig(max_bytes=100))
    with pytest.raises(PredictError, match="too large"):
        small.answer(good, "what?")


def test_a_detector_other_than_the_stores_is_refused(shapes, tmp_path):
    other = tmp_path / "other.pkl"
    save_detector(VGDetector(DetectorConfig.load("shapes-tiny")), other)
    with pytest.raises(ProvenanceError, match="not the same detector"):
        StoreDetector.of(shapes / "features", weights=other)
    with pytest.raises(ProvenanceError, match="was extracted with 'shapes-tiny'"):
        StoreDetector.of(shapes / "features", detector="vg-r101")
    with pytest.raises(ImageInputError, match="file not found"):
        StoreDetector.of(shapes / "features").load(str(tmp_path / "nothing.jpg"))


def test_the_command_line_writes_json_lines_a_picture_and_exits_2_on_bad_input(shapes, tmp_path):
    world, run = shapes / "world", shapes / "finetuned"
    image = image_file(world, "cc3m-val-00000002")
    proc = run_vltrain(
        "predict", "--checkpoint", run, "--image", image, "--question", "what color is the cube?", "--top-k", "2"
    )
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout)
    assert line["task"] == "vqa" and len(line["top_k"]) == 2
    proc = run_vltrain(
        "predict", "--checkpoint", run, "--image", image, "--expression", "the red ball", "--show", tmp_path / "box.png"
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "box.png").read_bytes()[:4] == b"\x89PNG"
    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        json.dumps({"id": "a", "image": image, "question": "what shape is red?"})
        + "\n{not json\n"
        + json.dumps({"id": "b", "image_id": "cc3m-val-00000003", "question": "how many balls?"})
        + "\n"
        + json.dumps({"id": "c", "caption": "a red ball", "images": [str(world / "images")]})
        + "\n"
    )
    proc = run_vltrain("predict", "--checkpoint", run, "--queries", queries, "--out", tmp_path / "out.jsonl")
    assert proc.returncode == 2 and "1 of 4 queries failed" in proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [x.get("id") for x in lines] == ["a", "line 2", "b", "c"]
    assert lines[1]["error"] == "bad query" and "answer" in lines[2]
    assert len(lines[3]["ranking"]) == 16  # every image of the folder
    second = image_file(world, "cc3m-val-00000003")
    proc = run_vltrain("predict", "--checkpoint", run, "--caption", "a red ball", "--images", image, second)  # a glob
    assert proc.returncode == 0, proc.stderr
    assert {r["image"] for r in json.loads(proc.stdout)["ranking"]} == {image, second}
    proc = run_vltrain("predict", "--checkpoint", run, "--image", image, "--question", "what?", second)
    assert proc.returncode == 2 and "ranked for a --caption" in proc.stderr
    proc = run_vltrain("predict", "--checkpoint", run, "--image", image, "--question", "")
    assert proc.returncode == 2 and "empty text" in proc.stderr
    proc = run_vltrain("predict", "--checkpoint", run, "--image", str(tmp_path / "x.jpg"), "--question", "what?")
    assert proc.returncode == 2 and "file not found" in proc.stderr


PREDICT_FLAG_NAMES = (
    "--checkpoint --image --images --image-id --question --statement --expression --caption --text --choice "
    "--rationale --answer --task --top-k --queries --out --show --step --store --weights --detector --vocab "
    "--data --allow-private-network --device --batch-size --detector-threads"
).split()


def test_predict_flags_come_from_its_config():
    """`vltrain predict`'s options are `PredictConfig`'s fields, one each: the flag names as
    they are, each field's default and declared help, shown by --help in its group's panel; the
    images after the flags are its one argument."""
    import dataclasses

    import typer
    from typer.testing import CliRunner

    from vl_models.cli import app
    from vl_models.predict.command import PREDICT_FLAGS
    from vl_models.predict.config import PredictConfig

    command = typer.main.get_command(app).commands["predict"]
    options = {p.name: p for p in command.params if p.param_type_name == "option" and p.name != "help"}
    fields = {f.name: f for f in dataclasses.fields(PredictConfig)}
    assert sorted(options) == sorted(fields)
    assert sorted(o for p in options.values() for o in (*p.opts, *p.secondary_opts)) == sorted(PREDICT_FLAG_NAMES)
    declared = {name: (group, group.flag(name)) for group in PREDICT_FLAGS for name in group.flags}
    assert sorted(declared) == sorted(fields) and sum(len(g.flags) for g in PREDICT_FLAGS) == len(fields)
    shown = CliRunner().invoke(app, ["predict", "--help"], env={"COLUMNS": "250", "NO_COLOR": "1"}, terminal_width=250)
    assert shown.exit_code == 0, shown.output
    for name, field in fields.items():
        group, flag = declared[name]
        option = options[name]
        assert (option.help, option.rich_help_panel) == (flag.help, group.panel), name
        assert flag.help in shown.output and f"╭─ {group.panel} " in shown.output, name
        if field.default is dataclasses.MISSING:
            assert option.required and option.default is None, name
            continue
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        assert not option.required and option.default == default, name
        if default not in (None, [], False):
            assert f"[default: {default}]" in shown.output, name
    arguments = [(p.name, p.metavar, p.nargs) for p in command.params if p.param_type_name == "argument"]
    assert arguments == [("more_images", "IMAGES", -1)]


def test_predict_config_refuses_what_the_command_refuses():
    """`PredictConfig` checks itself (the Python API as the command line): each message names the flag."""
    from pipeline.errors import ConfigError
    from vl_models.predict.config import PredictConfig

    ask = {"checkpoint": "run", "image": ["a.jpg"], "question": "what?"}
    assert PredictConfig(**ask).task_folders == {}
    assert PredictConfig(**ask, task_data=["vqa=tasks/vqa"]).task_folders == {"vqa": "tasks/vqa"}
    cases = [
        ({"checkpoint": "run"}, "ask with the flags"),
        ({**ask, "queries": "q.jsonl"}, "ask with the flags"),
        ({"checkpoint": "run", "queries": "q.jsonl", "show": "a.png"}, "--show draws one query"),
        ({**ask, "batch_size": 0}, "--batch-size must be >= 1, got 0"),
        ({**ask, "detector_threads": 0}, "--detector-threads must be >= 1"),
        ({**ask, "top_k": 0}, "--top-k must be >= 1, got 0 (leave it out"),
        ({**ask, "show": "box.jpg"}, "the picture is a PNG"),
        ({**ask, "task_data": ["vqa"]}, "--data 'vqa': TASK=FOLDER"),
        ({**ask, "device": "tpu"}, "--device must be auto, cpu, cuda or cuda:N"),
        ({**ask, "out": "a.png", "show": "a.png"}, "--out and --show are the same file"),
    ]
    for values, words in cases:
        with pytest.raises(ConfigError) as err:
            PredictConfig(**values)
        assert words in str(err.value), (values, str(err.value))


def test_the_vltrain_command_line_loads_without_torch():
    """`vltrain --help` builds predict's flags from its config without loading a model."""
    import subprocess
    import sys

    code = "import sys, vl_models.cli; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr


# -- hostile and careless use (round 3) -----------------------------------------------------------


def _predict(shapes, *args, **kw):
    return run_vltrain("predict", "--checkpoint", shapes / "finetuned", *map(str, args), **kw)


def test_predict_never_writes_over_its_inputs_or_a_device(shapes, tmp_path):
    """--out and --show are outputs: never the queries file, the image asked about, the run's
    store or vocab, a device, a pipe or a file in a folder that does not exist; refused (exit 2)
    before any work, the file untouched."""
    import os

    image = tmp_path / "scene.jpg"
    image.write_bytes(Path(image_file(shapes / "world", "cc3m-val-00000000")).read_bytes())
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"image": str(image), "question": "what color is the cube?"}) + "\n")
    before = {p: p.read_bytes() for p in (image, queries)}
    run = json.loads((shapes / "finetuned" / "config.json").read_text())["train"]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (["--queries", queries, "--out", queries], "overlaps the input"),
        (["--queries", queries, "--out", image], "overlaps the input"),
        (["--image", image, "--question", "what?", "--show", image.with_suffix(".png"), "--out", image], "overlaps"),
        (["--image", image, "--question", "what?", "--out", Path(run["stores"][0]) / "manifest.json"], "overlaps"),
        (["--image", image, "--question", "what?", "--out", run["vocab"]], "overlaps the input"),
        (["--image", image, "--question", "what?", "--out", fifo], "is not a regular file"),
        (["--image", image, "--question", "what?", "--out", "/dev/null"], "is not a regular file"),
        (["--image", image, "--question", "what?", "--out", tmp_path / "no" / "a.jsonl"], "does not exist"),
        (["--image", image, "--question", "what?", "--show", tmp_path / "box.jpg"], "the picture is a PNG"),
        (["--image", image, "--question", "what?", "--show", tmp_path / "box"], "the picture is a PNG"),
        (["--image", image, "--question", "what?", "--batch-size", "0"], "--batch-size must be >= 1"),
        (["--image", image, "--question", "what?", "--batch-size", "-1"], "--batch-size must be >= 1"),
        (["--image", image, "--question", "what?", "--detector-threads", "-1"], "--detector-threads must be >= 1"),
        (["--image", image, "--question", "what?", "--top-k", "0"], "--top-k must be >= 1"),
        (["--image", image, "--question", "what?", "--data", "foo=bar"], "--data foo: "),
    ]
    for args, words in cases:
        proc = _predict(shapes, *args)
        text = " ".join(proc.stderr.split())
        assert proc.returncode == 2 and words in text and "Traceback" not in proc.stderr, (args, proc.stderr[-1500:])
        assert text.count("error:") == 1, proc.stderr
    assert {p: p.read_bytes() for p in before} == before and stat_is_fifo(fifo)
    assert not list(Path(run["vocab"]).parent.glob(".*.vlprep.lock"))  # no lock taken beside an input


def stat_is_fifo(path) -> bool:
    import stat

    return stat.S_ISFIFO(path.stat().st_mode)


def test_two_predicts_writing_one_file_turn_the_second_away(shapes, tmp_path):
    from pipeline.io import output_lock

    image = image_file(shapes / "world", "cc3m-val-00000000")
    out = tmp_path / "answers.jsonl"
    with output_lock(out, "predictions"):  # the first run, still writing
        proc = _predict(shapes, "--image", image, "--question", "what?", "--out", out)
    assert proc.returncode == 75 and "another process" in proc.stderr and not out.exists()


def test_one_hostile_query_line_costs_only_its_query(shapes, tmp_path):
    """Each of these is its line's named error and the good lines are answered: a pipe as the
    image (never opened: no hang), an image of 1000 x 3 pixels (no pixel of feature map), an
    undecodable image (named), a 300-character file name, a lone surrogate, a Latin-1 byte, JSON
    nested 100,000 deep, a line over the bound, a question and an expression at once, a
    question that is a number, ftp:// and file:// URLs. A BOM before the first line is skipped."""
    import os

    from PIL import Image

    good = image_file(shapes / "world", "cc3m-val-00000000")
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    Image.new("RGB", (1000, 3), (200, 10, 10)).save(tmp_path / "strip.png")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff" + b"not a jpeg" * 10)
    q = "what color is the cube?"
    lines = [
        json.dumps({"id": "good", "image": good, "question": q}),
        json.dumps({"id": "pipe", "image": str(fifo), "question": q}),
        json.dumps({"id": "strip", "image": str(tmp_path / "strip.png"), "question": q}),
        json.dumps({"id": "pair", "images": [good, str(tmp_path / "broken.jpg")], "statement": "two balls"}),
        json.dumps({"id": "long name", "image": str(tmp_path / ("x" * 300 + ".jpg")), "question": q}),
        '{"id": "surrogate", "image": "' + good + '", "question": "what \\ud800?"}',
        json.dumps({"id": "both", "image": good, "question": q, "expression": "the ball"}),
        json.dumps({"id": "number", "image": good, "question": 5}),
        json.dumps({"id": "ftp", "image": "ftp://example.com/a.jpg", "question": q}),
        json.dumps({"id": "file", "image": "file:///etc/passwd", "question": q}),
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"id": "huge", "image": good, "question": "x" * (1 << 21)}),
        json.dumps({"id": "good too", "image": good, "question": q}),
    ]
    data = b"\xef\xbb\xbf" + "\n".join(lines).encode("utf-8", "surrogatepass") + b"\n"
    data += b'{"id": "latin1", "question": "caf\xe9"}\n'
    queries = tmp_path / "q.jsonl"
    queries.write_bytes(data)
    proc = _predict(shapes, "--queries", queries, "--out", tmp_path / "out.jsonl", timeout=240)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    results = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    by_id = {r.get("id"): r for r in results}
    assert "answer" in by_id["good"] and "answer" in by_id["good too"]
    assert by_id["pipe"]["error"] == "file error" and "not a regular file" in by_id["pipe"]["detail"]
    assert by_id["strip"]["error"] == "extract error" and "strip.png" in by_id["strip"]["detail"]
    assert by_id["pair"]["error"] == "decode error" and "broken.jpg" in by_id["pair"]["detail"]
    assert by_id["long name"]["error"] in ("file error", "file not found")
    assert by_id["surrogate"]["error"] == "bad text"
    assert by_id["both"]["error"] == "bad query" and "ask one thing" in by_id["both"]["detail"]
    assert by_id["number"]["error"] == "bad query" and "must be a text, not int" in by_id["number"]["detail"]
    assert by_id["ftp"]["error"] == by_id["file"]["error"] == "unsupported scheme"
    assert by_id["line 11"]["error"] == "bad query" and "nested too deep" in by_id["line 11"]["detail"]
    assert by_id["line 12"]["error"] == "bad query" and "longer than" in by_id["line 12"]["detail"]
    assert by_id["line 14"]["error"] == "bad query" and "not UTF-8" in by_id["line 14"]["detail"]
    assert len(results) == 14


def test_a_long_text_is_cut_before_it_is_tokenized(shapes, predictor):
    """A 10 MB question costs what its first words cost (it was tokenized whole: 27 s and 1.5 GB)."""
    import time

    good = image_file(shapes / "world", "cc3m-val-00000000")
    predictor.answer(good, "what color is the cube?")  # the image extracted, the model warm
    started = time.perf_counter()
    long_one = predictor.answer(good, "what color is the cube? " * 400_000)
    assert time.perf_counter() - started < 5
    assert long_one == predictor.answer(good, "what color is the cube? " * 40)


def test_each_query_keeps_its_own_top_k(shapes, predictor):
    """A ranking in a batch no longer shrinks every question's answers to 1; a query's own
    ``top_k`` wins; below 1 is refused (Python slicing would cut from the end)."""
    world = shapes / "world"
    good = image_file(world, "cc3m-val-00000000")
    results = predictor.ask(
        [
            {"image": good, "question": "what color is the cube?"},
            {"caption": "a red ball", "images": [str(world / "images")]},
            {"image": good, "question": "what color is the cube?", "top_k": 2},
            {"caption": "a red ball", "images": [str(world / "images")], "top_k": 3},
            {"image": good, "question": "what?", "top_k": 0},
        ]
    )
    assert len(results[0]["top_k"]) == 5 and len(results[1]["ranking"]) == 16
    assert len(results[2]["top_k"]) == 2 and len(results[3]["ranking"]) == 3
    assert results[4]["error"] == "bad query" and "top_k must be an integer >= 1" in results[4]["detail"]


def test_vcr_answer_is_checked_and_honoured(shapes, predictor):
    good = image_file(shapes / "world", "cc3m-val-00000000")
    base = {"image": good, "question": "what is red?", "choices": ["a", "b", "c", "d"], "rationales": list("wxyz")}
    results = predictor.ask([{**base, "answer": a} for a in (7, -1, True, 2)], 5)
    assert [r.get("error") for r in results[:3]] == ["bad query"] * 3
    chosen = results[3]
    assert chosen["rationale"] == int(np.argmax(chosen["rationale_probabilities"][2]))


def test_an_image_replaced_at_its_path_is_a_new_picture(shapes, predictor, tmp_path):
    world = shapes / "world"
    path = tmp_path / "photo.jpg"
    path.write_bytes(Path(image_file(world, "cc3m-val-00000000")).read_bytes())
    first = predictor.answer(str(path), "what color is the cube?")
    before = predictor.image(str(path))[1].features.copy()
    path.write_bytes(Path(image_file(world, "cc3m-val-00000001")).read_bytes())  # a new snapshot, same path
    predictor.answer(str(path), "what color is the cube?")
    after = predictor.image(str(path))[1].features
    assert not np.array_equal(before, after)
    path.write_bytes(Path(image_file(world, "cc3m-val-00000000")).read_bytes())
    assert predictor.answer(str(path), "what color is the cube?") == first


def test_a_checkpoint_link_to_nothing_does_not_exist(shapes, tmp_path):
    image = image_file(shapes / "world", "cc3m-val-00000000")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for link in ("dangling", "loop"):
        proc = run_vltrain("predict", "--checkpoint", tmp_path / link, "--image", image, "--question", "what?")
        assert proc.returncode == 2 and "does not exist (a symbolic link to nothing" in " ".join(proc.stderr.split())


def test_show_writes_a_png(shapes, tmp_path):
    image = image_file(shapes / "world", "cc3m-val-00000000")
    proc = _predict(shapes, "--image", image, "--expression", "the red ball", "--show", tmp_path / "box.PNG")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "box.PNG").read_bytes()[:4] == b"\x89PNG"


def test_a_text_that_is_no_utf8_on_the_command_line_is_named(shapes):
    """A Latin-1 byte in argv reaches Python as a lone surrogate (surrogateescape): one error line."""
    image = image_file(shapes / "world", "cc3m-val-00000000")
    proc = run_vltrain(
        "predict", "--checkpoint", shapes / "finetuned", "--image", image, "--question", "caf\udce9?", fresh=True
    )
    assert proc.returncode == 2 and "bad text" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
