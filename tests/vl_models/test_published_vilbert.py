"""Published ViLBERT fine-tuned checkpoints (`vl_models.transfer.published`): random weights in
vilbert-multi-task's `VILBertForVLTasks` layout give through our loader and model the logits
the reference code gives (tests/reference/vilbert_mt.py: with and without task tokens, every
head a task reads), and vilbert_beta's layout likewise (tests/reference/vilbert_beta.py);
loading is strict and names the keys; `vltrain evaluate` scores one and `vltrain finetune
--init` starts from one."""

import importlib.util
import json

import pytest
import torch
from helpers import REPO, run_vltrain
from task_files import DIM, write_task_world
from train_helpers import VOCAB

from pipeline.errors import ConfigError
from pipeline.task_data import TaskData
from vl_models import families, transfer
from vl_models.config import DataSettings, FinetuneConfig
from vl_models.train import checkpoint
from vl_models.transfer.build import build_task
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import predict
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.published import VILBERT_BETA, VILBERT_MT, read_published


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
    with pytest.raises(ConfigError, match=r"task head vil_prediction .*\n.*missing: logit_fc\.3\.bias"):
        read_published(
            _saved(tmp_path, shapes, drop=("vil_prediction.logit_fc.3.bias",)), "vilbert-tiny"
        ).transfer_model(vqa, 3129)
    with pytest.raises(ConfigError, match="its answer head has 3129 rows, the task dataset's answer table 7"):
        read_published(_saved(tmp_path, shapes), "vilbert-tiny").transfer_model(vqa, 7)
    with pytest.raises(ConfigError, match="vcr: no vilbert-multi-task task id"):
        read_published(_saved(tmp_path, shapes), "vilbert-tiny").transfer_model(transfer.get("vcr"), 0)
    note = read_published(_saved(tmp_path, shapes), "vilbert-tiny").note(vqa)
    assert "its vil_prediction head" in note and "linguisic_logit" in note and "q_dense" in note


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("published-vilbert")
    files = write_task_world(root)
    for name in ("nlvr2", "flickr30k"):
        build_task(transfer.get(name), files[name], root / name, image_map=files["image_map"])
    config = {**families.load_config("vilbert-tiny").to_json(), "model_type": "vilbert", "v_feature_size": DIM}
    (root / "tiny.json").write_text(json.dumps({**config, "name": "vilbert-tiny-16"}))
    return root


def _world_checkpoint(world, tmp_path) -> str:
    """A multi_task_model.bin of the world's width: the fixture's keys, 16-d region features."""
    shapes = dict(FIXTURE["task_tokens"]["shapes"])
    shapes["bert.v_embeddings.image_embeddings.weight"] = [shapes["bert.v_embeddings.image_embeddings.weight"][0], DIM]
    return _saved(tmp_path, shapes)


def test_vltrain_evaluate_scores_a_multi_task_checkpoint(world, tmp_path):
    source = _world_checkpoint(world, tmp_path)
    out = tmp_path / "eval"
    args = ["--task", "nlvr2", "--checkpoint", source, "--data", world / "nlvr2", "--split", "dev"]
    proc = run_vltrain("evaluate", *args, "--shards", world / "feats", "--model", world / "tiny.json", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vilbert-multi-task VILBertForVLTasks" in proc.stderr and "vil_binary_prediction head" in proc.stderr
    assert "accuracy" in json.loads((out / "metrics.json").read_text())["metrics"]


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
