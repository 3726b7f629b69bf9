"""Published fine-tuned checkpoints (`vl_models.transfer.published`), with random weights in
each published layout: a transformers `LxmertForQuestionAnswering` folder gives through
`vltrain evaluate` the logits transformers gives; airsplay/lxmert's ``BEST.pth`` of VQA and
NLVR2 loads by its own key names; loading is strict and every refusal names the keys; a
published checkpoint starts `vltrain finetune --init`."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers import REPO, run_vltrain
from train_helpers import VOCAB

from pipeline.errors import ConfigError
from pipeline.store import FeatureStore
from pipeline.task_data import TaskData
from vl_models import families, transfer
from vl_models.config import DataSettings, FinetuneConfig
from vl_models.data.tokenize import WordPiece, bundled_bert_vocab
from vl_models.train import checkpoint
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.published import AIRSPLAY, HF_QA, read_published

LXMERT = families.get("lxmert")


def _module(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _module("airsplay_lxmert", REPO / "tests" / "reference" / "airsplay_lxmert.py")  # the fixture's maker
finetune_step = _module("finetune_step", REPO / "bench" / "finetune_step.py")  # transformers' QA call


def _hf_config(world, answers: int) -> transformers.LxmertConfig:
    """A tiny transformers LXMERT config that reads the world's store."""
    mcfg = LXMERT.fit(families.load_config("lxmert-tiny"), FeatureStore.open(world / "feats").layout, 3, "feats")
    return transformers.LxmertConfig(**{**mcfg.hf_config(), "num_qa_labels": answers})


def _scramble(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random (LayerNorms are ones and biases zeros at init: they would not
    count): LayerNorm scales around 1, the rest around 0 at the width's scale."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if "LayerNorm.weight" in name or name.endswith(".2.weight") else 0.2 * noise)


@pytest.fixture(scope="module")
def hf_vqa(world, tmp_path_factory):
    """A transformers LxmertForQuestionAnswering folder (safetensors) for the world's VQA answer table."""
    answers = len(TaskData.open(world / "vqa").answers)
    torch.manual_seed(0)
    model = transformers.LxmertForQuestionAnswering(_hf_config(world, answers)).eval()
    _scramble(model, 1)
    folder = tmp_path_factory.mktemp("hf") / "lxmert-vqa"
    model.save_pretrained(folder, safe_serialization=True)
    return folder, model


def _view(world, task: str, split: str) -> TaskDataset:
    data = TaskData.open(world / task)
    return TaskDataset(data, transfer.get(task), [world / "feats"], VOCAB, LXMERT, DataSettings(), split, train=False)


def _batch(view: TaskDataset) -> dict:
    return torch.utils.data.default_collate([view[i] for i in range(len(view))])


def test_a_transformers_qa_folder_gives_transformers_logits(world, hf_vqa):
    folder, hf = hf_vqa
    published = read_published(str(folder))
    assert published.layout == HF_QA and published.head_kind == "answers"
    assert published.mcfg.hidden_size == hf.config.hidden_size and published.vocab != folder  # no vocab inside
    data = TaskData.open(world / "vqa")
    model = published.transfer_model(transfer.get("vqa"), len(data.answers)).eval()
    view = _view(world, "vqa", "val")
    batch = _batch(view)
    assert (batch["attention_mask"] == 0).any()  # padded questions
    with torch.no_grad():
        ours = model("vqa", batch)
        ref = finetune_step.hf_qa_scores(hf, batch)
    assert ours.shape == ref.shape and ref.std(0).max() > 0.1  # logits that depend on the inputs
    assert (ours - ref).abs().max() <= 1e-5


def test_vltrain_evaluate_scores_a_transformers_qa_folder(world, hf_vqa, tmp_path):
    folder, hf = hf_vqa
    legacy = tmp_path / "lxmert-vqa-bin"  # the hub's older file: pytorch_model.bin
    legacy.mkdir()
    torch.save(hf.state_dict(), legacy / "pytorch_model.bin")
    (legacy / "config.json").write_text((folder / "config.json").read_text())
    for source in (folder, legacy):
        out = tmp_path / f"eval-{source.name}"
        proc = run_vltrain(
            "evaluate",
            "--task",
            "vqa",
            "--checkpoint",
            source,
            "--data",
            world / "vqa",
            "--split",
            "val",
            "--stores",
            world / "feats",
            "--out",
            out,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "transformers LxmertForQuestionAnswering" in proc.stderr
        results = json.loads((out / "vqa_results.json").read_text())
        view = _view(world, "vqa", "val")
        batch = _batch(view)
        with torch.no_grad():
            ref = finetune_step.hf_qa_scores(hf, batch)
        data = view.data
        expected = {int(data.column("uid")[r]): data.answers[int(a)] for r, a in zip(view.rows, ref.argmax(-1))}
        assert {r["question_id"]: r["answer"] for r in results} == expected
        assert json.loads((out / "metrics.json").read_text())["checkpoint"] == str(source)


def _airsplay_state(hf: torch.nn.Module) -> dict:
    """A transformers QA model's tensors under airsplay's fine-tuning names (its VQA model:
    ``lxrt_encoder.model.bert.*`` + ``logit_fc.*``), as airsplay's ``--multiGPU`` saves them."""
    out = {}
    for key, value in hf.state_dict().items():
        if key.startswith("lxmert."):
            out["lxrt_encoder.model.module.bert." + key[len("lxmert.") :]] = value
        elif key.startswith("answer_head."):
            out[key[len("answer_head.") :]] = value
    return out


def _tiny_config(world, tmp_path) -> str:
    """Our config of the tiny model (airsplay's snapshots hold none: --model names it)."""
    hf = _hf_config(world, 3).to_dict()
    mcfg = {k: hf[k] for k in ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size")}
    mcfg.update({k: hf[k] for k in ("l_layers", "x_layers", "r_layers", "visual_feat_dim", "max_position_embeddings")})
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"model_type": "lxmert", "name": "tiny", **mcfg}))
    return str(path)


def test_an_airsplay_vqa_snapshot_loads_by_its_own_names(world, hf_vqa, tmp_path):
    folder, hf = hf_vqa
    torch.save(_airsplay_state(hf), tmp_path / "BEST.pth")
    with pytest.raises(ConfigError, match="holds no model config: name it with --model"):
        read_published(str(tmp_path / "BEST.pth"))
    published = read_published(str(tmp_path / "BEST.pth"), _tiny_config(world, tmp_path))
    assert published.layout == AIRSPLAY and published.answers == hf.config.num_qa_labels
    data = TaskData.open(world / "vqa")
    ours = published.transfer_model(transfer.get("vqa"), len(data.answers)).eval()
    reference = read_published(str(folder)).transfer_model(transfer.get("vqa"), len(data.answers)).eval()
    batch = _batch(_view(world, "vqa", "val"))
    with torch.no_grad():
        assert torch.equal(ours("vqa", batch), reference("vqa", batch))


def test_loading_is_strict_and_names_the_keys(world, hf_vqa, tmp_path):
    folder, hf = hf_vqa
    config = _tiny_config(world, tmp_path)
    state = _airsplay_state(hf)
    data = TaskData.open(world / "vqa")
    vqa = transfer.get("vqa")

    def refused(broken: dict, match: str) -> None:
        torch.save(broken, tmp_path / "broken.pth")
        with pytest.raises(ConfigError, match=match):
            read_published(str(tmp_path / "broken.pth"), config).transfer_model(vqa, len(data.answers))

    key = "lxrt_encoder.model.module.bert.encoder.x_layers.0.visual_attention.att.query.weight"
    refused({k: v for k, v in state.items() if k != key}, r"missing: encoder\.x_layers\.0\.visual_attention")
    refused({**state, "lxrt_encoder.model.bert.encoder.layer.7.output.dense.weight": state[key]}, "unexpected")
    refused({**state, "lxrt_encoder.model.bert.pooler.dense.weight": torch.zeros(3, 3)}, "misshaped: pooler")
    refused({**state, "cls.predictions.bias": torch.zeros(3)}, "neither its encoder nor its task head: cls")
    with pytest.raises(ConfigError, match="its answer head has .* rows, the task dataset's answer table"):
        read_published(str(folder)).transfer_model(vqa, len(data.answers) + 1)
    with pytest.raises(ConfigError, match="not a nlvr2 head"):
        read_published(str(folder)).transfer_model(transfer.get("nlvr2"), 0)


def test_an_airsplay_nlvr2_snapshot_scores_both_images_of_a_pair(world, tmp_path):
    """NLVR2's 2h -> 2h -> 2 classifier on [pooled(sentence, left) ; pooled(sentence, right)]."""
    hf_cfg = _hf_config(world, 3)
    torch.manual_seed(0)
    encoder = transformers.LxmertModel(hf_cfg).eval()
    _scramble(encoder, 2)
    h = hf_cfg.hidden_size
    head = torch.nn.Sequential(
        torch.nn.Linear(2 * h, 2 * h), torch.nn.GELU(), torch.nn.LayerNorm(2 * h, eps=1e-12), torch.nn.Linear(2 * h, 2)
    )
    _scramble(head, 3)
    state = {"lxrt_encoder.model.bert." + k: v for k, v in encoder.state_dict().items()}
    state.update({"logit_fc." + k: v for k, v in head.state_dict().items()})
    torch.save(state, tmp_path / "BEST.pth")
    published = read_published(str(tmp_path / "BEST.pth"), _tiny_config(world, tmp_path))
    assert published.head_kind == "pair" and published.answers == 0
    model = published.transfer_model(transfer.get("nlvr2"), 0).eval()
    batch = _batch(_view(world, "nlvr2", "dev"))
    b = batch["input_ids"].shape[0]
    with torch.no_grad():
        ours = model("nlvr2", batch)
        pooled = encoder(
            input_ids=batch["input_ids"].flatten(0, 1),
            attention_mask=batch["attention_mask"].flatten(0, 1),
            visual_feats=batch["visual_feats"].flatten(0, 1),
            visual_pos=batch["visual_pos"].flatten(0, 1),
            visual_attention_mask=batch["visual_mask"].flatten(0, 1),
        ).pooled_output
        ref = head(pooled.view(b, 2 * h))  # airsplay: the pair's two pooled outputs, left image first
    assert (ours - ref).abs().max() <= 1e-5


def test_finetune_starts_from_a_published_checkpoint(world, hf_vqa, tmp_path):
    """--init a transformers QA folder: the encoder and (same answer table) the VQA head, whole."""
    folder, hf = hf_vqa
    cfg = FinetuneConfig.of(
        tasks=("vqa",),
        task_data=(str(world / "vqa"),),
        stores=(str(world / "feats"),),
        out=str(tmp_path / "ft"),
        init=str(folder),
        vocab=str(VOCAB),
        epochs=None,
        steps=1,
        batch_size=4,
        lr=0.0,
        warmup=0,
        log_every=1,
        checkpoint_every=1,
    )
    run_finetune(cfg)
    tuned = checkpoint.load(tmp_path / "ft" / "checkpoints" / "step_0000001.pt")["model"]
    reference = hf.state_dict()
    for ours, theirs in (
        ("backbone.lxmert.encoder.x_layers.0.visual_attention.att.query.weight", None),
        ("backbone.lxmert.pooler.dense.bias", None),
        ("heads.vqa.logit_fc.3.weight", "answer_head.logit_fc.3.weight"),
        ("heads.vqa.logit_fc.0.bias", "answer_head.logit_fc.0.bias"),
    ):
        assert torch.equal(tuned[ours], reference[theirs or ours[len("backbone.") :]]), ours
    assert np.isfinite([v.float().sum().item() for v in tuned.values()]).all()


@pytest.mark.parametrize("task", ["vqa", "nlvr2"])
def test_airsplay_snapshots_give_the_reference_codes_logits(task, tmp_path):
    """The logits airsplay/lxmert's own VQAModel / NLVR2Model computed (tests/reference/
    airsplay_lxmert.py: the same BEST.pth, rebuilt here from its key names and shapes, and the
    same inputs), from our loader and model; and our tokenizer's ids are airsplay's (20 tokens,
    the question cut to 18 word pieces, as its `convert_sents_to_features` does)."""
    fixture = json.loads(reference.FIXTURE.read_text())
    case = fixture[task]
    torch.save({k: reference.fill(k, shape) for k, shape in case["shapes"].items()}, tmp_path / "BEST.pth")
    config = {"model_type": "lxmert", "name": "airsplay-tiny", "vocab_size": 30522, "visual_feat_dim": 2048}
    config.update(hidden_size=fixture["hidden"], num_attention_heads=fixture["heads"], max_position_embeddings=64)
    config.update(
        intermediate_size=fixture["intermediate"], **{f"{k[0]}_layers": v for k, v in fixture["layers"].items()}
    )
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    published = read_published(str(tmp_path / "BEST.pth"), str(tmp_path / "tiny.json"))
    model = published.transfer_model(transfer.get(task), fixture["answers"] if task == "vqa" else 0).eval()
    tokenizer = WordPiece(bundled_bert_vocab())
    encoded = [tokenizer.encode(sentence, 20) for sentence in case["sentences"]]
    assert [e.ids.tolist() for e in encoded] == case["input_ids"]
    assert [e.mask.tolist() for e in encoded] == case["input_mask"]
    images = 2 if task == "nlvr2" else 1
    feats, boxes = reference.regions(len(encoded), images, case["seed"])
    ids = torch.tensor(np.stack([e.ids for e in encoded]))[:, None].expand(-1, images, -1)
    mask = torch.tensor(np.stack([e.mask for e in encoded]))[:, None].expand(-1, images, -1)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "visual_feats": feats,
        "visual_pos": boxes,
        "visual_mask": torch.ones(feats.shape[:3], dtype=torch.long),  # airsplay passes no visual mask
    }
    with torch.no_grad():
        ours = model(task, batch)
    assert (ours - torch.tensor(case["logits"])).abs().max() <= 1e-4


def test_a_damaged_published_folder_is_one_named_error(world, hf_vqa, tmp_path):
    """A published folder of a careless download or a hostile source: non-finite weights, a
    NaN epsilon, a config.json that is no JSON object or has impossible sizes (refused before
    any tensor is made of them), an empty, truncated or random model.safetensors. Each is
    one `error:` line, exit 2, through `vltrain evaluate` as a user meets it."""
    folder, hf = hf_vqa
    config = json.loads((folder / "config.json").read_text())

    def copy(name: str, weights: bytes | None = None, cfg=None) -> Path:
        target = tmp_path / name
        target.mkdir()
        (target / "model.safetensors").write_bytes(
            (folder / "model.safetensors").read_bytes() if weights is None else weights
        )
        (target / "config.json").write_text(cfg if isinstance(cfg, str) else json.dumps(cfg or config))
        return target

    from safetensors.torch import save_file

    state = {k: v.clone().contiguous() for k, v in hf.state_dict().items()}
    state["lxmert.encoder.layer.0.output.dense.weight"][0, 0] = float("nan")
    nan_weights = tmp_path / "nan.safetensors"
    save_file(state, str(nan_weights))
    good = (folder / "model.safetensors").read_bytes()
    cases = [
        (copy("nan", nan_weights.read_bytes()), "hold NaN or infinite values"),
        (copy("eps", cfg={**config, "layer_norm_eps": float("nan")}), "layer_norm_eps: a finite number"),
        (copy("notjson", cfg="{not json"), "not a readable JSON config"),
        (copy("list", cfg="[1, 2]"), "a model config is a JSON object, not a list"),
        (copy("text", cfg={**config, "hidden_size": "32"}), "hidden_size: an integer, not '32'"),
        (copy("negative", cfg={**config, "hidden_size": -32}), "hidden_size -32: out of range"),
        (copy("huge", cfg={**config, "hidden_size": 10**9}), "hidden_size 1000000000: out of range"),
        (copy("heads", cfg={**config, "num_attention_heads": 0}), "num_attention_heads 0: out of range"),
        (copy("empty", b""), "not a readable safetensors file"),
        (copy("truncated", good[: len(good) // 2]), "not a readable safetensors file"),
        (copy("random", bytes(range(256)) * 64), "not a readable safetensors file"),
    ]
    for source, words in cases:
        proc = run_vltrain(
            "evaluate", "--task", "vqa", "--checkpoint", source, "--data", world / "vqa", "--split", "val",
            "--stores", world / "feats", "--out", tmp_path / f"eval-{source.name}",
        )  # fmt: skip
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (source.name, proc.stderr[-2000:])
        assert words in " ".join(proc.stderr.split()), (source.name, proc.stderr[-2000:])
        assert not (tmp_path / f"eval-{source.name}").exists()


def test_a_strict_load_refusal_is_one_line(world, hf_vqa, tmp_path):
    folder, hf = hf_vqa
    state = _airsplay_state(hf)
    key = "lxrt_encoder.model.module.bert.encoder.x_layers.0.visual_attention.att.query.weight"
    torch.save({k: v for k, v in state.items() if k != key}, tmp_path / "broken.pth")
    with pytest.raises(ConfigError) as err:
        read_published(str(tmp_path / "broken.pth"), _tiny_config(world, tmp_path)).transfer_model(
            transfer.get("vqa"), len(TaskData.open(world / "vqa").answers)
        )
    assert "\n" not in str(err.value) and "missing: encoder.x_layers.0" in str(err.value)
