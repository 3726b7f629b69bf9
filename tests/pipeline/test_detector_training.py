import numpy as np
import torch
from detector_layouts import two_box_scene

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.training import detection_losses


def test_losses_are_finite_and_training_reduces_them():
    torch.manual_seed(0)
    cfg = DetectorConfig.load("tiny")
    model = VGDetector(cfg).train()
    rng = np.random.default_rng(0)
    data = [two_box_scene(rng) for _ in range(4)]
    images, targets = [d[0] for d in data], [d[1] for d in data]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    history = []
    for step in range(40):
        losses = detection_losses(model, images, targets, rpn_batch=64, roi_batch=32, seed=step)
        total = sum(losses.values())
        assert torch.isfinite(total)
        opt.zero_grad()
        total.backward()
        opt.step()
        history.append({k: float(v.detach()) for k, v in losses.items()})
    first = np.mean([sum(h.values()) for h in history[:5]])
    last = np.mean([sum(h.values()) for h in history[-5:]])
    assert last < 0.6 * first, (first, last)
    assert history[-1]["cls"] < history[0]["cls"] and history[-1]["attr"] < history[0]["attr"]
    # the frozen norms really are frozen
    assert not model.backbone.stem.conv1.norm.weight.requires_grad
