import numpy as np
import torch

from pipeline.detect.config import DetectorConfig
from pipeline.detect.model import VGDetector
from pipeline.detect.training import DetectionTarget, detection_losses


def scene(rng):
    img = np.full((160, 200, 3), 235, np.uint8)
    boxes, classes, attrs = [], [], []
    for cls, color in ((1, (220, 30, 30)), (2, (30, 30, 220))):
        x1, y1 = rng.integers(0, 110), rng.integers(0, 80)
        w, h = rng.integers(40, 80), rng.integers(40, 70)
        img[y1:y1 + h, x1:x1 + w] = color
        boxes.append([x1, y1, x1 + w, y1 + h])
        classes.append(cls)
        attrs.append(cls)  # attribute "red" / "blue"
    return img, DetectionTarget(np.array(boxes, np.float32), np.array(classes), np.array(attrs))


def test_losses_are_finite_and_training_reduces_them():
    torch.manual_seed(0)
    cfg = DetectorConfig.load("tiny")
    model = VGDetector(cfg).train()
    rng = np.random.default_rng(0)
    data = [scene(rng) for _ in range(4)]
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
