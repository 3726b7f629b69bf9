import pytest
import torch
from torch import nn

from vl_models.train.optim import BertAdam, lr_at, make_optimizer, param_groups


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(3, 2)
        self.LayerNorm = nn.LayerNorm(2)


def test_decay_groups_and_schedule():
    decay, no_decay = param_groups(Tiny(), 0.01)
    assert [p.shape for p in decay["params"]] == [(2, 3)] and len(no_decay["params"]) == 3
    assert no_decay["weight_decay"] == 0.0
    assert [lr_at(s, 1.0, 4, 12) for s in (0, 1, 3, 4, 8, 12)] == [0.0, 0.25, 0.75, 1.0, 0.5, 0.0]


def _first_step(name: str):
    """(model, its parameters before, the gradients, the first-step Adam direction without
    bias correction) after one step of optimizer `name` (lr 0.1, decay 0.01) on random gradients."""
    torch.manual_seed(0)
    model = Tiny()
    opt = make_optimizer(model, name, lr=0.1, weight_decay=0.01)
    assert isinstance(opt, BertAdam)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = grads[n].clone()
    opt.step()
    direction = {n: 0.1 * g / ((0.001 * g**2).sqrt() + 1e-6) for n, g in grads.items()}  # m / (sqrt(v) + eps)
    return model, before, direction


def test_bertadam_has_no_bias_correction_and_decays_everything():
    model, before, direction = _first_step("bertadam")
    for n, p in model.named_parameters():
        expected = before[n] - 0.1 * (direction[n] + 0.01 * before[n])
        torch.testing.assert_close(p.detach(), expected)  # biases and LayerNorm decayed too


def test_fused_adamw_matches_the_reference_loop():
    torch.manual_seed(0)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    fused = make_optimizer(a, "adamw", lr=0.01, weight_decay=0.01)
    loop = torch.optim.AdamW(param_groups(b, 0.01), lr=0.01, eps=1e-6, foreach=False)
    for _ in range(3):
        x = torch.randn(4, 3)
        for model, opt in ((a, fused), (b, loop)):
            model.LayerNorm(model.dense(x)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q)


def test_learning_rate_scales_split_the_groups():
    """12-in-1 trains its ``vil_*`` heads at their own learning rate: a per-parameter scale
    splits the groups (decay kept apart), and the plain groups keep their place and order."""
    model = nn.Sequential(Tiny(), Tiny())
    groups = param_groups(model, 0.01, scale_of=lambda name: 5.0 if name.startswith("1.") else 1.0)
    assert [(g["lr_scale"], g["weight_decay"], len(g["params"])) for g in groups] == [
        (1.0, 0.01, 1),
        (1.0, 0.0, 3),
        (5.0, 0.01, 1),
        (5.0, 0.0, 3),
    ]
    opt = make_optimizer(model, "adamw", lr=0.1, weight_decay=0.01, scale_of=lambda n: 5.0 if n[0] == "1" else 1.0)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.1, 0.5, 0.5]
    bert = make_optimizer(model, "bertadam", lr=0.1, weight_decay=0.01, scale_of=lambda n: 5.0 if n[0] == "1" else 1.0)
    got = [(g["lr"], g["weight_decay"], len(g["params"])) for g in bert.param_groups]
    assert got == [(0.1, 0.01, 4), (0.5, 0.01, 4)]
    plain = make_optimizer(model, "bertadam", lr=0.1, weight_decay=0.01)
    assert len(plain.param_groups) == 1  # as before: a pretraining run's saved optimizer state still loads


def test_uncorrected_adamw_is_12in1s():
    """12-in-1's ``AdamW(correct_bias=False)``: no bias correction, decay after the step and
    not on biases / LayerNorm."""
    model, before, direction = _first_step("adamw-uncorrected")
    for n, p in model.named_parameters():
        stepped = before[n] - 0.1 * direction[n]
        expected = stepped * (1 - 0.1 * 0.01) if n == "dense.weight" else stepped
        torch.testing.assert_close(p.detach(), expected)


def test_schedule_is_the_references_warmup_linear():
    """`lr_at` is transformers' ``get_linear_schedule_with_warmup`` (pytorch-transformers'
    ``WarmupLinearSchedule``, which vilbert-multi-task steps once per update from 0): the first
    warm-up step at 0, not at lr / warmup."""
    from transformers import get_linear_schedule_with_warmup

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=7, num_training_steps=30)
    for step in range(32):
        assert lr_at(step, 1.0, 7, 30) == pytest.approx(optimizer.param_groups[0]["lr"], abs=1e-12), step
        optimizer.step()
        schedule.step()
