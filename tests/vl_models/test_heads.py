"""Transfer heads as the references build them: new heads start N(0, std) with zero biases and
unit LayerNorms; answer rows copied from a trained QA head by LXMERT's converted answer string,
the others zeroed; NLVR2's pair head with 12-in-1's BCE on one-hot targets beside LXMERT's
cross-entropy; a batch's token types reach both backbones."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import ConfigError
from vl_models import families
from vl_models.families.base import Encoded
from vl_models.models.weights import copy_answer_rows, lxmert_answer_key
from vl_models.transfer.heads import KINDS, PairHead, build_head


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "retrieval"])
def test_new_heads_start_as_the_references_start_theirs(kind):
    torch.manual_seed(0)
    head = build_head(kind, 64, 48, 4, 300, 1e-12, std=0.02)
    for name, p in head.named_parameters():
        if isinstance(dict(head.named_modules())[name.rsplit(".", 1)[0]], torch.nn.LayerNorm):
            assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name
        elif name.endswith("bias"):
            assert not p.any(), name
        else:
            assert abs(p.std().item() - 0.02) < 0.004 and abs(p.mean().item()) < 0.004, name


def test_answer_rows_are_copied_as_lxmert_converts_answers_and_the_rest_zeroed():
    """load_lxmert_qa: the new answer converted (lower case, trailing period, leading article,
    ANS_CONVERT), looked up exactly in the old table; no match: weight and bias zero."""
    assert [lxmert_answer_key(a) for a in ("The man", "Two", "grey", "Dog.", "an apple", "")] == [
        "man",
        "2",
        "gray",
        "dog",
        "apple",
        "",
    ]
    old_answers = ["man", "2", "gray", "dog", "yes", "two"]
    weight, bias = torch.randn(6, 8), torch.randn(6)
    head = torch.nn.Linear(8, 6)
    new_answers = ["The man", "Two", "grey", "Dog.", "cat", "a man"]
    assert copy_answer_rows(head, weight, bias, old_answers, new_answers) == 5
    for new, old in ((0, 0), (1, 1), (2, 2), (3, 3), (5, 0)):  # "two" converts to "2": row 1, not row 5
        assert torch.equal(head.weight[new], weight[old]) and head.bias[new] == bias[old]
    assert not head.weight[4].any() and head.bias[4] == 0  # "cat": zeroed
    with pytest.raises(ConfigError, match="does not match its answer table"):
        copy_answer_rows(head, weight[:4], bias, old_answers, new_answers)


def test_the_pair_head_has_12_in_1s_bce_beside_lxmerts_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(6, 2)
    batch = {"label": torch.tensor([0, 1, 1, 0, 1, 1])}
    ce, _ = build_head("pair", 8, 8, 2, 0, 1e-12).loss(logits, batch)
    assert torch.allclose(ce, F.cross_entropy(logits, batch["label"]))
    bce, metrics = build_head("pair", 8, 8, 2, 0, 1e-12, pair_loss="bce").loss(logits, batch)
    target = F.one_hot(batch["label"], 2).float()  # task_utils.py: BCEWithLogitsLoss (mean) on one-hot targets
    assert torch.allclose(bce, F.binary_cross_entropy_with_logits(logits, target))
    assert metrics["acc"] == (logits.argmax(-1) == batch["label"]).float().mean().item()
    with pytest.raises(ConfigError, match="pair loss 'hinge'"):
        PairHead(8, loss="hinge")


@pytest.mark.parametrize("name", ["vilbert-tiny", "lxmert-tiny"])
def test_token_types_reach_the_backbone(name):
    family = families.get(families.load_config(name).model_type)
    mcfg = families.load_config(name)
    torch.manual_seed(0)
    model = family.build(mcfg).eval()
    width = mcfg.v_feature_size if hasattr(mcfg, "v_feature_size") else mcfg.visual_feat_dim
    pos = 5 if family.position == "5d" else 4
    batch = {
        "input_ids": torch.randint(1000, 2000, (2, 1, 6)),
        "attention_mask": torch.ones(2, 1, 6, dtype=torch.long),
        "visual_feats": torch.rand(2, 1, 4, width),
        "visual_pos": torch.rand(2, 1, 4, pos),
        "visual_mask": torch.ones(2, 1, 4, dtype=torch.long),
    }
    with torch.no_grad():
        plain = family.encode(model, batch)
        zeros = family.encode(model, {**batch, "token_type_ids": torch.zeros(2, 1, 6, dtype=torch.long)})
        second = family.encode(model, {**batch, "token_type_ids": torch.ones(2, 1, 6, dtype=torch.long)})
    assert isinstance(plain, Encoded) and torch.equal(plain.pooled, zeros.pooled)
    assert (plain.pooled - second.pooled).abs().max() > 1e-4
