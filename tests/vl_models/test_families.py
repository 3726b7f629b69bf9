"""Model families: found by name, the only place a model's name decides anything, and a new
model is one new module (shown with a toy family trained and evaluated end to end)."""

import ast
import json
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch
from helpers import REPO
from train_helpers import config

from pipeline.errors import ConfigError
from vl_models import families
from vl_models.data.masking import RegionMasking
from vl_models.families.base import RETRIEVAL_METRICS, ModelFamily
from vl_models.models.configuration import ModelConfig
from vl_models.tasks import losses as L
from vl_models.train.trainer import run


@dataclass(frozen=True)
class ToyConfig(ModelConfig):
    model_type: ClassVar[str] = "toy"
    name: str = "toy"
    vocab_size: int = 30522
    hidden_size: int = 16
    num_attention_heads: int = 2
    feature_dim: int = 2048


class ToyModel(torch.nn.Module):
    """One stream: word embeddings plus the mean projected region, an LM head and a pair head."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.words = torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.regions = torch.nn.Linear(cfg.feature_dim + 4, cfg.hidden_size)
        self.lm = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.pair = torch.nn.Linear(cfg.hidden_size, 2)

    def forward(self, ids, feats, pos, mask, vmask, lm_positions):
        vmask = vmask.float()[..., None]
        image = (self.regions(torch.cat([feats, pos], -1)) * vmask).sum(1) / vmask.sum(1).clamp(min=1)
        fused = self.words(ids) + image[:, None]
        return SimpleNamespace(lm_logits=self.lm(fused[lm_positions]), pair_logits=self.pair(fused[:, 0]))


class Toy(ModelFamily):
    name = "toy"
    config_class = ToyConfig
    tasks = ("mlm", "matching")
    pair_task = "matching"
    eval_metrics = {"eval_mlm_acc": "max", "eval_matching_acc": "max", **RETRIEVAL_METRICS}
    max_text = 12
    position = "4d"
    region_masking = RegionMasking(zero=1.0)

    def fit(self, mcfg, layout, answers, store):
        return replace(mcfg, feature_dim=layout.feature_dim)

    def build(self, mcfg):
        return ToyModel(mcfg)

    def backbone(self, model):
        return model

    def visual_targets(self, regions, original, image):
        return {}

    def forward(self, model, batch, decode=True):
        tokens = batch["lm_labels"] != -1 if decode else torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
        return model(
            batch["input_ids"],
            batch["visual_feats"],
            batch["visual_pos"],
            batch["attention_mask"],
            batch["visual_mask"],
            lm_positions=tokens,
        )

    def losses(self, model, batch, qa_active, visual_weighting):
        out = self.forward(model, batch)
        mlm, m1 = L.masked_lm(out.lm_logits, batch["lm_labels"][batch["lm_labels"] != -1])
        matched, m2 = L.pair_classification(out.pair_logits, batch["matched"], "matching")
        return {"mlm": mlm, "matching": matched}, {**m1, **m2}

    def pair_score(self, model, batch):
        return self.forward(model, batch, decode=False).pair_logits.float().softmax(-1)[:, 1]


@pytest.fixture
def toy():
    family = families.register(Toy())
    yield family
    families.unregister("toy")


def test_a_registered_family_trains_evaluates_and_resumes(data, tmp_path, toy):
    model_file = tmp_path / "toy.json"
    model_file.write_text(json.dumps({"model_type": "toy", "name": "toy", "hidden_size": 8}))
    cfg = config(data, tmp_path, str(model_file), steps=3, best_metric="eval_matching_acc")
    last = run(cfg)
    assert {"loss_mlm", "loss_matching", "eval_mlm_acc", "eval_matching_acc", "eval_retrieval_R@1"} <= set(last)
    assert not {"loss_qa", "eval_qa_score"} & set(last)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["kind"] == "toy" and saved["model"]["hidden_size"] == 8
    assert run(cfg.with_(steps=4, resume=True))["step"] == 4
    with pytest.raises(ConfigError, match="toy has no task.*region"):
        run(config(data, tmp_path / "other", str(model_file), weights={"region": 1.0}))


def test_the_registry_finds_families_by_name_and_refuses_clashes(toy):
    assert families.get("toy") is toy and {"vilbert", "lxmert", "toy"} <= set(families.names())
    assert families.of_config(ToyConfig()) is toy
    assert families.from_run({"model": ToyConfig().to_json()}) is toy  # an old record without "kind"
    with pytest.raises(ConfigError, match="already registered"):
        families.register(Toy())
    with pytest.raises(ConfigError, match="unknown model family 'bert'; known: vilbert, lxmert"):
        families.get("bert")

    class Misnamed(Toy):
        name = "toy2"

    with pytest.raises(ConfigError, match="model_type = 'toy2'"):
        families.register(Misnamed())


FAMILY_NAMES = {"vilbert", "lxmert"}


def test_no_model_name_decides_anything_outside_the_families():
    """No `x == "vilbert"`-style comparison (or `in ("vilbert", ...)`) outside vl_models/families/:
    what differs between models is asked of the family object."""
    offenders = []
    for path in sorted((REPO / "vl_models").rglob("*.py")):
        if "families" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                strings = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
                if strings & FAMILY_NAMES:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"weights": {"region": 1.0}}, "lxmert has no task"),
        ({"best_metric": "eval_region_kl"}, "not a validation score of lxmert"),
        ({"region_overlap": "zero"}, "lxmert supports keep"),
    ],
)
def test_what_the_family_refuses_is_refused_before_the_model_is_built(data, tmp_path, monkeypatch, setting, message):
    def build(mcfg):
        raise AssertionError("the model was built before the settings were checked")

    monkeypatch.setattr(families.get("lxmert"), "build", build)
    with pytest.raises(ConfigError, match=message):
        run(config(data, tmp_path, "lxmert-tiny", **setting))
