"""Fine-tuning parity with transformers: our VQA transfer model (LXMERT backbone + answer
head, built by `build_transfer_model` as `vltrain finetune` builds it) and
`transformers.LxmertForQuestionAnswering` holding the same weights give the same answer
logits. The key mapping is `bench/finetune_step.py`'s (so the benchmark times equal models)."""

import importlib.util
from dataclasses import replace

import torch
from helpers import REPO

from vl_models.families import load_config

_spec = importlib.util.spec_from_file_location("finetune_step", REPO / "bench" / "finetune_step.py")
finetune_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(finetune_step)

ANSWERS = 11


def test_vqa_answer_logits_match_transformers():
    torch.manual_seed(0)
    mcfg = replace(load_config("lxmert-tiny"), name="lxmert-parity")
    ours, hf = finetune_step.build_pair(mcfg, ANSWERS, "cpu")
    with torch.no_grad():  # make every parameter matter (biases start at zero, LayerNorms at one)
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    state = finetune_step.hf_qa_state_dict(ours, "vqa")
    assert set(state) == set(hf.state_dict())
    hf.load_state_dict(state, strict=True)
    assert hf.config.hidden_size == 32 and hf.config.num_qa_labels == ANSWERS
    ours.eval()
    hf.eval()
    batch = finetune_step.vqa_batch(3, 9, 7, ANSWERS, mcfg, "cpu", seed=1)
    batch["visual_mask"][0, 0, 5:] = 0  # padded regions too
    assert (batch["attention_mask"] == 0).any()  # and padded questions
    with torch.no_grad():
        got = ours("vqa", batch)
        ref = finetune_step.hf_qa_scores(hf, batch)
    assert got.shape == ref.shape == (3, ANSWERS)
    assert (got - ref).abs().max() <= 1e-5
    assert torch.allclose(finetune_step.ours_loss(ours, batch), finetune_step.hf_loss(hf, batch), atol=1e-5)
