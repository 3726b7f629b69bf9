"""`vltrain pretrain --init` from a standard BERT checkpoint (`BertForPreTraining`: ``bert.*``
+ ``cls.*``), in each published layout: the hub's ``pytorch_model.bin`` (old
``LayerNorm.gamma/beta`` names), ``model.safetensors``, a file or a folder."""

import pytest
import torch
from train_helpers import config

from pipeline.errors import ConfigError
from vl_models import families
from vl_models.families import load_config
from vl_models.models.modeling_lxmert import LxmertForPreTraining
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
from vl_models.models.weights import init_pretraining
from vl_models.train import checkpoint
from vl_models.train.trainer import run

transformers = pytest.importorskip("transformers")
VILBERT = families.get("vilbert")


def bert_for_pretraining(layers: int = 3, width: int = 32, heads: int = 4, inner: int = 64):
    torch.manual_seed(7)
    cfg = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
        max_position_embeddings=64,
    )
    return transformers.BertForPreTraining(cfg).eval()


def old_names(state: dict) -> dict:
    """The hub's bert-base-uncased/pytorch_model.bin spelling: LayerNorm.gamma / .beta."""
    return {
        k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
        for k, v in state.items()
    }


@pytest.fixture(scope="module")
def bert_layouts(tmp_path_factory):
    """{layout: path} of one random BertForPreTraining, and the model."""
    root = tmp_path_factory.mktemp("bert")
    bert = bert_for_pretraining()
    layouts = {}
    hub = root / "hub"  # folder with the old-named pytorch_model.bin, as bert-base-uncased/
    hub.mkdir()
    torch.save(old_names(bert.state_dict()), hub / "pytorch_model.bin")
    layouts["pytorch_model.bin (gamma/beta), folder"] = hub
    layouts["pytorch_model.bin (gamma/beta), file"] = hub / "pytorch_model.bin"
    bert.save_pretrained(root / "st", safe_serialization=True)  # model.safetensors, tied decoder stored once
    layouts["model.safetensors, folder"] = root / "st"
    layouts["model.safetensors, file"] = root / "st" / "model.safetensors"
    return layouts, bert


def _assert_filled(ours: dict, bert: dict, prefix: str, layers: int) -> None:
    for key in (
        "embeddings.word_embeddings.weight",
        "embeddings.LayerNorm.weight",
        "embeddings.LayerNorm.bias",
        *(f"encoder.layer.{i}.output.LayerNorm.bias" for i in range(layers)),
        f"encoder.layer.{layers - 1}.attention.self.query.weight",
    ):
        assert torch.equal(ours[prefix + key], bert["bert." + key]), key
    for key in ("transform.dense.weight", "transform.LayerNorm.weight", "transform.LayerNorm.bias", "bias"):
        assert torch.equal(ours["cls.predictions." + key], bert["cls.predictions." + key]), key  # BERT's MLM head
    assert torch.equal(ours["cls.predictions.decoder.weight"], bert["bert.embeddings.word_embeddings.weight"])


@pytest.mark.parametrize(
    "layout",
    [
        "pytorch_model.bin (gamma/beta), folder",
        "pytorch_model.bin (gamma/beta), file",
        "model.safetensors, folder",
        "model.safetensors, file",
    ],
)
def test_vilbert_from_bert_for_pretraining(bert_layouts, layout):
    layouts, bert = bert_layouts
    model = ViLBERTForPreTraining(load_config("vilbert-tiny"))
    visual_before = model.bert.v_embeddings.image_embeddings.weight.clone()
    said = init_pretraining(model, layouts[layout], VILBERT.load_checkpoint)
    _assert_filled(model.state_dict(), bert.state_dict(), "bert.", 3)
    assert torch.equal(model.bert.v_embeddings.image_embeddings.weight, visual_before)  # not in BERT: as initialized
    assert (
        "BERT" in said and "cls.seq_relationship" in said and "pooler" in said
    )  # what BERT has that ViLBERT does not use


def test_lxmert_from_bert_takes_the_first_language_layers(bert_layouts):
    """As airsplay/lxmert without --fromScratch: embeddings, the first l_layers of BERT's
    encoder, its pooler and its MLM head; BERT's deeper layers are left out."""
    layouts, bert = bert_layouts
    model = LxmertForPreTraining(load_config("lxmert-tiny"))  # l_layers 2 of BERT's 3
    said = init_pretraining(
        model, layouts["pytorch_model.bin (gamma/beta), folder"], families.get("lxmert").load_checkpoint
    )
    state, ref = model.state_dict(), bert.state_dict()
    _assert_filled(state, ref, "lxmert.", 2)
    assert torch.equal(state["lxmert.pooler.dense.weight"], ref["bert.pooler.dense.weight"])
    assert torch.equal(state["cls.seq_relationship.weight"], ref["cls.seq_relationship.weight"])  # the matching head
    assert "encoder.layer.2" in said and "seq_relationship" not in said


def test_a_decoder_bias_alone_is_the_lm_bias(tmp_path):
    """Some older BertForPreTraining files store the LM bias only as cls.predictions.decoder.bias."""
    bert = bert_for_pretraining()
    state = bert.state_dict()
    state["cls.predictions.decoder.bias"] = state.pop("cls.predictions.bias").clone() + 1
    torch.save(state, tmp_path / "pytorch_model.bin")
    model = ViLBERTForPreTraining(load_config("vilbert-tiny"))
    init_pretraining(model, tmp_path, VILBERT.load_checkpoint)
    assert torch.equal(model.cls.predictions.bias, state["cls.predictions.decoder.bias"])


def test_bert_that_does_not_fit_is_refused_naming_the_keys(tmp_path):
    wide = bert_for_pretraining(width=64, inner=64)
    torch.save(wide.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="misshaped: .*embeddings.word_embeddings.weight"):
        init_pretraining(ViLBERTForPreTraining(load_config("vilbert-tiny")), tmp_path, VILBERT.load_checkpoint)
    shallow = bert_for_pretraining(layers=2)
    torch.save(shallow.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="missing: .*encoder.layer.2"):
        init_pretraining(ViLBERTForPreTraining(load_config("vilbert-tiny")), tmp_path, VILBERT.load_checkpoint)


def test_pretrain_init_from_a_bert_folder(data, tmp_path, bert_layouts):
    """The README's `--init bert-base-uncased/` path, end to end (one step, lr 0)."""
    layouts, bert = bert_layouts
    run(
        config(
            data, tmp_path, "vilbert-tiny", steps=1, lr=0.0, init=str(layouts["pytorch_model.bin (gamma/beta), folder"])
        )
    )
    state = checkpoint.load_latest(tmp_path / "run")["model"]
    key = "bert.encoder.layer.2.attention.self.query.weight"
    assert torch.equal(state[key], bert.state_dict()[key])
