"""The committed shapes-world detector (pipeline/detect/backends/butd_c4/weights_data/shapes-tiny.*), its
recipe (workflows/shapes/shapes_detector.py) and the training extensions behind it (several
attributes per box, saving in the d2 layout)."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from detector_layouts import two_box_scene

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.training import DetectionTarget, attribute_loss, detection_losses
from pipeline.detect.backends.butd_c4.weights import load_detector, save_detector, shapes_tiny_weights
from pipeline.io import sha256_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflows" / "shapes"))  # as its scripts import it
from shapes_detector import evaluate_shapes_detector, shapes_scenes, shapes_target  # noqa: E402

SHAPES = DetectorConfig.load("shapes-tiny")


def test_committed_weights_match_their_digest_and_size():
    path = shapes_tiny_weights()
    recorded = path.with_suffix(".sha256").read_text().split()[0]
    assert sha256_file(path) == recorded
    assert path.stat().st_size <= 5 * 1024 * 1024
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["sha256"] == recorded and record["config"] == "shapes-tiny"
    assert record["evaluation"]["recall"] >= 0.9
    assert "train_detector.py" in record["command"]
    for vocab in ("objects_shapes.txt", "attributes_shapes.txt"):
        assert (path.parent / vocab).exists()


def test_committed_weights_load_strictly():
    model, report = load_detector(shapes_tiny_weights(), SHAPES)
    assert report.layout == "d2-pickle" and report.attributes
    assert report.identity_norm_stats == 0 and report.dropped == []
    assert model.cfg == SHAPES
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())


def test_shapes_config_sizes_for_256_px_images():
    assert (SHAPES.num_classes, SHAPES.num_attributes) == (5, 12)
    assert SHAPES.min_size < 600 and DetectorConfig.load("vg-r101").min_size == 600
    assert DetectorConfig.load("vg-r101").max_size == 1000


def test_recall_on_held_out_scenes():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: one thread is as fast, and immune to a busy machine
    try:
        result = evaluate_shapes_detector(shapes_tiny_weights(), n_images=20, seed=2024)
    finally:
        torch.set_num_threads(threads)
    assert result["images"] == 20 and result["objects"] > 20
    assert result["recall"] >= 0.9, result
    assert 0.0 <= result["class_accuracy"] <= 1.0 and 0.0 <= result["attribute_accuracy"] <= 1.0


def test_shapes_targets_carry_three_attributes():
    target = shapes_target(shapes_scenes(0, 1)[0])
    n = len(target.boxes)
    assert target.attributes.shape == (n, 3) and target.classes.shape == (n,)
    assert target.attributes[:, 0].max() <= 8 and (target.attributes[:, 1] - 8).min() >= 1
    assert set(target.attributes[:, 2]) <= {11, 12} and target.classes.min() >= 1 and target.classes.max() <= 5


def test_attribute_loss_several_per_box():
    torch.manual_seed(0)
    logits = torch.randn(3, 6)
    attrs = torch.tensor([[2, 4, 0], [5, 0, 0], [0, 0, 0]])
    logp = F.log_softmax(logits, dim=1)
    expected = ((-(logp[0, 2] + logp[0, 4]) / 2) - logp[1, 5] - logp[2, 0]) / 3
    torch.testing.assert_close(attribute_loss(logits, attrs), expected)
    # (N, 1) is the 1-D loss; the 1-D path is plain cross-entropy (0 = "no attribute" is a label)
    one = torch.tensor([3, 0, 1])
    torch.testing.assert_close(attribute_loss(logits, one[:, None]), F.cross_entropy(logits, one))
    assert torch.equal(attribute_loss(logits, one), F.cross_entropy(logits, one))


def test_detection_losses_with_one_and_several_attributes():
    cfg = DetectorConfig.load("tiny")
    torch.manual_seed(0)
    model = VGDetector(cfg).train()
    rng = np.random.default_rng(0)
    one = [two_box_scene(rng, 1) for _ in range(2)]
    flat = [DetectionTarget(t.boxes, t.classes, t.attributes[:, 0]) for _, t in one]
    images = [img for img, _ in one]
    a = detection_losses(model, images, flat, rpn_batch=64, roi_batch=32, seed=1)
    b = detection_losses(model, images, [t for _, t in one], rpn_batch=64, roi_batch=32, seed=1)
    for key in a:  # (N,) and (N, 1) attributes: the same losses
        torch.testing.assert_close(a[key], b[key])
    rng = np.random.default_rng(0)
    three = [two_box_scene(rng, 3) for _ in range(2)]
    c = detection_losses(model, [img for img, _ in three], [t for _, t in three], rpn_batch=64, roi_batch=32, seed=1)
    assert all(torch.isfinite(v) for v in c.values()) and c["attr"] > 0
    c["attr"].backward()
    assert model.roi_heads.box_predictor.attr_score.weight.grad.abs().sum() > 0


def test_save_detector_round_trips_through_the_d2_loader(tmp_path):
    cfg = DetectorConfig.load("tiny")
    torch.manual_seed(1)
    model = VGDetector(cfg)
    digest = save_detector(model, tmp_path / "m.pkl")
    assert digest == sha256_file(tmp_path / "m.pkl")
    loaded, report = load_detector(tmp_path / "m.pkl", cfg)
    assert report.layout == "d2-pickle"
    for (k, v), (_, w) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(v, w), k
    assert save_detector(loaded, tmp_path / "again.pkl") == digest


@pytest.mark.parametrize("name", ["shapes-tiny"])
def test_named_config_round_trips(name):
    cfg = DetectorConfig.load(name)
    assert DetectorConfig.from_json(cfg.to_json()) == cfg
