"""The region detectors' fast CPU path (`pipeline.detect.cpu`): the ROI head in oneDNN over units of
proposals on worker threads. Its outputs are the modules' within float rounding, the same bits at
any thread count, and a region's feature depends on its own box alone."""

import numpy as np
import pytest
import torch
from torchvision.ops import roi_pool

from pipeline.detect import cpu
from pipeline.detect.backends import open_extractor
from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.extractor import pooled_region_features
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.config import BoxCount, SelectionConfig
from pipeline.detect.resnet import make_stage

TINY = DetectorConfig.load("tiny")


def pictures() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, hw + (3,), dtype=np.uint8) for hw in ((120, 160), (150, 100), (96, 96))]


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = VGDetector(TINY).eval()
    with torch.no_grad():  # decisive random predictions, O(1) features (as bench/extract.py's random_detector)
        for module in model.modules():
            if hasattr(module, "shortcut") and module.shortcut is not None:
                module.shortcut.norm.weight.fill_(1.0)
    return model


def head_of(model: VGDetector) -> cpu.RoiHead:
    cfg = model.cfg
    return cpu.RoiHead(
        model.roi_heads.res5,
        cfg.res4_channels,
        cfg.pooler_resolution,
        lambda fmap, boxes: roi_pool(fmap, [boxes], cfg.pooler_resolution, 1.0 / cfg.feature_stride),
    )


def boxes_and_map(model: VGDetector, count: int = 23, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    fmap = torch.randn(1, model.cfg.res4_channels, 9, 12, generator=gen).clamp_min(0)
    xy = torch.rand(count, 2, generator=gen) * torch.tensor([150.0, 110.0])
    wh = 4 + torch.rand(count, 2, generator=gen) * 60
    return fmap, torch.cat([xy, xy + wh], dim=1)


def test_the_head_is_the_modules_within_float_rounding(tiny):
    fmap, boxes = boxes_and_map(tiny)
    with torch.no_grad():
        expected = pooled_region_features(tiny, fmap, boxes)
    got = head_of(tiny)(fmap, boxes, threads=2)
    assert got.shape == expected.shape == (23, TINY.res5_channels)
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5


def test_a_regions_feature_depends_on_its_own_box_alone(tiny):
    """Units always hold `UNIT` maps, so neither the other proposals nor their order nor their
    number touch a region's bits."""
    fmap, boxes = boxes_and_map(tiny)
    head = head_of(tiny)
    whole = head(fmap, boxes, threads=1)
    order = torch.randperm(len(boxes), generator=torch.Generator().manual_seed(3))
    assert torch.equal(head(fmap, boxes[order], threads=1), whole[order])
    assert torch.equal(head(fmap, boxes[:3], threads=1), whole[:3])
    assert torch.equal(head(fmap, boxes[17:18], threads=1), whole[17:18])
    assert head(fmap, boxes[:0], threads=1).shape == (0, TINY.res5_channels)


@pytest.mark.parametrize("threads", [2, 3])
def test_the_head_gives_the_same_bits_at_any_thread_count(tiny, threads):
    fmap, boxes = boxes_and_map(tiny, count=41)
    head = head_of(tiny)
    before = torch.get_num_threads()
    assert torch.equal(head(fmap, boxes, threads=threads), head(fmap, boxes, threads=1))
    assert torch.get_num_threads() == before  # the caller's count is left as it was


def test_the_head_follows_changed_weights(tiny):
    fmap, boxes = boxes_and_map(tiny, count=5)
    model = VGDetector(TINY).eval()
    model.load_state_dict(tiny.state_dict())
    head = head_of(model)
    first = head(fmap, boxes, threads=1)
    with torch.no_grad():
        model.roi_heads.res5[0].conv2.weight.mul_(1.5)  # in place: the prepared weights are stale
        expected = pooled_region_features(model, fmap, boxes)
    changed = head(fmap, boxes, threads=1)
    assert not torch.equal(changed, first)
    assert float((changed - expected).abs().max() / expected.abs().max()) < 1e-5


def test_without_onednn_the_folded_convolutions_run_as_thread_invariantly(tiny, monkeypatch):
    fmap, boxes = boxes_and_map(tiny)
    fused = head_of(tiny)(fmap, boxes, threads=1)
    monkeypatch.setattr(cpu, "onednn", lambda: False)
    head = head_of(tiny)
    plain = head(fmap, boxes, threads=1)
    assert float((plain - fused).abs().max() / fused.abs().max()) < 1e-5
    assert torch.equal(head(fmap, boxes, threads=2), plain)


@pytest.mark.parametrize("stride,groups,dilation", [(2, 4, 1), (1, 1, 2), (2, 1, 1)])
def test_fused_blocks_are_the_stage(stride, groups, dilation):
    """Strided (in the 3x3, as ResNeXt; or in the 1x1), grouped and dilated stages, with a
    projection shortcut and without."""
    torch.manual_seed(stride + groups)
    stage = make_stage(2, 16, 8, 32, stride, dilation, stride_in_1x1=groups == 1, groups=groups).eval()
    for module in stage.modules():  # non-trivial frozen norms
        if hasattr(module, "running_var"):
            module.running_var.uniform_(0.5, 2.0)
            module.running_mean.uniform_(-0.2, 0.2)
            module.bias.uniform_(-0.1, 0.1)
    x = torch.randn(3, 16, 14, 14).clamp_min(0)
    with torch.no_grad():
        expected = stage(x)
    got = cpu.FusedBlocks(list(stage), (3, 16, 14, 14))(x)
    assert got.shape == expected.shape
    assert float((got - expected).abs().max() / expected.abs().max()) < 1e-5


def test_workers_keep_the_order_and_hand_errors_back():
    assert cpu.run_units(lambda i: i * i, list(range(7)), threads=3) == [i * i for i in range(7)]
    assert cpu.run_units(lambda i: torch.get_num_threads(), [0, 1, 2], threads=2) == [1, 1, 1]

    def fail(i):
        if i == 4:
            raise ValueError("unit 4")
        return i

    with pytest.raises(ValueError, match="unit 4"):
        cpu.run_units(fail, list(range(6)), threads=2)
    assert cpu.run_units(lambda i: i, [1, 2], threads=2) == [1, 2]  # the pool still serves


@pytest.mark.parametrize(
    "detector,selection",
    [
        ("tiny", SelectionConfig("butd", BoxCount(5, 20))),
        ("tiny", SelectionConfig("maxnms", BoxCount(8, 8))),
        ("vinvl-tiny", None),
        ("vinvl-tiny", SelectionConfig("per-class", regression=True)),
    ],
)
def test_extractors_give_the_same_bits_at_any_thread_count(detector, selection):
    images = pictures()
    ids = [f"im{i}" for i in range(len(images))]
    given = [np.array([[3, 4, 90, 70], [20, 10, 60, 95]], np.float32)] * len(images)
    runs = {}
    for threads in (1, 2, 3):
        ex = open_extractor(detector, seed=0, selection=selection, threads=threads)
        assert ex.thread_invariant and ex.threads == threads
        runs[threads] = ex(images, ids) + ex(images, ids, given_boxes=given)
    for threads in (2, 3):
        for one, other in zip(runs[1], runs[threads]):
            for field, value in one.array_fields().items():
                assert np.array_equal(getattr(other, field), value), (threads, one.image_id, field)


def test_the_torch_kernels_stay_available_and_a_gpu_never_takes_the_fast_path():
    ex = open_extractor("tiny", seed=0, kernels="torch")
    assert not ex.thread_invariant
    with pytest.raises(ValueError, match="kernels must be one of fast, torch"):
        open_extractor("tiny", seed=0, kernels="onednn")
    with pytest.raises(ValueError, match="threads must be >= 1"):
        open_extractor("tiny", seed=0, threads=0)
