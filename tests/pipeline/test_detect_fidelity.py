"""Detector fidelity to the reference extractors: `--preprocess detectron2` gives the input
tensor of airsplay/py-bottom-up-attention, and the `butd` policy's per-class NMS is Caffe's
(`lib/nms/cpu_nms.pyx`: +1 pixel widths, suppress at ovr >= thresh, on original-image boxes)."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import extract_args, run_cli
from PIL import Image
from torchvision.ops import nms

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.extractor import RegionFeatureExtractor, pooled_region_features
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.selection import per_class_nms_max_conf, select_regions
from pipeline.detect.config import BoxCount, SelectionConfig
from pipeline.detect.preprocess import Resize, prepare_image, preprocess
from pipeline.errors import ConfigError
from pipeline.store import FeatureStore, FeatureStoreWriter

VG = DetectorConfig()  # 600 / 1000
TINY = DetectorConfig.load("tiny")


def noise(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


# -- item 9: --preprocess detectron2 -----------------------------------------------


def fork_input(rgb: np.ndarray, min_size: int, max_size: int, pixel_mean_bgr) -> torch.Tensor:
    """What the fork feeds its backbone, step by step (demo/detectron2_mscoco_proposal_maxnms.py
    `doit`, ResizeShortestEdge.get_transform, ResizeTransform.apply_image, preprocess_image)."""
    bgr = rgb[:, :, ::-1]  # cv2.imread gives BGR
    h, w = bgr.shape[:2]
    scale = min_size * 1.0 / min(h, w)
    newh, neww = (min_size, scale * w) if h < w else (scale * h, min_size)
    if max(newh, neww) > max_size:
        scale = max_size * 1.0 / max(newh, neww)
        newh, neww = newh * scale, neww * scale
    neww, newh = int(neww + 0.5), int(newh + 0.5)
    resized = np.asarray(Image.fromarray(np.ascontiguousarray(bgr)).resize((neww, newh), Image.BILINEAR))
    image = torch.as_tensor(resized.astype("float32").transpose(2, 0, 1))
    mean = torch.tensor(pixel_mean_bgr, dtype=torch.float32).view(3, 1, 1)
    return ((image - mean) / torch.ones(3, 1, 1))[None]  # PIXEL_STD 1; batch of one: no padding


@pytest.mark.parametrize(
    "hw",
    [
        (480, 640),  # landscape
        (640, 427),  # portrait
        (500, 500),  # square
        (300, 1000),  # max_size binds: 600 x 2000 -> 300 x 1000
        (37, 53),  # a small image, upscaled
        (333, 517),  # odd sizes: x and y scales differ
        (400, 659),  # 988.5: Caffe's round() gives 988, the fork's int(x + 0.5) 989
    ],
)
def test_detectron2_input_is_the_forks_exactly(hw):
    rgb = noise(*hw)
    x, resize = prepare_image(rgb, VG, "detectron2")
    expected = fork_input(rgb, VG.min_size, VG.max_size, VG.pixel_mean_bgr)
    assert x.dtype == torch.float32 and x.shape == expected.shape
    assert torch.equal(x, expected)
    assert (resize.height, resize.width, resize.new_height, resize.new_width) == (*hw, *expected.shape[-2:])


def test_the_size_rules_differ_where_rounding_does():
    caffe, _ = prepare_image(noise(400, 659), VG, "caffe")
    d2, _ = prepare_image(noise(400, 659), VG, "detectron2")
    assert caffe.shape[-2:] == (600, 988) and d2.shape[-2:] == (600, 989)


@pytest.mark.parametrize("hw", [(480, 640), (333, 517), (37, 53), (1500, 2400)])
def test_caffe_mode_is_the_float_resize_it_always_was(hw):
    rgb = noise(*hw, seed=1)
    x, resize = prepare_image(rgb, VG, "caffe")
    old, scale = preprocess(rgb, VG)
    # Caffe: BGR float, minus the means, then a bilinear resize of the float image (no antialiasing)
    bgr = torch.from_numpy(rgb[:, :, ::-1].astype(np.float32)).permute(2, 0, 1)
    bgr = bgr - torch.tensor(VG.pixel_mean_bgr).view(3, 1, 1)
    size = (round(hw[0] * scale), round(hw[1] * scale))
    reference = F.interpolate(bgr[None], size=size, mode="bilinear", align_corners=False)
    assert torch.equal(x, old) and torch.equal(x, reference)
    assert resize.scale == scale and (resize.new_height, resize.new_width) == size


def test_unknown_preprocess_is_a_config_error():
    with pytest.raises(ConfigError, match="caffe, detectron2"):
        prepare_image(noise(10, 10), VG, "opencv")


def test_boxes_map_with_per_axis_scales_in_detectron2_mode():
    boxes = torch.tensor([[10.0, 20.0, 300.5, 200.25], [0.0, 0.0, 517.0, 333.0]])
    d2 = Resize("detectron2", 333, 517, 600, 932)
    sx, sy = 517 / 932, 333 / 600  # detector_postprocess: original / resized, per axis
    assert sx != sy
    assert torch.equal(d2.to_original(boxes), boxes * torch.tensor([sx, sy, sx, sy]))
    assert torch.equal(d2.to_resized(boxes), boxes * torch.tensor([932 / 517, 600 / 333, 932 / 517, 600 / 333]))
    caffe = Resize("caffe", 333, 517, 600, 932, scale=600 / 333)  # one scale for both axes
    assert torch.equal(caffe.to_original(boxes), boxes / (600 / 333))
    assert torch.equal(caffe.to_resized(boxes), boxes * (600 / 333))


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return VGDetector(TINY).eval()


def test_given_boxes_enter_the_detectron2_input_per_axis(tiny_model):
    rgb = noise(100, 157, seed=2)  # tiny: 128 / 224 -> 128 x 201, x and y scales differ
    given = np.array([[3, 5, 150, 90], [40.5, 10.25, 100, 99]], np.float32)
    rec = RegionFeatureExtractor(tiny_model, preprocess="detectron2")([rgb], ["a"], given_boxes=[given])[0]
    x, resize = prepare_image(rgb, TINY, "detectron2")
    with torch.no_grad():
        fmap = tiny_model.backbone(x)
        sx, sy = resize.new_width / 157, resize.new_height / 100
        expected = pooled_region_features(tiny_model, fmap, torch.from_numpy(given) * torch.tensor([sx, sy, sx, sy]))
    np.testing.assert_allclose(rec.features, expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(rec.boxes, given)  # given boxes come back as given
    caffe = RegionFeatureExtractor(tiny_model)([rgb], ["a"], given_boxes=[given])[0]
    assert not np.allclose(caffe.features, rec.features)  # the option reaches the detector


def test_detected_boxes_come_back_with_per_axis_scales(tiny_model):
    rgb = noise(100, 157, seed=3)
    ex = RegionFeatureExtractor(tiny_model, SelectionConfig("butd", BoxCount(5, 5)), preprocess="detectron2")
    rec = ex([rgb], ["a"])[0]
    x, resize = prepare_image(rgb, TINY, "detectron2")
    with torch.no_grad():
        proposals = ex.proposals(tiny_model.backbone(x), resize.new_height, resize.new_width)
    sx, sy = 157 / resize.new_width, 100 / resize.new_height
    original = (proposals * torch.tensor([sx, sy, sx, sy])).numpy()
    for box in rec.boxes:  # each kept box is a proposal mapped back per axis
        assert (np.abs(original - box).max(axis=1) == 0).any()


def test_a_resumed_extract_with_another_preprocess_is_refused(tmp_path):
    from pipeline.detect.run import ExtractConfig, run_extract

    (tmp_path / "imgs").mkdir()
    for name, prov in (("d2", {"preprocess": "detectron2"}), ("old", {})):  # old: made before the option: caffe
        with FeatureStoreWriter(
            tmp_path / name,
            feature_dim=TINY.res5_channels,
            provenance={"detector": "tiny", "weights_sha256": "random-seed-0", **prov},
        ):
            pass
    cfg = ExtractConfig(out=tmp_path / "d2", images=tmp_path / "imgs", random_weights=True, detector="tiny")
    assert cfg.preprocess == "caffe" and cfg.to_json()["preprocess"] == "caffe"
    with pytest.raises(ConfigError, match="--preprocess detectron2"):
        run_extract(cfg)
    cfg = ExtractConfig(
        out=tmp_path / "old", images=tmp_path / "imgs", random_weights=True, detector="tiny", preprocess="detectron2"
    )
    assert cfg.to_json()["preprocess"] == "detectron2"
    with pytest.raises(ConfigError, match="--preprocess caffe"):
        run_extract(cfg)
    with pytest.raises(ConfigError, match="preprocess must be one of caffe, detectron2"):
        ExtractConfig(out=tmp_path / "x", images=tmp_path / "imgs", random_weights=True, preprocess="cv2")


@pytest.mark.slow
def test_extract_records_the_preprocess_mode(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i, hw in enumerate([(100, 157), (90, 60)]):
        Image.fromarray(noise(*hw, seed=i)).save(folder / f"img{i}.png")
    proc = run_cli(*extract_args(tmp_path / "d2", images=folder, boxes=4, workers=1, preprocess="detectron2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_cli(*extract_args(tmp_path / "caffe", images=folder, boxes=4, workers=1))
    assert proc.returncode == 0, proc.stderr[-3000:]
    d2, caffe = FeatureStore.open(tmp_path / "d2"), FeatureStore.open(tmp_path / "caffe")
    assert d2.manifest.provenance["preprocess"] == "detectron2"
    assert d2.manifest.provenance["config"]["preprocess"] == "detectron2"
    assert caffe.manifest.provenance["preprocess"] == "caffe"
    assert not np.array_equal(d2.get("img0").features, caffe.get("img0").features)
    proc = run_cli(
        *extract_args(tmp_path / "d2", images=folder, boxes=4, workers=1)
    )  # resuming with the default caffe resize
    assert proc.returncode == 2 and "--preprocess detectron2" in proc.stderr
    assert json.loads((tmp_path / "d2" / "manifest.json").read_text())["provenance"]["preprocess"] == "detectron2"


# -- item 10: the butd policy's NMS is Caffe's ---------------------------------------


def caffe_nms(boxes: np.ndarray, scores: np.ndarray, thresh: float) -> list[int]:
    """lib/nms/cpu_nms.pyx `cpu_nms`, as written: float32 arithmetic, +1 pixel widths and
    heights, greedy in descending score order, suppress when ovr >= thresh (a double)."""
    x1, y1, x2, y2 = (boxes[:, k].astype(np.float32) for k in range(4))
    one, zero = np.float32(1), np.float32(0)
    areas = (x2 - x1 + one) * (y2 - y1 + one)
    order = np.argsort(-scores, kind="stable")  # the tests use distinct scores
    suppressed = np.zeros(len(boxes), bool)
    keep = []
    for rank, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(int(i))
        for j in order[rank + 1 :]:
            if suppressed[j]:
                continue
            w = max(zero, min(x2[i], x2[j]) - max(x1[i], x1[j]) + one)
            h = max(zero, min(y2[i], y2[j]) - max(y1[i], y1[j]) + one)
            inter = w * h
            ovr = inter / (areas[i] + areas[j] - inter)
            if float(ovr) >= thresh:
                suppressed[j] = True
    return keep


def caffe_max_conf(boxes: np.ndarray, probs: np.ndarray, thresh: float) -> np.ndarray:
    """tools/generate_tsv.py: each box's best score among the classes whose NMS keeps it."""
    max_conf = np.zeros(len(boxes))
    for c in range(probs.shape[1]):
        keep = np.array(caffe_nms(boxes, probs[:, c], thresh))
        max_conf[keep] = np.maximum(max_conf[keep], probs[keep, c])
    return max_conf


def torchvision_max_conf(boxes: torch.Tensor, probs: torch.Tensor, thresh: float) -> np.ndarray:
    out = torch.zeros(len(boxes))
    for c in range(probs.shape[1]):
        keep = nms(boxes, probs[:, c], thresh)
        out[keep] = torch.maximum(out[keep], probs[keep, c])
    return out.double().numpy()


def test_per_class_nms_is_caffes_on_boxes_near_the_threshold():
    g = torch.Generator().manual_seed(0)
    xy = torch.randint(0, 40, (80, 2), generator=g).float()
    boxes = torch.cat([xy, xy + torch.randint(2, 20, (80, 2), generator=g)], 1)
    boxes[::3] += 0.5  # some half pixels too
    probs = torch.rand(80, 30, generator=g) ** 4
    expected = caffe_max_conf(boxes.numpy(), probs.numpy(), 0.3)
    assert not np.array_equal(expected, torchvision_max_conf(boxes, probs, 0.3))  # the two rules part here
    np.testing.assert_array_equal(per_class_nms_max_conf(boxes, probs, 0.3).double().numpy(), expected)


def test_a_pair_across_the_threshold_and_its_knock_on():
    # A-B: plain IoU 0.259 (kept), +1 IoU 0.307 (suppressed). B-C: IoU 0.385, so with B gone
    # Caffe keeps C, which the plain rule suppresses: one box each way.
    boxes = torch.tensor([[0, 0, 9, 9], [5.3, 0, 14.3, 9], [9.3, 0, 18.3, 9]])
    probs = torch.tensor([[0.9], [0.8], [0.7]])
    np.testing.assert_allclose(torchvision_max_conf(boxes, probs, 0.3), [0.9, 0.8, 0.0], rtol=1e-6)
    expected = caffe_max_conf(boxes.numpy(), probs.numpy(), 0.3)
    np.testing.assert_allclose(expected, [0.9, 0.0, 0.7], rtol=1e-6)
    np.testing.assert_array_equal(per_class_nms_max_conf(boxes, probs, 0.3).double().numpy(), expected)


@pytest.mark.parametrize(
    "thresh, small",
    [
        (0.5, [0, 0, 9, 4]),  # +1 areas 50 / 100: ovr is exactly 0.5
        (0.3, [0, 0, 4, 5]),  # 30 / 100: ovr is float32(0.3), above the double 0.3 Caffe compares with
    ],
)
def test_an_overlap_equal_to_the_threshold_suppresses(thresh, small):
    boxes = torch.tensor([[0, 0, 9, 9], small], dtype=torch.float32)
    probs = torch.tensor([[0.9], [0.8]])
    assert caffe_nms(boxes.numpy(), probs[:, 0].numpy(), thresh) == [0]
    np.testing.assert_allclose(per_class_nms_max_conf(boxes, probs, thresh).numpy(), [0.9, 0.0])


def test_butd_nms_runs_on_original_image_boxes():
    # original pixels: +1 IoU 0.307 (B suppressed); twice as large (the resized image) it would be 0.284
    original = torch.tensor([[0, 0, 9, 9], [5.3, 0, 14.3, 9], [30, 30, 39, 39]])
    probs = torch.tensor([[0.05, 0.9, 0.05], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])  # background first
    assert caffe_nms(original.numpy(), probs[:, 1].numpy(), 0.3) == [0, 2]
    assert caffe_nms((original * 2).numpy(), probs[:, 1].numpy(), 0.3) == [0, 1, 2]
    selection = SelectionConfig("butd", BoxCount(1, 10))
    deltas = torch.zeros(3, 8)
    for resize in (Resize("caffe", 300, 400, 600, 800, scale=2.0), Resize("detectron2", 300, 400, 600, 800)):
        proposals = resize.to_resized(original)
        keep, boxes = select_regions(selection, proposals, probs, deltas, resize, TINY.bbox_reg_weights)
        assert keep.tolist() == [0, 2]
        torch.testing.assert_close(boxes, original[[0, 2]])


def test_the_box_policy_names_the_caffe_nms_rule():
    """A store extracted under the earlier NMS rule (no "+1px" in its box_policy identity) is
    not appended to under Caffe's rule: the two would mix in one store."""

    from pipeline.detect.backends.butd_c4.config import DEFAULT_SELECTION

    assert DEFAULT_SELECTION.describe() == "butd boxes=10-100, conf>=0.2, nms=0.3 +1px"
    assert SelectionConfig().resolved(DEFAULT_SELECTION) == DEFAULT_SELECTION
