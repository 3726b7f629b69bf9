"""12-in-1's (vilbert-multi-task's) task tokens and heads in `vltrain finetune`: a new 20-row
task-token table on request (--task-tokens, the ViLBERT recipes), kept by resume, evaluate and
export; retrieval fine-tuned with a new ``vil_logit`` on the pooled pair at the head rate
(--retrieval-head); one ``vision_logit`` for the referring-expression tasks trained together
(and one ``vil_logit`` for the choice scorers), loaded so from a ``multi_task_model.bin``;
dropout before the region scorer in training only; --no-copy-answers."""

import importlib.util
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from helpers import REPO, run_vltrain
from task_files import DIM
from train_helpers import VOCAB, finetune_config

from pipeline.errors import ConfigError
from pipeline.store import FeatureStore
from pipeline.task_data import TaskData
from vl_models import families, transfer
from vl_models.config import DataSettings, EvaluateConfig, TransferSettings
from vl_models.export import export_run
from vl_models.models.weights import load_exported
from vl_models.train import checkpoint
from vl_models.train.optim import param_groups
from vl_models.train.recipes import FINETUNE_RECIPE_DIR, load_recipe
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import evaluate_checkpoint
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.heads import ChoiceHead, RegionHead, RetrievalHead, build_transfer_model, run_heads

TABLE = "bert.embeddings.task_embeddings.weight"


def _settings(world, out, tasks, **kw):
    base = dict(model="vilbert-tiny", steps=1, lr=0.0, warmup=0, checkpoint_every=1, eval_items=4)
    return finetune_config(world, out, tasks, **{**base, **kw})


def _pretrained_bin(world, path) -> dict:
    """A vilbert-multi-task ``pretrained_model.bin`` (bert.*, cls.*: no task-token table) of the world's width."""
    vilbert = families.get("vilbert")
    mcfg = vilbert.fit(families.load_config("vilbert-tiny"), FeatureStore.open(world / "feats").layout, 0, "feats")
    torch.manual_seed(2)
    state = vilbert.build(mcfg).state_dict()
    torch.save(state, path)
    return state


def _model(run) -> dict:
    return checkpoint.load(checkpoint.resolve(run))["model"]


# --- 5: task tokens -----------------------------------------------------------------------


def test_task_tokens_a_new_table_kept_by_resume_evaluate_and_export(world, tmp_path):
    """--task-tokens on a model without a table: 12-in-1's 20 rows, N(0, initializer_range) as its
    init_weights starts every embedding, the rest of the model from --init (a pretraining
    checkpoint, or a fine-tuning run's backbone); the run's model config records it, so a resume,
    `vltrain evaluate` and `vltrain export` rebuild it; the task's token (NLVR2: 12) is trained."""
    source = _pretrained_bin(world, tmp_path / "pretrained_model.bin")
    run_finetune(
        _settings(world, tmp_path / "a", ["nlvr2"], init=str(tmp_path / "pretrained_model.bin"), task_tokens=True)
    )
    tuned = _model(tmp_path / "a")
    assert all(torch.equal(tuned[f"backbone.{k}"], v) for k, v in source.items())
    table = tuned[f"backbone.{TABLE}"]
    std = families.load_config("vilbert-tiny").initializer_range
    assert table.shape == (20, 32) and abs(table.std().item() - std) < 0.15 * std and abs(table.mean()) < 0.02
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["model"]["task_tokens"] == 20 and saved["train"]["transfer"]["task_tokens"] is True

    # a fine-tuning run's backbone without a table (its heads stay behind), trained 2 steps with a stop and a resume
    run_finetune(_settings(world, tmp_path / "b0", ["vqa"], init=str(tmp_path / "pretrained_model.bin")))
    resumed = dict(init=str(tmp_path / "b0"), task_tokens=True, lr=1e-2, steps=2)
    run_finetune(_settings(world, tmp_path / "b", ["nlvr2"], stop_at=1, **resumed))
    first = _model(tmp_path / "b")[f"backbone.{TABLE}"]
    run_finetune(_settings(world, tmp_path / "b", ["nlvr2"], resume="yes", **resumed))
    last = _model(tmp_path / "b")[f"backbone.{TABLE}"]
    assert not torch.equal(first[12], last[12])  # NLVR2's token (vilbert_tasks.yml TASK12) is trained

    result = evaluate_checkpoint(
        EvaluateConfig("nlvr2", str(tmp_path / "b"), world / "nlvr2", "dev", out=tmp_path / "e", limit=4)
    )
    assert "accuracy" in result["metrics"]
    export_run(tmp_path / "b", tmp_path / "hf")
    assert torch.equal(load_exported(tmp_path / "hf").state_dict()[TABLE], last)
    text_stream = safetensors.torch.load_file(str(tmp_path / "hf" / "text_stream" / "model.safetensors"))
    assert not any(k.startswith("embeddings.task_embeddings.") for k in text_stream)  # BERT has no table


def test_task_tokens_keep_an_init_table_and_are_refused_for_lxmert(world, tmp_path):
    with pytest.raises(ConfigError, match="lxmert has no task tokens"):
        run_finetune(_settings(world, tmp_path / "x", ["vqa"], model="lxmert-tiny", task_tokens=True))
    assert not (tmp_path / "x").exists()
    vilbert = families.get("vilbert")
    mcfg = families.load_config("vilbert-tiny")
    assert vilbert.with_task_tokens(mcfg).task_tokens == 20
    assert vilbert.with_task_tokens(replace(mcfg, task_tokens=24)).task_tokens == 24  # a table of its own: kept


# --- 6: retrieval's scorer ------------------------------------------------------------------


def test_retrieval_fine_tunes_a_new_vil_logit_at_the_head_rate_and_evaluate_scores_with_it(world, tmp_path):
    """ViLBERT (12-in-1: VL-logit) trains a new Linear(H, 1) on the pooled pair vector, a vil_*
    head at --head-lr; `vltrain evaluate` ranks with it, not with the alignment head."""
    cfg = _settings(world, tmp_path / "r", ["flickr30k"], lr=1e-3, head_lr=1e-2, steps=2, eval_items=2)
    run_finetune(cfg)
    state = checkpoint.load(checkpoint.resolve(tmp_path / "r"))
    assert state["model"]["heads.flickr30k.logit.weight"].shape == (1, 16)  # bi_hidden_size: the pooled pair
    assert state["run"]["train"]["transfer"]["retrieval_head"] == "new"
    fast = [g for g in state["optimizer"]["param_groups"] if g["lr_scale"] != 1.0]
    assert {g["lr_scale"] for g in fast} == {10.0} and sum(len(g["params"]) for g in fast) == 2  # weight, bias

    result = evaluate_checkpoint(
        EvaluateConfig("flickr30k", str(tmp_path / "r"), world / "flickr30k", "test", out=tmp_path / "e", limit=4)
    )
    assert "text_to_image_R@1" in result["metrics"]
    ranked = json.loads((tmp_path / "e" / "flickr30k_rankings.json").read_text())[0]["images"]
    family, data = families.get("vilbert"), TaskData.open(world / "flickr30k")
    model = build_transfer_model(
        family, family.config_class.from_json(state["run"]["model"]), [transfer.get("flickr30k")], [data]
    )
    model.load_state_dict(state["model"])
    model.eval()
    settings = DataSettings(max_regions=8, max_text=12)  # the run's
    view = TaskDataset(data, transfer.get("flickr30k"), [world / "feats"], VOCAB, family, settings, "test", train=False)
    images = list(dict.fromkeys(view.value("images", i)[0] for i in range(len(view.rows))))[:4]  # --limit 4
    caption = view.text(view.value("text", 0))
    pairs = torch.utils.data.default_collate([view.candidates([(caption, view.image(k))]) for k in images])
    with torch.no_grad():
        enc = family.encode(model.backbone, pairs)
        trained, alignment = model.heads["flickr30k"].score(enc.pooled), enc.pair
    order = [images[i] for i in trained.argsort(descending=True)[: len(ranked)]]
    assert ranked == order != [images[i] for i in alignment.argsort(descending=True)[: len(ranked)]]


def test_retrieval_head_by_family_and_flag_and_recorded_for_evaluation():
    flickr, data = transfer.get("flickr30k"), SimpleNamespace(answers=[])
    vilbert, lxmert = families.get("vilbert"), families.get("lxmert")
    vcfg, lcfg = families.load_config("vilbert-tiny"), families.load_config("lxmert-tiny")
    assert isinstance(build_transfer_model(vilbert, vcfg, [flickr], [data]).heads["flickr30k"], ChoiceHead)
    assert isinstance(build_transfer_model(lxmert, lcfg, [flickr], [data]).heads["flickr30k"], RetrievalHead)
    plain = build_transfer_model(vilbert, vcfg, [flickr], [data], retrieval_head="pretraining")
    assert isinstance(plain.heads["flickr30k"], RetrievalHead) and not list(plain.heads.parameters())
    assert isinstance(
        build_transfer_model(lxmert, lcfg, [flickr], [data], retrieval_head="new").heads["flickr30k"], ChoiceHead
    )
    assert run_heads({"train": {"transfer": {"retrieval_head": "new"}}}) == {"retrieval_head": "new"}
    assert run_heads({"train": {"transfer": {}}}) == {"retrieval_head": "pretraining"}  # a run from before the setting
    with pytest.raises(ConfigError, match="--retrieval-head must be one of new, pretraining"):
        TransferSettings(retrieval_head="fresh")


# --- 8: one vision_logit (and one vil_logit) for the tasks trained together ----------------------


def test_referring_tasks_share_one_vision_logit_counted_once():
    vilbert, data = families.get("vilbert"), SimpleNamespace(answers=[])
    vcfg = families.load_config("vilbert-tiny")
    refs = [transfer.get(n) for n in ("refcoco", "refcoco+", "refcocog")]
    model = build_transfer_model(vilbert, vcfg, [*refs, transfer.get("nlvr2")], [data] * 4)
    layers = {id(model.heads[t.name].logit) for t in refs}
    assert len(layers) == 1 and model.heads["nlvr2"].logit_fc is not None
    trained = [p for g in param_groups(model, 0.01) for p in g["params"]]
    region = [p for p in trained if any(p is q for q in model.heads["refcoco"].parameters())]
    assert len(region) == 2 and len(trained) == len({id(p) for p in model.parameters()})
    choice = build_transfer_model(
        vilbert, vcfg, [transfer.get("coco-retrieval"), transfer.get("flickr30k")], [data] * 2
    )
    assert choice.heads["coco-retrieval"].logit is choice.heads["flickr30k"].logit  # 12-in-1's one vil_logit
    lxmert = build_transfer_model(families.get("lxmert"), families.load_config("lxmert-tiny"), refs, [data] * 3)
    assert len({id(lxmert.heads[t.name].logit) for t in refs}) == 3  # LXMERT: no reference to share as


def test_a_run_of_refcoco_and_refcoco_plus_resumes_and_evaluates_refcoco_alone(world, tmp_path):
    settings = dict(lr=1e-2, steps=2, checkpoint_every=1)
    run_finetune(_settings(world, tmp_path / "ft", ["refcoco", "refcoco+"], stop_at=1, **settings))
    run_finetune(_settings(world, tmp_path / "ft", ["refcoco", "refcoco+"], resume="yes", **settings))
    state = _model(tmp_path / "ft")
    first = _model(tmp_path / "ft" / "checkpoints" / "step_0000001.pt")
    for key in ("logit.weight", "logit.bias"):
        assert torch.equal(state[f"heads.refcoco.{key}"], state[f"heads.refcoco+.{key}"])
    assert not torch.equal(state["heads.refcoco.logit.weight"], first["heads.refcoco.logit.weight"])  # trained by both
    result = evaluate_checkpoint(
        EvaluateConfig("refcoco", str(tmp_path / "ft"), world / "refcoco", "testA", out=tmp_path / "e")
    )
    assert "accuracy" in result["metrics"]


def _module(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_multi_task_checkpoint_fills_the_shared_vision_logit_vil_logit_and_keeps_its_table(world, tmp_path):
    """--init multi_task_model.bin with refcoco, refcoco+ and flickr30k: its one vision_logit is
    both referring heads' layer, its vil_logit the new retrieval scorer, its task tokens kept."""
    mt = _module("vilbert_mt", REPO / "tests" / "reference" / "vilbert_mt.py")
    shapes = dict(json.loads(mt.FIXTURE.read_text())["task_tokens"]["shapes"])
    shapes["bert.v_embeddings.image_embeddings.weight"] = [shapes["bert.v_embeddings.image_embeddings.weight"][0], DIM]
    source = {k: mt.fill(k, shape) for k, shape in shapes.items()}
    torch.save(source, tmp_path / "multi_task_model.bin")
    tasks = ["refcoco", "refcoco+", "flickr30k"]
    run_finetune(
        _settings(
            world,
            tmp_path / "ft",
            tasks,
            model=str(world / "tiny.json"),
            init=str(tmp_path / "multi_task_model.bin"),
            task_tokens=True,
        )
    )
    tuned = _model(tmp_path / "ft")
    for ours, theirs in (
        ("heads.refcoco.logit.weight", "vision_logit.weight"),
        ("heads.refcoco+.logit.bias", "vision_logit.bias"),
        ("heads.flickr30k.logit.weight", "vil_logit.weight"),
        (f"backbone.{TABLE}", TABLE),
    ):
        assert torch.equal(tuned[ours], source[theirs]), ours


# --- 9: dropout before the region scorer ----------------------------------------------------


@pytest.mark.parametrize("name", ["vilbert-tiny", "lxmert-tiny"])
def test_region_scorer_reads_dropped_out_region_states_in_training_only(name):
    """VILBertForVLTasks: ``vision_logit(self.dropout(sequence_output_v))``, its dropout_prob 0.1
    (the one on the pooled product: our fusion_dropout); LXMERT's hidden dropout."""
    mcfg = families.load_config(name)
    family = families.of_config(mcfg)
    model = build_transfer_model(family, mcfg, [transfer.get("refcoco+")], [SimpleNamespace(answers=[])])
    head = model.heads["refcoco+"]
    assert isinstance(head, RegionHead) and head.dropout.p == 0.1 == family.head_dropout(mcfg)
    torch.manual_seed(0)
    enc = SimpleNamespace(vision=torch.randn(3, 5, family.widths(mcfg)[1]))
    batch = {"region_valid": torch.ones(3, 5)}
    torch.manual_seed(1)
    trained = head(enc, batch)
    torch.manual_seed(1)
    expected = head.logit(F.dropout(enc.vision, 0.1, training=True)).squeeze(-1)
    assert torch.allclose(trained, expected)
    head.eval()
    assert torch.equal(head(enc, batch), head.logit(enc.vision).squeeze(-1)) and not torch.allclose(
        trained, head(enc, batch)
    )


# --- 11: --copy-answers ---------------------------------------------------------------------


@pytest.mark.parametrize("copy", [True, False])
def test_copy_answers_switches_the_rows_from_the_qa_head(world, tmp_path, copy):
    import transformers

    lxmert = families.get("lxmert")
    mcfg = lxmert.fit(families.load_config("lxmert-tiny"), FeatureStore.open(world / "feats").layout, 3, "feats")
    torch.manual_seed(1)
    hf = transformers.LxmertForPreTraining(transformers.LxmertConfig(**mcfg.hf_config()))
    hf.save_pretrained(tmp_path / "hf", safe_serialization=True)
    (tmp_path / "all_ans.json").write_text(json.dumps([{"ans": a} for a in ("blue", "zebra", "red")]))
    settings = dict(model="lxmert-tiny", init=str(tmp_path / "hf"), init_answers=str(tmp_path / "all_ans.json"))
    run_finetune(_settings(world, tmp_path / "ft", ["vqa"], copy_answers=copy, **settings))
    tuned = _model(tmp_path / "ft")
    qa = hf.state_dict()
    red = TaskData.open(world / "vqa").answers.index("red")
    same = [
        torch.equal(tuned["heads.vqa.logit_fc.0.weight"], qa["answer_head.logit_fc.0.weight"]),
        torch.equal(tuned["heads.vqa.logit_fc.3.weight"][red], qa["answer_head.logit_fc.3.weight"][2]),
    ]
    assert same == [copy, copy]


# --- the recipes ----------------------------------------------------------------------------


def test_vilbert_recipes_ask_for_task_tokens_and_12_in_1s_retrieval_scorer():
    for path in sorted(FINETUNE_RECIPE_DIR.glob("*.yaml")):
        _, values = load_recipe(path.stem, FINETUNE_RECIPE_DIR)
        assert values.get("task_tokens", False) is path.stem.startswith("vilbert-"), path.stem
    for name in ("vilbert-flickr30k", "vilbert-12in1"):
        _, values = load_recipe(name, FINETUNE_RECIPE_DIR)
        assert values["retrieval_head"] == "new" and values["head_lr"] == 1e-4


def test_the_command_line_takes_the_recipes_task_tokens_and_scorer_and_the_flags_over_them(world, tmp_path):
    common = ["--data", world / "flickr30k", "--stores", world / "feats", "--model", "vilbert-tiny", "--vocab", VOCAB]
    small = [
        "--epochs",
        "0",
        "--steps",
        "1",
        "--batch-size",
        "4",
        "--max-regions",
        "6",
        "--eval-items",
        "1",
        "--val-split",
        "test",
    ]
    recipe = ["finetune", "--recipe", "vilbert-flickr30k"]
    for out, flags in (("recipe", []), ("flags", ["--no-task-tokens", "--retrieval-head", "pretraining"])):
        proc = run_vltrain(*recipe, *common, *small, *flags, "--out", tmp_path / out)
        assert proc.returncode == 0, proc.stderr[-2000:]
    recipe, flags = (json.loads((tmp_path / out / "config.json").read_text()) for out in ("recipe", "flags"))
    assert recipe["train"]["transfer"]["task_tokens"] is True and recipe["model"]["task_tokens"] == 20
    assert recipe["train"]["transfer"]["retrieval_head"] == "new" and recipe["train"]["transfer"]["head_lr"] == 1e-4
    assert flags["train"]["transfer"]["task_tokens"] is False and flags["model"]["task_tokens"] == 0
    assert flags["train"]["transfer"]["retrieval_head"] == "pretraining"


def test_evaluate_builds_the_retrieval_head_the_run_trained(world, tmp_path):
    """A ViLBERT run that fine-tuned the pretraining pair head (`--retrieval-head pretraining`, or a
    run saved before the setting) is scored with that head, not a new `vil_logit`."""
    run_finetune(_settings(world, tmp_path / "r", ["flickr30k"], retrieval_head="pretraining"))
    result = evaluate_checkpoint(
        EvaluateConfig("flickr30k", str(tmp_path / "r"), world / "flickr30k", "test", out=tmp_path / "e", limit=3)
    )
    assert "text_to_image_R@1" in result["metrics"]
