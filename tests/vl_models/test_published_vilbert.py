"""Published ViLBERT fine-tuned checkpoints (`vl_models.transfer.published`): random weights in
vilbert-multi-task's `VILBertForVLTasks` layout give through our loader and model the logits
the reference code gives (tests/reference/vilbert_mt.py: with and without task tokens, every
head a task reads), and vilbert_beta's layout likewise (tests/reference/vilbert_beta.py);
loading is strict and names the keys; `vltrain evaluate` scores one and `vltrain finetune
--init` starts from one. On the reference's own data path (its feature reader, datasets and
evaluation forward: the fixture's ``data`` case) a 12-in-1 checkpoint is scored at its
``vilbert_tasks.yml`` settings (100 regions and the IMG token, VQA 23 tokens, RefCOCO+ 20,
NLVR2 40) with its logits and choices, NLVR2 with its packing (``--nlvr2-packing mt``)."""

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, run_vltrain
from task_files import DIM
from train_helpers import VOCAB

from pipeline.errors import ConfigError
from pipeline.records import RegionFeatures
from pipeline.store import write_records
from pipeline.task_data import TaskData
from vl_models import families, transfer
from vl_models.config import DataSettings, EvaluateConfig, FinetuneConfig
from vl_models.train import checkpoint
from vl_models.train.recipes import recipe_settings
from vl_models.transfer.build import build_task
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import evaluate_checkpoint, predict
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.nlvr2 import mt_packed
from vl_models.transfer.published import (
    AIRSPLAY,
    HF_QA,
    REFERENCE_OF,
    VILBERT_BETA,
    VILBERT_MT,
    Published,
    read_published,
)
from vl_models.transfer.task import column


def _module(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mt = _module("vilbert_mt", REPO / "tests" / "reference" / "vilbert_mt.py")  # the fixtures' makers
beta = _module("vilbert_beta", REPO / "tests" / "reference" / "vilbert_beta.py")
FIXTURE = json.loads(mt.FIXTURE.read_text())
BETA = json.loads(beta.FIXTURE.read_text())
CANDIDATES = {"answers": 1, "regions": 1, "pair": 2, "choice": 4, "retrieval": 4}
ANSWERS = {"vqa": 3129, "gqa": 1533}  # fixed in vilbert-multi-task's VILBertForVLTasks


def _saved(tmp_path, shapes: dict, name: str = "multi_task_model.bin", drop=(), extra=None):
    state = {k: mt.fill(k, shape) for k, shape in shapes.items() if k not in drop}
    torch.save({**state, **(extra or {})}, tmp_path / name)
    return str(tmp_path / name)


def _batch(task, x: dict) -> dict:
    """The fixture's inputs as our task batches: (B / C, C, ...) tensors for a C-candidate task."""
    c = CANDIDATES[task.head]

    def shaped(t):
        return t.reshape(-1, c, *t.shape[1:])

    return {
        "input_ids": shaped(x["ids"]),
        "attention_mask": shaped(x["mask"]),
        "token_type_ids": shaped(x["types"]),
        "visual_feats": shaped(x["feats"]),
        "visual_pos": shaped(x["boxes"]),
        "visual_mask": shaped(x["image_mask"]),
        "region_valid": x["image_mask"],
    }


def _close(ours: torch.Tensor, theirs: list, stride: int, valid=None) -> None:
    theirs = torch.tensor(theirs)
    ours = ours.reshape(theirs.shape[0], -1)[:, ::stride] if stride > 1 else ours.reshape(theirs.shape)
    assert ours.shape == theirs.shape
    if valid is None:
        assert (ours - theirs).abs().max() <= 1e-4
    else:  # padded regions: -10000 added (the float32 spacing there is ~1e-3)
        valid = valid.bool()
        assert (ours[valid] - theirs[valid]).abs().max() <= 1e-4
        assert (ours[~valid] - theirs[~valid]).abs().max() <= 5e-3 and (ours[~valid] < -9000).all()


def _case_tasks(case: str) -> list[str]:
    names = [t for t in mt.HEAD_OF if t in transfer.names()]
    return names if case == "task_tokens" else [*names, "vcr"]


@pytest.mark.parametrize("case", ["task_tokens", "plain"])
def test_vilbert_multi_task_checkpoints_give_the_reference_codes_logits(case, tmp_path):
    """Every head a task reads, with the task's 12-in-1 token (a model trained with
    --task_specific_tokens) or without (a model without the table), equals the reference."""
    fixture = FIXTURE[case]
    published = read_published(_saved(tmp_path, fixture["shapes"]), "vilbert-tiny")
    assert published.layout == VILBERT_MT
    assert published.mcfg.task_tokens == (20 if case == "task_tokens" else 0)
    x = mt.inputs()
    checked = 0
    for name in _case_tasks(case):
        task = transfer.get(name)
        model = published.transfer_model(task, ANSWERS.get(name, 0)).eval()
        key = name if case == "task_tokens" else mt.HEAD_OF.get(name, "vil_logit")
        with torch.no_grad():
            ours = model(name, _batch(task, x))
        stride = FIXTURE["answer_stride"] if task.head == "answers" else 1
        _close(ours, fixture[key], stride, x["image_mask"] if task.head == "regions" else None)
        checked += 1
    assert checked >= 5


def test_vilbert_beta_checkpoints_give_the_reference_codes_logits(tmp_path):
    """The ViLBERT paper's own fine-tuned models' layout: the weight-normed answer classifier
    (VQA), vil_logit (VCR, Flickr30k) and vision_logit (RefCOCO+), each equal to the reference."""
    published = read_published(_saved(tmp_path, BETA["shapes"], "pytorch_model9.bin"), "vilbert-tiny")
    assert published.layout == VILBERT_BETA and published.mcfg.task_tokens == 0
    x = mt.inputs()
    for name, key in (
        ("vqa", "vil_prediction"),
        ("vcr", "vil_logit"),
        ("flickr30k", "vil_logit"),
        ("refcoco+", "vision_logit"),
    ):
        task = transfer.get(name)
        model = published.transfer_model(task, BETA["answers"] if task.head == "answers" else 0).eval()
        with torch.no_grad():
            ours = model(name, _batch(task, x))
        _close(ours, BETA[key], 1, x["image_mask"] if task.head == "regions" else None)
    with pytest.raises(ConfigError, match="has no head for nlvr2"):
        published.transfer_model(transfer.get("nlvr2"), 0)


def test_the_task_token_follows_cls_and_leaves_pooling_on_cls():
    """The token id reaches the embeddings (different tokens, different logits) and a model
    with a table but no task id is the model without the table."""
    mcfg = families.load_config("vilbert-tiny")
    from dataclasses import replace

    from vl_models.models.modeling_vilbert import ViLBERTModel

    torch.manual_seed(0)
    with_table = ViLBERTModel(replace(mcfg, task_tokens=20)).eval()
    without = ViLBERTModel(mcfg).eval()
    without.load_state_dict({k: v for k, v in with_table.state_dict().items() if "task_embeddings" not in k})
    x = mt.inputs()
    args = (x["ids"], x["feats"], x["boxes"], x["mask"], x["image_mask"], x["types"])
    with torch.no_grad():
        plain, same = without(*args), with_table(*args)
        one, two = (
            with_table(*args, task_ids=torch.ones(4, dtype=torch.long)),
            with_table(*args, task_ids=torch.full((4,), 2)),
        )
    assert torch.equal(plain.pooled_output, same.pooled_output)
    assert one.text_output.shape[1] == x["ids"].shape[1] + 1
    assert (one.pooled_output - two.pooled_output).abs().max() > 1e-3


def test_loading_is_strict_and_names_the_keys(tmp_path):
    shapes = FIXTURE["task_tokens"]["shapes"]
    vqa = transfer.get("vqa")
    with pytest.raises(ConfigError, match="holds no model config: name it with --model"):
        read_published(_saved(tmp_path, shapes))
    with pytest.raises(ConfigError, match="is a vilbert model, not a lxmert one"):
        read_published(_saved(tmp_path, shapes), "lxmert-tiny")
    with pytest.raises(ConfigError, match="neither its model nor its task heads: extra_head.weight"):
        read_published(_saved(tmp_path, shapes, extra={"extra_head.weight": torch.zeros(2)}), "vilbert-tiny")
    key = "bert.encoder.c_layer.0.biattention.query1.weight"
    with pytest.raises(ConfigError, match=r"missing: bert\.encoder\.c_layer\.0\.biattention\.query1\.weight"):
        read_published(_saved(tmp_path, shapes, drop=(key,)), "vilbert-tiny").transfer_model(vqa, 3129)
    with pytest.raises(ConfigError, match=r"task head vil_prediction .*: missing: logit_fc\.3\.bias"):
        read_published(
            _saved(tmp_path, shapes, drop=("vil_prediction.logit_fc.3.bias",)), "vilbert-tiny"
        ).transfer_model(vqa, 3129)
    with pytest.raises(ConfigError, match="its answer head has 3129 rows, the task dataset's answer table 7"):
        read_published(_saved(tmp_path, shapes), "vilbert-tiny").transfer_model(vqa, 7)
    with pytest.raises(ConfigError, match="vcr: no vilbert-multi-task task id"):
        read_published(_saved(tmp_path, shapes), "vilbert-tiny").transfer_model(transfer.get("vcr"), 0)
    note = read_published(_saved(tmp_path, shapes), "vilbert-tiny").note(vqa)
    assert "its vil_prediction head" in note and "linguisic_logit" in note and "q_dense" in note


def _world_checkpoint(world, tmp_path) -> str:
    """A multi_task_model.bin of the world's width: the fixture's keys, 16-d region features."""
    shapes = dict(FIXTURE["task_tokens"]["shapes"])
    shapes["bert.v_embeddings.image_embeddings.weight"] = [shapes["bert.v_embeddings.image_embeddings.weight"][0], DIM]
    return _saved(tmp_path, shapes)


def test_vltrain_evaluate_scores_a_multi_task_checkpoint(world, tmp_path):
    """At 12-in-1's NLVR2 settings (40 tokens, 100 regions and the IMG token), or those given
    (--max-text, --max-regions, --nlvr2-packing), said in the log and in metrics.json."""
    source = _world_checkpoint(world, tmp_path)
    args = ["--task", "nlvr2", "--checkpoint", source, "--data", world / "nlvr2", "--split", "dev"]
    args += ["--stores", world / "feats", "--model", world / "tiny.json"]
    proc = run_vltrain("evaluate", *args, "--out", tmp_path / "eval")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vilbert-multi-task VILBertForVLTasks" in proc.stderr and "vil_binary_prediction head" in proc.stderr
    assert "with 40 text tokens and 100 region slots per image" in " ".join(proc.stderr.split())
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert "accuracy" in report["metrics"]
    assert report["settings"] == {
        "max_text": 40,
        "max_regions": 100,
        "img_token": "all",
        "nlvr2_packing": "per-image",
        "from": f"{VILBERT_MT}: {REFERENCE_OF[VILBERT_MT]}",
    }
    given = ["--max-text", "12", "--max-regions", "5", "--nlvr2-packing", "mt"]
    proc = run_vltrain("evaluate", *args, *given, "--out", tmp_path / "given")
    assert proc.returncode == 0, proc.stderr[-3000:]
    settings = json.loads((tmp_path / "given" / "metrics.json").read_text())["settings"]
    assert (settings["max_text"], settings["max_regions"], settings["nlvr2_packing"]) == (12, 5, "mt")
    assert settings["from"].endswith("--max-regions 5, --max-text 12")
    proc = run_vltrain("evaluate", *args, "--max-text", "200", "--out", tmp_path / "long")
    assert proc.returncode != 0 and "--max-text 200: vilbert-tiny-16 has 64 text positions" in proc.stderr


def test_finetune_starts_from_a_multi_task_checkpoint(world, tmp_path):
    """--init a multi_task_model.bin: the whole ViLBERT model (task tokens included) and NLVR2's head."""
    source = _world_checkpoint(world, tmp_path)
    cfg = FinetuneConfig.of(
        tasks=("nlvr2",),
        task_data=(str(world / "nlvr2"),),
        stores=(str(world / "feats"),),
        out=str(tmp_path / "ft"),
        init=source,
        model=str(world / "tiny.json"),
        vocab=str(VOCAB),
        epochs=None,
        steps=1,
        batch_size=2,
        lr=0.0,
        warmup=0,
        log_every=1,
        checkpoint_every=1,
    )
    run_finetune(cfg)
    tuned = checkpoint.load(tmp_path / "ft" / "checkpoints" / "step_0000001.pt")["model"]
    state = torch.load(source, weights_only=True)
    for ours, theirs in (
        ("backbone.bert.embeddings.task_embeddings.weight", "bert.embeddings.task_embeddings.weight"),
        ("backbone.bert.encoder.c_layer.1.biOutput.dense2.bias", "bert.encoder.c_layer.1.biOutput.dense2.bias"),
        ("backbone.cls.bi_seq_relationship.weight", "cls.bi_seq_relationship.weight"),
        ("heads.nlvr2.logit_fc.3.weight", "vil_binary_prediction.logit_fc.3.weight"),
    ):
        assert torch.equal(tuned[ours], state[theirs]), ours


def test_retrieval_scores_a_multi_task_checkpoint_with_its_vil_logit(world, tmp_path):
    """Scoring every caption x image pair (`score_pairs`: cached single-stream states) gives
    the checkpoint's fine-tuned vil_logit of each pair with Flickr30k's task token, not the
    pretraining alignment head's logit."""
    task = transfer.get("flickr30k")
    published = read_published(_world_checkpoint(world, tmp_path), str(world / "tiny.json"))
    model = published.transfer_model(task, 0).eval()
    assert model.task_tokens == {"flickr30k": 8}
    data = TaskData.open(world / "flickr30k")
    view = TaskDataset(data, task, [world / "feats"], VOCAB, published.family, DataSettings(), "test", train=False)
    predictions = predict(model, view, limit=3)
    scores, images = predictions.values["scores"], predictions.values["images"]
    assert predictions.rows[0] == view.rows[0] and scores.shape == (len(predictions.rows), 3)
    caption = view.text(view.value("text", 0))  # the first caption scored: the first image's first
    pairs = torch.utils.data.default_collate([view.candidates([(caption, view.image(key))]) for key in images])
    with torch.no_grad():
        enc = published.family.encode(model.backbone, pairs, 8)
        direct = model.heads["flickr30k"].score(enc.pooled)
        alignment = published.family.encode(model.backbone, pairs, 8).pair
    assert torch.allclose(torch.as_tensor(scores[0]), direct, atol=1e-5)
    assert not torch.allclose(direct, alignment, atol=1e-3)


# --- the reference's own data path (tests/reference/vilbert_mt.py, its ``data`` case): its feature
# reader, datasets and evaluation forward at vilbert_tasks.yml's settings, on images of 14 to 120
# regions and texts of up to 45 word pieces ---------------------------------------------------------

DATA = FIXTURE["data"]
NLVR2_FULL = 2  # mt.NLVR2's pair of two 100-region images: MT's packing is then one image per row


def _mt_world(root):
    """The reference's images in a feature store and its examples as official task files, built
    into task datasets (VQA test-dev with a 3,129-answer table, RefCOCO+ val, NLVR2 dev)."""
    records = []
    for name in mt.REGION_IMAGES:
        image = mt.image(name)
        records.append(RegionFeatures(image_id=name, **image))
    write_records(root / "feats", records, feature_dim=2048)
    files = root / "files"
    (files / "refcoco+").mkdir(parents=True)
    lines = [
        f"COCO_test2015_{mt.number(n):012d}\t{n}\nCOCO_train2014_{mt.number(n):012d}\t{n}\n" for n in mt.REGION_IMAGES
    ]
    lines += [f"dev-{q}-0-img{side}\t{pair[side]}\n" for q, (pair, _, _) in enumerate(mt.NLVR2) for side in (0, 1)]
    (files / "image_map.tsv").write_text("".join(lines))
    questions = [
        {"image_id": mt.number(name), "question": mt.sentence(n, seed), "question_id": q}
        for q, (name, n, seed) in enumerate(mt.VQA)
    ]
    vqa_file = files / "v2_OpenEnded_mscoco_test-dev2015_questions.json"
    vqa_file.write_text(json.dumps({"questions": questions}))
    (files / "answers.json").write_text(json.dumps([f"answer{i}" for i in range(ANSWERS["vqa"])]))
    refs, anns = [], []
    for q, (name, n, seed) in enumerate(mt.REFCOCO):
        sent = {"raw": mt.sentence(n, seed), "sent": mt.sentence(n, seed), "tokens": [], "sent_id": q}
        refs.append(
            {"ref_id": q, "ann_id": q + 1, "image_id": mt.number(name), "split": "val", "category_id": 1}
            | {"file_name": f"r{q}.jpg", "sent_ids": [q], "sentences": [sent]}
        )
        anns.append({"id": q + 1, "image_id": mt.number(name), "bbox": mt.BOX, "category_id": 1, "iscrowd": 0})
    images = [
        {"id": mt.number(n), "file_name": f"COCO_train2014_{mt.number(n):012d}.jpg"}
        | {"width": mt.image(n)["image_w"], "height": mt.image(n)["image_h"]}
        for n in mt.REGION_IMAGES
    ]
    (files / "refcoco+" / "refs(unc).p").write_bytes(pickle.dumps(refs, protocol=2))
    instances = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "thing"}]}
    (files / "refcoco+" / "instances.json").write_text(json.dumps(instances))
    nlvr2 = [
        {"identifier": f"dev-{q}-0-0", "sentence": mt.sentence(n, seed), "label": str(bool(q % 2))}
        | {"left_url": f"http://x/{pair[0]}.jpg", "right_url": f"http://x/{pair[1]}.jpg"}
        for q, (pair, n, seed) in enumerate(mt.NLVR2)
    ]
    (files / "dev.json").write_text("".join(json.dumps(row) + "\n" for row in nlvr2))
    image_map = files / "image_map.tsv"
    build_task(transfer.get("vqa"), [vqa_file], root / "vqa", image_map=image_map, answers_from=files / "answers.json")
    refcoco = [files / "refcoco+" / "refs(unc).p", files / "refcoco+" / "instances.json"]
    build_task(transfer.get("refcoco+"), refcoco, root / "refcoco+", image_map=image_map)
    build_task(transfer.get("nlvr2"), [files / "dev.json"], root / "nlvr2", image_map=image_map)


@pytest.fixture(scope="module")
def mt_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("mt-data")
    _mt_world(root)
    return root


SPLITS = {"vqa": "test-dev", "refcoco+": "val", "nlvr2": "dev"}


def _mt_logits(published, root, name: str, **options):
    """Our logits of task `name`'s examples (in the reference's order) and the view, with the
    checkpoint's resolved settings (`Published.data_settings`, its IMG token's feature)."""
    task = transfer.get(name)
    data = TaskData.open(root / name)
    settings = published.data_settings(task, options.pop("max_regions", None), options.pop("max_text", None))
    model = published.transfer_model(task, len(data.answers)).eval()
    view = TaskDataset(
        data,
        task,
        [root / "feats"],
        VOCAB,
        published.family,
        settings,
        SPLITS[name],
        train=False,
        img_feature=options.pop("img_feature", published.img_feature),
        **options,
    )
    keep = {"logits": lambda logits, batch: {"logits": logits.float().cpu().numpy()}}
    predictions = predict(model, view, readout=keep["logits"])
    order = [int(str(u).split("-")[1 if name == "nlvr2" else 0]) for u in column(data, "uid", predictions.rows)]
    logits = np.zeros_like(predictions.values["logits"])
    logits[order] = predictions.values["logits"]
    return torch.as_tensor(logits), view


def _region_valid(name: str) -> torch.Tensor:
    """The reference's RefCOCO+ slots that hold the IMG token or a region (101 in all)."""
    slots = DATA["refcoco+"]["region_slots"]
    return torch.stack([torch.arange(slots) < min(mt.REGION_IMAGES[image] + 1, slots) for image, _, _ in mt.REFCOCO])


def test_published_multi_task_settings_are_vilbert_tasks_yml(tmp_path):
    """12-in-1's checkpoints are scored at its yml's text lengths and region slots (from the
    recipes, which say them with citations: the fixture holds what the reference's own yml
    gave its datasets), the IMG token the mean of every region; LXMERT's at 36 / 20; the
    recipes of one code agree wherever two of them set a task's value."""
    published = read_published(_saved(tmp_path, FIXTURE["task_tokens"]["shapes"]), "vilbert-tiny")
    for name, case in DATA.items():
        settings = published.data_settings(transfer.get(name))
        assert (settings.max_text, settings.max_regions + 1) == (case["max_text"], case["region_slots"])
    assert published.img_feature == "all"
    expected = {"vqa": 23, "gqa": 26, "nlvr2": 40, "refcoco": 20, "refcocog": 20, "flickr30k": 30}
    expected.update({"coco-retrieval": 30, "vcr-q2a": 60, "vcr-qa2r": 80, "vcr": None})
    for name, length in expected.items():
        assert published.data_settings(transfer.get(name)) == DataSettings(max_text=length, max_regions=100), name
    assert published.data_settings(transfer.get("vqa"), 36, 30) == DataSettings(max_text=30, max_regions=36)
    for layout in (AIRSPLAY, HF_QA):
        lxmert = Published(tmp_path, layout, None, {})
        for name in ("vqa", "gqa", "nlvr2"):
            assert lxmert.data_settings(transfer.get(name)) == DataSettings(max_text=20, max_regions=36)
        assert lxmert.img_feature == "kept"
    beta = Published(tmp_path, VILBERT_BETA, None, {})
    assert beta.data_settings(transfer.get("vqa")) == DataSettings(max_text=16, max_regions=99)
    for name in transfer.names():  # one owner: a task's single-task recipe and 12-in-1's agree
        single, joint = recipe_settings(f"vilbert-{name}", name), recipe_settings("vilbert-12in1", name)
        assert all(single[k] == joint[k] for k in set(single) & set(joint)), name
        lx = recipe_settings(f"lxmert-{name}", name)
        assert lx in ({}, {"max_text": 20, "max_regions": 36}), name


@pytest.mark.parametrize("name", ["vqa", "refcoco+", "nlvr2"])
def test_multi_task_checkpoint_on_the_references_data_gives_its_logits(name, mt_world, tmp_path):
    """Images of 60, 100 and 120 regions and texts longer than the task's length, through our
    store, task dataset and model at the resolved settings (NLVR2: MT's packing), give the
    logits and choices of the reference's reader, dataset and evaluation forward."""
    published = read_published(_saved(tmp_path, FIXTURE["task_tokens"]["shapes"]), "vilbert-tiny")
    options = {"packing": "mt"} if name == "nlvr2" else {}
    ours, _ = _mt_logits(published, mt_world, name, **options)
    case = DATA[name]
    stride = FIXTURE["answer_stride"] if name == "vqa" else 1
    _close(ours, case["logits"], stride, _region_valid(name) if name == "refcoco+" else None)
    assert ours.argmax(-1).tolist() == case["choice"]
    if name == "refcoco+":
        assert max(case["choice"]) > 36  # the reference picked a region beyond 36 slots


def test_nlvr2_packing_per_image_is_the_reference_where_each_image_fills_its_row(mt_world, tmp_path):
    """Our default (each image its own row) equals MT's packing for two images of 100 regions
    (its own extraction's count) and differs from it where the first image has fewer."""
    published = read_published(_saved(tmp_path, FIXTURE["task_tokens"]["shapes"]), "vilbert-tiny")
    ours, view = _mt_logits(published, mt_world, "nlvr2")
    theirs = torch.tensor(DATA["nlvr2"]["logits"])
    assert (ours[NLVR2_FULL] - theirs[NLVR2_FULL]).abs().max() <= 1e-4
    others = [q for q in range(len(mt.NLVR2)) if q != NLVR2_FULL]
    assert ((ours[others] - theirs[others]).abs().amax(-1) > 1e-3).all()
    short = mt_packed(view, ("img_f", "img_g"))  # 15 + 26 slots: both in the first row
    assert short["visual_mask"][0].sum() == 41 and short["visual_mask"][1].all()  # an empty row attends to all
    assert np.array_equal(short["visual_pos"][0, 15], [0, 0, 1, 1, 1]) and not short["visual_feats"][1].any()
    spill = mt_packed(view, ("img_c", "img_f"))  # 121 + 15: the first image's last 20 regions open row 2
    assert spill["visual_mask"][0].all() and spill["visual_mask"][1].sum() == 35
    assert np.array_equal(spill["visual_pos"][1, 20], [0, 0, 1, 1, 1])


def test_vltrain_evaluate_gives_the_references_answers_and_boxes(mt_world, tmp_path):
    """`vltrain evaluate` on a 12-in-1 checkpoint: the reference's answers and boxes, its
    settings recorded in metrics.json; --max-regions 36
    --max-text 36 (what was used before) cannot give the box the reference chose beyond slot 36."""
    source = _saved(tmp_path, FIXTURE["task_tokens"]["shapes"])
    answers = json.loads((mt_world / "files" / "answers.json").read_text())

    def run(name, **options):
        out = tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}"
        stores = [str(mt_world / "feats")]
        result = evaluate_checkpoint(
            EvaluateConfig(
                name, source, mt_world / name, SPLITS[name], stores, out=out, model="vilbert-tiny", **options
            )
        )
        return result, json.loads((out / "metrics.json").read_text())["settings"]

    result, settings = run("vqa")
    assert settings == {"max_text": 23, "max_regions": 100, "img_token": "all"} | {"from": settings["from"]}
    assert "vilbert-multi-task" in settings["from"]
    given = {r["question_id"]: answers.index(r["answer"]) for r in json.loads(Path(result["files"][0]).read_text())}
    assert [given[q] for q in range(len(mt.VQA))] == DATA["vqa"]["choice"]

    def chosen(result) -> dict:
        return {r["ref_sent"]: r["box"] for r in json.loads(Path(result["files"][0]).read_text())}

    result, settings = run("refcoco+")
    for q, ((image, _, _), slot) in enumerate(zip(mt.REFCOCO, DATA["refcoco+"]["choice"])):
        record = mt.image(image)
        expected = [0, 0, record["image_w"], record["image_h"]] if slot == 0 else record["boxes"][slot - 1]
        assert np.allclose(chosen(result)[f"{q}-{q}"], expected), q
    result, settings = run("refcoco+", max_regions=36, max_text=36)  # the settings used before
    assert (settings["max_regions"], settings["max_text"]) == (36, 36) and "--max-regions 36" in settings["from"]
    last = len(mt.REFCOCO) - 1  # the reference picked its region 50
    assert not np.allclose(chosen(result)[f"{last}-{last}"], mt.image(mt.REFCOCO[last][0])["boxes"][49])

    with pytest.raises(ConfigError, match="--nlvr2-packing: NLVR2's"):
        run("vqa", nlvr2_packing="mt")
