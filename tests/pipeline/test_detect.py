import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch
from detector_layouts import published_shapes, random_weights, write_d2_pickle, write_hf_bin
from image_server import make_corpus

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.extractor import RegionFeatureExtractor, backbone_groups
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.selection import per_class_nms_max_conf, select_butd, select_maxnms
from pipeline.detect.backends.butd_c4.weights import load_detector, save_detector_hf
from pipeline.detect.boxes import decode, encode
from pipeline.detect.config import BoxCount, SelectionConfig
from pipeline.detect.preprocess import butd_scale, prepare_image, preprocess
from pipeline.errors import ConfigError
from pipeline.images import load_rgb
from pipeline.io import sha256_file
from pipeline.records import validate_record

TINY = DetectorConfig.load("tiny")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("weights")
    weights = random_weights(TINY, seed=3)
    write_d2_pickle(root / "tiny.pkl", weights)
    write_hf_bin(root / "tiny.bin", weights, TINY)
    return root, weights


def images():
    rng = np.random.default_rng(0)
    base = load_rgb(make_corpus()["big.jpg"][0])
    return [
        base,
        rng.integers(0, 255, (90, 300, 3), dtype=np.uint8),
        rng.integers(0, 255, (260, 140, 3), dtype=np.uint8),
    ]


def test_both_published_layouts_load_into_the_same_model(tiny_files):
    root, weights = tiny_files
    d2, d2_report = load_detector(root / "tiny.pkl", TINY)
    hf, hf_report = load_detector(root / "tiny.bin", TINY)
    assert (d2_report.layout, hf_report.layout) == ("d2-pickle", "hf-bin")
    assert len(hf_report.dropped) == len(d2_report.dropped) + sum(k.endswith("running_var") for k in weights) + 1
    for (k, a), (_, b) in zip(d2.state_dict().items(), hf.state_dict().items()):
        assert torch.equal(a, b), k
    # background (last in the file) becomes class 0
    cls = d2.roi_heads.box_predictor.cls_score.weight.detach().numpy()
    np.testing.assert_array_equal(cls[0], weights["roi_heads.box_predictor.cls_score.weight"][-1])
    np.testing.assert_array_equal(cls[1:], weights["roi_heads.box_predictor.cls_score.weight"][:-1])
    attr = d2.roi_heads.box_predictor.attr_score.bias.detach().numpy()
    assert attr[0] == weights["roi_heads.box_predictor.attr_score.bias"][-1]
    a = RegionFeatureExtractor(d2, SelectionConfig("butd", BoxCount(10, 20)))(images(), ["a", "b", "c"])
    b = RegionFeatureExtractor(hf, SelectionConfig("butd", BoxCount(10, 20)))(images(), ["a", "b", "c"])
    for ra, rb in zip(a, b):
        np.testing.assert_array_equal(ra.features, rb.features)
        np.testing.assert_array_equal(ra.boxes, rb.boxes)
        validate_record(ra)


def test_cls_prob_background_is_column_zero(tiny_files):
    root, weights = tiny_files
    model, _ = load_detector(root / "tiny.pkl", TINY)
    ex = RegionFeatureExtractor(model)
    rec = ex(images()[:1], ["a"], given_boxes=[np.array([[10, 10, 200, 150]], np.float32)])[0]
    w = weights["roi_heads.box_predictor.cls_score.weight"]
    bias = weights["roi_heads.box_predictor.cls_score.bias"]
    logits = rec.features.astype(np.float64) @ w.T + bias  # d2 order: background last
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(rec.cls_prob[0, 0], probs[0, -1], rtol=1e-4)
    np.testing.assert_allclose(rec.cls_prob[0, 1:], probs[0, :-1], rtol=1e-4)
    assert rec.objects_id[0] == probs[0, :-1].argmax()


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda w: w.pop("backbone.res3.0.conv2.weight"), "missing: backbone.res3.0.conv2.weight"),
        (
            lambda w: w.__setitem__("roi_heads.extra.weight", np.zeros(3, np.float32)),
            "unexpected: roi_heads.extra.weight",
        ),
        (
            lambda w: w.__setitem__("roi_heads.box_predictor.bbox_pred.bias", np.zeros(7, np.float32)),
            "misshaped: roi_heads.box_predictor.bbox_pred.bias",
        ),
    ],
)
def test_key_mismatches_are_clear_errors(tmp_path, change, words):
    weights = random_weights(TINY)
    change(weights)
    write_d2_pickle(tmp_path / "w.pkl", weights)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        load_detector(tmp_path / "w.pkl", TINY)


def test_weights_file_problems(tmp_path):
    with pytest.raises(ConfigError, match="airsplay/py-bottom-up-attention"):
        load_detector(tmp_path / "missing.pkl", TINY)
    import os

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    (tmp_path / "evil.pkl").write_bytes(pickle.dumps({"model": {"x": Evil()}}))
    with pytest.raises(ConfigError, match="refused to load posix.system"):
        load_detector(tmp_path / "evil.pkl", TINY)


def test_checkpoint_without_attribute_head(tmp_path):
    write_d2_pickle(tmp_path / "noattr.pkl", random_weights(TINY, attributes=False))
    model, report = load_detector(tmp_path / "noattr.pkl", TINY)
    assert not report.attributes and model.cfg.num_attributes == 0
    rec = RegionFeatureExtractor(model)(images()[:1], ["a"])[0]
    assert rec.attr_prob is None and rec.attrs_id is None and rec.cls_prob is not None


def test_missing_running_stats_mean_identity(tmp_path):
    weights = {k: v for k, v in random_weights(TINY).items() if not k.endswith(("running_mean", "running_var"))}
    write_d2_pickle(tmp_path / "folded.pkl", weights)
    model, report = load_detector(tmp_path / "folded.pkl", TINY)
    assert report.identity_norm_stats == 2 * sum(k.endswith(".norm.weight") for k in weights)
    assert torch.equal(model.backbone.stem.conv1.norm.running_var, torch.ones(TINY.stem_channels))


def test_full_vg_config_loads_full_shape_weights(tmp_path):
    cfg = DetectorConfig.load("vg-r101")
    shapes = published_shapes(cfg)
    assert shapes["roi_heads.box_predictor.cls_score.weight"] == (1601, 2048)
    assert shapes["roi_heads.box_predictor.bbox_pred.weight"] == (6400, 2048)
    assert shapes["roi_heads.box_predictor.fc_attr.weight"] == (512, 2304)
    assert shapes["proposal_generator.rpn_head.anchor_deltas.weight"] == (48, 512, 1, 1)
    assert sum(k.endswith(".weight") and len(s) == 4 and "rpn" not in k for k, s in shapes.items()) == 104
    write_d2_pickle(tmp_path / "faster_rcnn_from_caffe_attr.pkl", random_weights(cfg))
    # Every weight at its published shape; the forward on a small input with 40 proposals (the
    # ROI head's res5 runs per proposal: 300 at 600 x 800 take ~20 s on one CPU thread).
    small = replace(cfg, rpn_post_nms_topk=40, min_size=200, max_size=333)
    model, report = load_detector(tmp_path / "faster_rcnn_from_caffe_attr.pkl", small)
    assert report.tensors == 535 and len(report.sha256) == 64
    img = load_rgb(make_corpus()["big.jpg"][0])
    rec = RegionFeatureExtractor(model, SelectionConfig("butd", BoxCount(36, 36)))([img], ["x"])[0]
    assert rec.features.shape == (36, 2048) and rec.cls_prob.shape == (36, 1601) and rec.attr_prob.shape == (36, 401)
    validate_record(rec, feature_dim=2048)


def test_batching_does_not_change_results(tiny_files):
    root, _ = tiny_files
    model, _ = load_detector(root / "tiny.pkl", TINY)
    ex = RegionFeatureExtractor(model, SelectionConfig("butd", BoxCount(10, 30)))
    imgs = images()
    batched = ex(imgs, ["a", "b", "c"])
    for i, img in enumerate(imgs):
        single = ex([img], ["abc"[i]])[0]
        np.testing.assert_array_equal(single.boxes, batched[i].boxes)
        np.testing.assert_allclose(single.features, batched[i].features, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(single.cls_prob, batched[i].cls_prob, rtol=1e-5, atol=1e-7)


def test_given_boxes_come_back_exactly(tiny_files):
    root, _ = tiny_files
    model, _ = load_detector(root / "tiny.pkl", TINY)
    given = np.array([[0, 0, 640, 480], [10.5, 20.25, 100, 200], [300, 300, 301, 302]], np.float32)
    rec = RegionFeatureExtractor(model)(images()[:1], ["a"], given_boxes=[given])[0]
    np.testing.assert_array_equal(rec.boxes, given)
    assert rec.features.shape[0] == 3 and rec.cls_prob.shape[0] == 3


def test_maxnms_policy_returns_regressed_boxes_inside_the_image(tiny_files):
    root, _ = tiny_files
    model, _ = load_detector(root / "tiny.pkl", TINY)
    recs = RegionFeatureExtractor(model, SelectionConfig("maxnms", BoxCount(5, 8)))(images(), ["a", "b", "c"])
    for rec, img in zip(recs, images()):
        assert 1 <= rec.num_boxes <= 8
        assert (rec.boxes[:, 2] <= img.shape[1]).all() and (rec.boxes[:, 3] <= img.shape[0]).all()


# -- pure selection and box arithmetic ------------------------------------------


def test_box_count_parsing():
    assert BoxCount.parse("36") == BoxCount(36, 36) and BoxCount.parse("10-100") == BoxCount(10, 100)
    for bad in ("0", "5-3", "a", "1-2-3"):
        with pytest.raises(ConfigError):
            BoxCount.parse(bad)


def test_butd_selection_on_hand_built_scores():
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [100, 100, 110, 110], [0, 0, 9, 10.0]])
    # columns: background, class 1, class 2
    probs = torch.tensor(
        [
            [0.1, 0.8, 0.1],  # box 0: best for class 1
            [
                0.1,
                0.7,
                0.2,
            ],  # box 1: overlaps box 0 -> suppressed in class 1; in class 2 it outranks box 0 -> kept, 0.2
            [0.5, 0.3, 0.2],  # box 2: alone: max 0.3
            [0.85, 0.1, 0.05],  # box 3: alone but weak: 0.1
            [0.2, 0.79, 0.01],  # box 4: overlaps box 0 in class 1 -> suppressed; class 2 suppressed by box 1
        ]
    )
    max_conf = per_class_nms_max_conf(boxes, probs[:, 1:], 0.3)
    np.testing.assert_allclose(max_conf.numpy(), [0.8, 0.2, 0.3, 0.1, 0.0], atol=1e-6)
    assert select_butd(boxes, probs, BoxCount(1, 10)).tolist() == [0, 1, 2]  # >= 0.2, proposal order
    assert select_butd(boxes, probs, BoxCount(4, 10)).tolist() == [0, 2, 1, 3]  # too few: top-4 by confidence
    assert select_butd(boxes, probs, BoxCount(1, 2)).tolist() == [0, 2]  # too many: top-2
    assert select_butd(boxes, probs, BoxCount(1, 10), conf_thresh=0.25).tolist() == [0, 2]


def test_maxnms_selection_raises_the_threshold_until_enough_boxes():
    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 9.5], [0, 0, 10, 9], [50, 50, 60, 60.0]])
    per_class = boxes.repeat(1, 2)  # two foreground classes, same regressed boxes
    probs = torch.tensor([[0.1, 0.9, 0.0], [0.1, 0.0, 0.8], [0.2, 0.7, 0.1], [0.3, 0.6, 0.1]])
    keep, chosen = select_maxnms(per_class, probs, BoxCount(2, 10))
    assert keep.tolist() == [0, 3]  # at 0.3 the overlapping ones go; 2 >= min
    keep, _ = select_maxnms(per_class, probs, BoxCount(4, 4))
    # never 4: even at 0.9, box 1 (IoU 0.95 with box 0) goes; box 2 (IoU 0.9, not > 0.9) stays
    assert keep.tolist() == [0, 2, 3]
    assert torch.equal(chosen, boxes[[0, 3]])


def test_decode_inverts_encode():
    a = torch.tensor([[10.0, 20, 50, 80], [0, 0, 16, 16]])
    b = torch.tensor([[12.0, 18, 60, 70], [2, 3, 30, 20]])
    np.testing.assert_allclose(decode(encode(a, b, (10, 10, 5, 5)), a, (10, 10, 5, 5)).numpy(), b.numpy(), rtol=1e-5)


@pytest.mark.parametrize(
    "hw, expected",
    [
        ((480, 640), (600, 800)),  # landscape
        ((1000, 300), (1000, 300)),  # portrait: 600/300 = 2 makes 2000 > 1000, so 1000/1000
        ((10, 10), (600, 600)),  # tiny
        ((4000, 6000), (600, 900)),  # huge
        ((500, 1200), (417, 1000)),  # round(600/500*1200) = 1440 > 1000
    ],
)
def test_preprocessing_sizes(hw, expected):
    cfg = DetectorConfig()
    scale = butd_scale(*hw, cfg.min_size, cfg.max_size)
    x, got_scale = preprocess(np.zeros((*hw, 3), np.uint8), cfg)
    assert tuple(x.shape[-2:]) == expected and got_scale == scale
    np.testing.assert_allclose(x[0, :, 0, 0].numpy(), -np.array(cfg.pixel_mean_bgr), rtol=1e-6)  # BGR order, no /255


@pytest.mark.parametrize("name", ["gray.jpg", "cmyk.jpg", "rgba.png", "sixteen.png", "exif_rotated.jpg"])
def test_odd_image_modes_become_rgb_inputs(name):
    rgb = load_rgb(make_corpus()[name][0])
    assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3
    if name == "exif_rotated.jpg":
        assert rgb.shape[:2] == (48, 64) and rgb[24, 5, 0] > 200


# -- the detect stage's configs validate themselves ------------------------------


def test_selection_and_detector_configs_validate_themselves():
    with pytest.raises(ConfigError, match="--policy must be one of butd, maxnms"):
        SelectionConfig("nms")
    with pytest.raises(ConfigError, match="--nms-thresh must be >= 0"):
        SelectionConfig(nms_thresh=-0.1)
    with pytest.raises(ConfigError, match="1 <= MIN <= MAX"):
        BoxCount(5, 3)
    from pipeline.detect.backends.butd_c4.config import DEFAULT_SELECTION

    assert DEFAULT_SELECTION.to_json()["boxes"] == "10-100"  # recorded as the flag is written
    assert DetectorConfig.from_json(TINY.to_json()) == TINY
    with pytest.raises(ConfigError, match="unknown detector config keys: colour"):
        DetectorConfig.from_json({**TINY.to_json(), "colour": 1})


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"device": "gpu"}, "--device must be auto, cpu, cuda or cuda:N"),
        ({"cls_prob": "topk"}, "--cls-prob: probability storage"),
        ({"backend": "zarr"}, "--backend must be one of arrow, lmdb"),
        ({"dtype": "int8"}, "--dtype must be one of float16, float32"),
        ({"batch_size": 0}, "--batch-size must be >= 1"),
        ({"actors": 0}, "--actors must be >= 1"),
        ({"dataset": "nope", "images": None, "inputs": ("x",)}, "--dataset must be one of"),
        ({"dataset": "folder", "images": None}, "give at least one --input"),
    ],
)
def test_extract_config_refuses_bad_values_naming_the_flag(tmp_path, fields, message):
    from pipeline.detect.config import ExtractConfig

    with pytest.raises(ConfigError, match=message):
        ExtractConfig(**{"out": tmp_path / "s", "images": tmp_path, "random_weights": True, **fields})


# -- the backbone batched over images ------------------------------------

# VG-sized maps: PyTorch runs the same convolution kernels for a stack of one image and of many
FULL_SIZE_TINY = replace(TINY, min_size=600, max_size=1000)


def test_backbone_groups_pad_only_within_the_tolerance():
    sizes = [(600, 800), (800, 600), (600, 800), (600, 899), (600, 600), (600, 800)]
    assert backbone_groups(sizes) == [[3], [0, 2, 5], [4], [1]]  # identical sizes only, by aspect ratio
    assert backbone_groups(sizes, 0.1) == [[3, 0, 2, 5], [4], [1]]  # 600x899 pads 800-wide ones by 9 %
    assert backbone_groups(sizes, 0.2) == [[3, 0, 2, 5, 4], [1]]
    assert backbone_groups([]) == []


def test_same_size_images_share_one_backbone_run_exactly():
    torch.manual_seed(0)
    model = VGDetector(FULL_SIZE_TINY)
    ex = RegionFeatureExtractor(model, SelectionConfig("butd", BoxCount(10, 30)))
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 255, hw, dtype=np.uint8) for hw in ((120, 160, 3), (160, 120, 3), (120, 160, 3))]
    runs = []
    hook = model.backbone.register_forward_hook(lambda module, args, out: runs.append(len(args[0])))
    try:
        batched = ex(imgs, list("abc"))
        assert runs == [2, 1]  # the two 600x800 inputs stacked, the 800x600 one alone
        inputs = [prepare_image(img, FULL_SIZE_TINY)[0] for img in imgs]
        with torch.no_grad():
            stacked = ex.backbone_features(inputs)
            alone = [ex.backbone_features([x])[0] for x in inputs]
    finally:
        hook.remove()
    for s, a in zip(stacked, alone):
        assert torch.equal(s, a)
    for i, img in enumerate(imgs):
        single = ex([img], ["abc"[i]])[0]
        np.testing.assert_array_equal(single.boxes, batched[i].boxes)
        # the ROI heads run over all regions of a batch, as before: float rounding only
        np.testing.assert_allclose(single.features, batched[i].features, rtol=1e-5, atol=1e-6)


def test_padded_groups_differ_only_near_the_padded_border():
    torch.manual_seed(0)
    ex = RegionFeatureExtractor(VGDetector(FULL_SIZE_TINY), pad_tolerance=0.1)
    rng = np.random.default_rng(0)
    inputs = [
        prepare_image(rng.integers(0, 255, hw, dtype=np.uint8), FULL_SIZE_TINY)[0]
        for hw in ((120, 160, 3), (120, 170, 3))
    ]  # 600x800 padded to 600x850 with its neighbour
    with torch.no_grad():
        grouped = ex.backbone_features(inputs)
        alone = [ex.backbone_features([x])[0] for x in inputs]
    assert [tuple(f.shape[-2:]) for f in grouped] == [(38, 50), (38, 53)] == [tuple(f.shape[-2:]) for f in alone]
    assert torch.equal(grouped[1], alone[1])  # the widest image is not padded
    assert torch.equal(grouped[0][..., :48], alone[0][..., :48])
    assert not torch.equal(grouped[0][..., 48:], alone[0][..., 48:])  # the last two columns see the padding
    with pytest.raises(ValueError, match="pad_tolerance"):
        RegionFeatureExtractor(VGDetector(TINY), pad_tolerance=-1)


def test_save_detector_hf_writes_the_published_hf_layout(tiny_files, tmp_path):
    root, _ = tiny_files
    model, _ = load_detector(root / "tiny.pkl", TINY)
    path = tmp_path / "pytorch_model.bin"
    assert save_detector_hf(model, path) == sha256_file(path)
    ours, published = torch.load(path, weights_only=True), torch.load(root / "tiny.bin", weights_only=True)
    assert sorted(ours) == sorted(published)
    assert all(torch.equal(ours[k], published[k]) for k in published)
    again, report = load_detector(path, TINY)
    assert report.layout == "hf-bin"
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
