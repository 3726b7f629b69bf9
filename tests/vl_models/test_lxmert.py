import pytest
import torch
import transformers
from train_helpers import assert_pretraining_logits_match

from pipeline.errors import ConfigError
from vl_models.families import load_config
from vl_models.models.configuration import LxmertConfig
from vl_models.models.modeling_lxmert import LxmertForPreTraining, LxmertModel
from vl_models.models.weights import export_hf, load_lxmert


def hf_config() -> transformers.LxmertConfig:
    """transformers' config for our lxmert-tiny."""
    cfg = load_config("lxmert-tiny")
    return transformers.LxmertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        l_layers=cfg.l_layers,
        x_layers=cfg.x_layers,
        r_layers=cfg.r_layers,
        max_position_embeddings=cfg.max_position_embeddings,
        num_qa_labels=cfg.num_qa_labels,
        num_object_labels=cfg.num_object_labels,
        num_attr_labels=cfg.num_attr_labels,
    )


def hf_tiny() -> transformers.LxmertModel:
    hf_cfg = hf_config()
    torch.manual_seed(0)
    model = transformers.LxmertModel(hf_cfg).eval()
    with torch.no_grad():  # make every parameter matter (HF zero-initializes biases)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


def inputs(batch=3, words=9, regions=7):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 30522, (batch, words), generator=g)
    mask = torch.ones(batch, words, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    ids[mask == 0] = 0
    feats = torch.rand(batch, regions, 2048, generator=g)
    xy = torch.rand(batch, regions, 2, generator=g) * 0.5
    pos = torch.cat([xy, xy + torch.rand(batch, regions, 2, generator=g) * 0.5], -1)
    vmask = torch.ones(batch, regions, dtype=torch.long)
    vmask[0, 5:] = 0
    return ids, feats, pos, mask, vmask


def test_parity_with_transformers_lxmert():
    hf = hf_tiny()
    ours = load_lxmert(hf.state_dict(), load_config("lxmert-tiny")).eval()
    ids, feats, pos, mask, vmask = inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, visual_feats=feats, visual_pos=pos, attention_mask=mask, visual_attention_mask=vmask)
        got = ours(ids, feats, pos, attention_mask=mask, visual_attention_mask=vmask)
    for name in ("language_output", "vision_output", "pooled_output"):
        diff = (getattr(ref, name) - getattr(got, name)).abs().max().item()
        assert diff <= 1e-5, (name, diff)


def test_pooled_only_skips_the_last_layers_unread_states_with_the_same_pooled_vector():
    """Heads that read the pooled vector alone (answers, pair, choice, retrieval) ask for it
    alone: the last cross-modality layer computes the [CLS] state only, and the pooled vector
    equals transformers' full forward within 1e-5."""
    hf = hf_tiny()
    ours = load_lxmert(hf.state_dict(), load_config("lxmert-tiny")).eval()
    ids, feats, pos, mask, vmask = inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, visual_feats=feats, visual_pos=pos, attention_mask=mask, visual_attention_mask=vmask)
        got = ours(ids, feats, pos, attention_mask=mask, visual_attention_mask=vmask, pooled_only=True)
    assert got.vision_output is None and got.language_output.shape == (3, 1, ref.language_output.shape[-1])
    assert (got.language_output[:, 0] - ref.language_output[:, 0]).abs().max() <= 1e-5
    assert (got.pooled_output - ref.pooled_output).abs().max() <= 1e-5


def test_export_to_hf_layout_round_trips(tmp_path):
    torch.manual_seed(3)
    ours = LxmertModel(load_config("lxmert-tiny")).eval()
    export_hf(ours, tmp_path / "hf")
    hf = transformers.LxmertModel.from_pretrained(tmp_path / "hf").eval()
    ids, feats, pos, mask, vmask = inputs()
    with torch.no_grad():
        a = ours(ids, feats, pos, attention_mask=mask, visual_attention_mask=vmask)
        b = hf(input_ids=ids, visual_feats=feats, visual_pos=pos, attention_mask=mask, visual_attention_mask=vmask)
    assert (a.pooled_output - b.pooled_output).abs().max() <= 1e-5
    again = load_lxmert(tmp_path / "hf", load_config("lxmert-tiny"))
    for (k, x), (_, y) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(x, y), k


def test_pretraining_model_exports_to_transformers(tmp_path):
    from vl_models.models.weights import load_lxmert_pretraining

    torch.manual_seed(4)
    cfg = load_config("lxmert-tiny")
    ours = LxmertForPreTraining(cfg).eval()
    export_hf(ours, tmp_path / "hf")
    hf = transformers.LxmertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids, feats, pos, mask, vmask = inputs()
    assert_pretraining_logits_match(ours, hf, ids, feats, pos, mask, vmask)
    again = load_lxmert_pretraining(tmp_path / "hf", cfg)
    for (k, x), y in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(x, y), k


def test_original_pth_prefixes_and_strict_errors(tmp_path):
    state = {f"module.bert.{k}": v for k, v in hf_tiny().state_dict().items()}
    torch.save(state, tmp_path / "Epoch20_LXRT.pth")
    load_lxmert(tmp_path / "Epoch20_LXRT.pth", load_config("lxmert-tiny"))
    state.pop("module.bert.pooler.dense.bias")
    state["module.bert.extra.weight"] = torch.zeros(2)
    with pytest.raises(ConfigError, match=r"missing: pooler.dense.bias[\s\S]*unexpected: extra.weight"):
        load_lxmert(state, load_config("lxmert-tiny"))
    with pytest.raises(ConfigError, match="misshaped"):
        load_lxmert(
            hf_tiny().state_dict(),
            LxmertConfig(
                name="other",
                hidden_size=64,
                num_attention_heads=4,
                intermediate_size=64,
                l_layers=2,
                x_layers=1,
                r_layers=1,
                max_position_embeddings=64,
            ),
        )


def test_base_config_has_the_paper_sizes():
    cfg = load_config("lxmert-base")
    assert (cfg.l_layers, cfg.r_layers, cfg.x_layers, cfg.hidden_size, cfg.visual_pos_dim) == (9, 5, 5, 768, 4)
    model = LxmertModel(cfg)
    assert sum(p.numel() for p in model.parameters()) > 200e6


def test_pretraining_heads_match_transformers():
    from vl_models.models.weights import load_lxmert_pretraining

    cfg = load_config("lxmert-tiny")
    hf_cfg = hf_config()
    torch.manual_seed(0)
    hf = transformers.LxmertForPreTraining(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ours = load_lxmert_pretraining(hf.state_dict(), cfg).eval()
    assert ours.cls.predictions.decoder.weight is ours.lxmert.embeddings.word_embeddings.weight
    ids, feats, pos, mask, vmask = inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, visual_feats=feats, visual_pos=pos, attention_mask=mask, visual_attention_mask=vmask)
        got = ours(ids, feats, pos, attention_mask=mask, visual_attention_mask=vmask)
    pairs = [
        (ref.prediction_logits, got.lm_logits),
        (ref.cross_relationship_score, got.matched_logits),
        (ref.question_answering_score, got.answer_logits),
    ]
    for a, b in pairs:
        assert (a - b).abs().max() <= 1e-4
    # original .pth layout: module.bert.* backbone and module.<head>.*
    original = {
        ("module.bert." + k[len("lxmert.") :]) if k.startswith("lxmert.") else "module." + k: v
        for k, v in hf.state_dict().items()
    }
    again = load_lxmert_pretraining(original, cfg)
    assert torch.equal(again.answer_head.logit_fc[3].weight, ours.answer_head.logit_fc[3].weight)


def test_answer_rows_are_copied_by_answer_string():
    """LXMERT's fine-tuning starts its answer head from the pretraining QA head as airsplay's
    `load_lxmert_qa` does: each new answer converted by `convert_ans` (lowercase, no trailing
    '.', no leading article, number words and grey -> gray), looked up exactly in the QA
    table (whose answers are converted already), unmatched rows zeroed (weight and bias)."""
    import pytest
    import torch

    from pipeline.errors import ConfigError
    from vl_models.models.weights import copy_answer_rows

    old_answers = ["yes", "no", "gray", "2", "dog"]  # as LXMERT's all_ans.json holds them
    weight, bias = torch.randn(5, 8), torch.randn(5)
    head = torch.nn.Linear(8, 6)
    copied = copy_answer_rows(head, weight, bias, old_answers, ["No", "grey", "two", "a dog", "cat", "Yes."])
    assert copied == 5  # "cat" is not in the QA table
    for new, old in ((0, 1), (1, 2), (2, 3), (3, 4), (5, 0)):
        assert torch.equal(head.weight[new], weight[old]) and head.bias[new] == bias[old]
    assert not head.weight[4].any() and head.bias[4] == 0  # unmatched: zeroed
    with pytest.raises(ConfigError, match="does not match its answer table"):
        copy_answer_rows(head, weight[:4], bias, old_answers, ["no"] * 4)
