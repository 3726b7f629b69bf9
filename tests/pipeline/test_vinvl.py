"""VinVL's X152-C4 AttrRCNN (``--detector vinvl-x152c4``) against scene_graph_benchmark's own code.

`tests/reference/vinvl_attr_rcnn.py` ran the reference's AttrRCNN (its builders, checkpoint loader,
test transforms and post-processors) on a tiny model of the same architecture, random weights in
the released checkpoint's layout, for NMS_FILTER 1 and 2 with box regression on and ignored; its
fixture keeps the inputs, proposals, detections, attributes and features. Here the same checkpoint
file goes through our loader and extractor on the same images.
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import extract_args, load_reference
from torchvision.ops import box_iou

from pipeline.detect.backends import BACKENDS, build_extractor, load_model, resolve
from pipeline.detect.backends.vinvl_x152c4.labelmap import read_labelmap
from pipeline.detect.backends.vinvl_x152c4.model import AttrRCNN
from pipeline.detect.backends.vinvl_x152c4.weights import SHARED, canonical_name, published_state
from pipeline.detect.config import BoxCount, ExtractConfig, SelectionConfig
from pipeline.detect.preprocess import prepare_image
from pipeline.errors import ConfigError

REFERENCE = Path(__file__).parents[1] / "reference"
FIXTURE = json.loads((REFERENCE / "vinvl_attr_rcnn.json").read_text())
TINY = resolve("vinvl-tiny").config


REF = load_reference("vinvl_attr_rcnn")
SETTINGS = {  # the fixture's settings as our selections
    "filter1_ignore_reg": SelectionConfig("per-class", regression=False),
    "filter1_reg": SelectionConfig("per-class", regression=True),
    "filter2_ignore_reg": SelectionConfig("class-agnostic", regression=False),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vinvl") / "vinvl_vg_x152c4.pth"
    torch.save(REF.published_checkpoint(FIXTURE["shapes"]), path)
    return path


@pytest.fixture(scope="module")
def model(checkpoint) -> AttrRCNN:
    return load_model("vinvl-tiny", checkpoint)[0]


def test_the_tiny_config_is_the_reference_tiny_model():
    spec = FIXTURE["tiny_spec"]
    assert (TINY.stem_channels, list(TINY.blocks[:3]), TINY.blocks[3]) == (
        spec["stem_channels"],
        spec["blocks_per_stage"],
        spec["res5_head_blocks"],
    )
    assert (TINY.groups, TINY.width_per_group, TINY.feature_dim) == (
        spec["num_groups"],
        spec["width_per_group"],
        spec["res5_head_channels"],
    )
    assert (TINY.num_classes, TINY.num_attributes, TINY.attribute_embed, TINY.attribute_hidden) == (
        spec["num_classes"],
        spec["num_attributes"],
        spec["attr_class_embed_dim"],
        spec["attr_hidden_dim"],
    )
    assert (TINY.rpn_pre_nms_topk, TINY.rpn_post_nms_topk, TINY.rpn_nms) == (
        spec["rpn_pre_nms_top_n"],
        spec["rpn_post_nms_top_n"],
        spec["rpn_nms_thresh"],
    )
    assert (TINY.min_size, TINY.max_size, list(TINY.pixel_mean_bgr)) == (
        spec["min_size_test"],
        spec["max_size_test"],
        spec["pixel_mean_bgr"],
    )
    assert list(TINY.bbox_reg_weights) == spec["bbox_reg_weights"] and TINY.max_attributes == spec["max_attrs_per_box"]


def test_the_full_config_holds_every_published_key_and_shape():
    """Our vinvl-x152c4 model (built on the meta device) is the released checkpoint's 841 tensors
    under our names: every key maps to one of ours with its shape, the shared extractor's second
    name aside; and `published_state` writes them back under the released names."""
    with torch.device("meta"):
        ours = AttrRCNN(resolve("vinvl-x152c4").config)
    shapes = {k: list(v.shape) for k, v in ours.state_dict().items()}
    theirs = FIXTURE["full_shapes"]
    assert len(theirs) == 841
    mapped = {canonical_name(k): v for k, v in theirs.items() if not k.startswith(SHARED[0])}
    assert mapped == shapes


def test_the_released_layout_loads_strictly_and_writes_back(checkpoint, model, tmp_path):
    _, report = load_model("vinvl-tiny", checkpoint)
    assert report.layout == "maskrcnn-benchmark-torch" and report.tensors == len(FIXTURE["shapes"])
    assert sorted(report.dropped) == sorted(k for k in FIXTURE["shapes"] if k.startswith(SHARED[0]))
    assert torch.equal(model.rpn.cell_anchors, torch.tensor(FIXTURE["anchors"]))  # the checkpoint's anchors
    again = tmp_path / "again.pth"
    torch.save(published_state(model), again)
    reloaded, _ = load_model("vinvl-tiny", again)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()))
    assert sorted(torch.load(again, weights_only=True)) == sorted("module." + k for k in FIXTURE["shapes"])


@pytest.mark.parametrize("index", range(3))
def test_the_input_is_the_references(index):
    """maskrcnn-benchmark's resize rule and PIL resize of the uint8 RGB image, then BGR minus the
    means: the same resized bytes (crc32) and input values."""
    expected = FIXTURE["images"][index]["input"]
    x, resize = prepare_image(REF.images()[index], TINY, "maskrcnn")
    assert list(x.shape[1:]) == expected["shape"]
    bgr = (x[0] + torch.tensor(TINY.pixel_mean_bgr).view(3, 1, 1)).round().to(torch.uint8)
    rgb = bgr.flip(0).permute(1, 2, 0).contiguous().numpy()
    assert zlib.crc32(rgb.tobytes()) == expected["resized_rgb_crc32"]
    for c, y, xx, value in expected["samples"]:
        assert float(x[0, c, y, xx]) == pytest.approx(value, abs=1e-4)


def _iou_pairs(a, b) -> torch.Tensor:
    """Each box's IoU with its counterpart (1 where they are within 0.01 px: a zero-width box too)."""
    a, b = torch.as_tensor(np.asarray(a, np.float32)), torch.as_tensor(np.asarray(b, np.float32))
    same = (a - b).abs().amax(1) <= 0.01
    return torch.where(same, torch.ones(len(a)), box_iou(a, b).diagonal())


@pytest.mark.parametrize("index", range(3))
def test_rpn_proposals_are_the_references(model, index):
    extractor = build_extractor("vinvl-tiny", model)
    x, resize = prepare_image(REF.images()[index], TINY, "maskrcnn")
    with torch.no_grad():
        proposals = extractor.proposals(model.backbone(x), resize.new_height, resize.new_width)
    expected = FIXTURE["images"][index]["proposals"]
    assert len(proposals) == len(expected)
    assert float((_iou_pairs(proposals, expected) > 0.99).float().mean()) == 1.0


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_detections_attributes_and_features_are_the_references(model, setting):
    """Per image: the same number of boxes in the same order (IoU > 0.9 for every one), the same
    labels, scores within 1e-4, the same attributes (the top `max_attributes` above 0.05) with their
    scores, and features
    of cosine >= 0.99999 (sampled dimensions, and sums; whole for each image's first box)."""
    extractor = build_extractor("vinvl-tiny", model, selection=SETTINGS[setting])
    records = extractor(REF.images(), ["a", "b", "c"])
    for rec, expected in zip(records, FIXTURE["results"][setting]):
        assert rec.num_boxes == len(expected["boxes"])
        assert float((_iou_pairs(rec.boxes, expected["boxes"]) > 0.9).float().min()) == 1.0
        np.testing.assert_allclose(rec.boxes, expected["boxes"], rtol=1e-4, atol=1e-3)
        assert (rec.objects_id + 1).tolist() == expected["labels"]
        np.testing.assert_allclose(rec.objects_conf, expected["scores"], rtol=1e-4, atol=1e-5)
        for prob, labels, scores in zip(rec.attr_prob, expected["attr_labels"], expected["attr_scores"]):
            theirs = {label: score for label, score in zip(labels, scores) if score > 0}
            top = np.argsort(-prob[1:], kind="stable")[: TINY.max_attributes] + 1  # the reference's top-k
            ours = {int(i): float(prob[i]) for i in top if prob[i] > TINY.attribute_thresh}
            assert sorted(ours) == sorted(theirs)
            assert [ours[k] for k in sorted(ours)] == pytest.approx([theirs[k] for k in sorted(theirs)], abs=1e-4)
        sampled = rec.features[:, FIXTURE["feature_dims"]]
        np.testing.assert_allclose(sampled, expected["feature_sampled"], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(rec.features.astype(np.float64).sum(1), expected["feature_sum"], rtol=1e-4)
        if "feature0_b64" in expected:
            first = np.frombuffer(base64.b64decode(expected["feature0_b64"]), np.float32)
            cos = float(first @ rec.features[0] / np.linalg.norm(first) / np.linalg.norm(rec.features[0]))
            assert cos >= 0.99999


def test_given_boxes_get_their_own_features_and_labels(model):
    extractor = build_extractor("vinvl-tiny", model)
    given = np.array([[10, 12, 100, 90], [0, 0, 199, 119]], np.float32)
    rec = extractor([REF.images()[0]], ["a"], given_boxes=[given])[0]
    np.testing.assert_array_equal(rec.boxes, given)
    assert rec.num_boxes == 2 and rec.cls_prob.shape == (2, 13) and rec.attr_prob.shape == (2, 8)
    np.testing.assert_array_equal(rec.objects_id, rec.cls_prob[:, 1:].argmax(1))


def test_selection_defaults_and_refusals(tmp_path):
    common = dict(out=tmp_path / "out", images=tmp_path, random_weights=True, detector="vinvl-x152c4")
    cfg = ExtractConfig(**common)
    assert cfg.preprocess == "maskrcnn"
    assert cfg.selection == SelectionConfig("per-class", BoxCount(10, 100), 0.2, 0.3, regression=False)
    assert cfg.selection.describe() == "per-class boxes=10-100, conf>=0.2, nms=0.3, proposal boxes"
    agnostic = ExtractConfig(**common, selection=SelectionConfig("class-agnostic"))
    assert agnostic.selection.nms_thresh == 0.5  # ROI_HEADS.NMS: NMS_FILTER 2's threshold
    with pytest.raises(ConfigError, match="reports the boxes of other proposals"):
        ExtractConfig(**common, selection=SelectionConfig("class-agnostic", regression=True))
    with pytest.raises(ConfigError, match="--policy butd is not a vinvl-x152c4 policy"):
        ExtractConfig(**common, selection=SelectionConfig("butd"))
    with pytest.raises(ConfigError, match="--policy per-class is not a butd-c4 policy"):
        ExtractConfig(**{**common, "detector": "vg-r101"}, selection=SelectionConfig("per-class"))
    with pytest.raises(ConfigError, match="--preprocess must be one of maskrcnn"):
        ExtractConfig(**common, preprocess="caffe")


def _labelmap(path: Path, classes: int, attributes: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "label_to_idx": {f"object{i}": i for i in range(1, classes)},
                "attribute_to_idx": {f"attr{i}": i for i in range(1, attributes)},
                "idx_to_label": {str(i): f"object{i}" for i in range(1, classes)},
            }
        )
    )
    return path


def test_a_label_map_of_the_wrong_size_is_named_before_any_work(tmp_path):
    common = dict(out=tmp_path / "out", images=tmp_path, random_weights=True, detector="vinvl-tiny")
    good = _labelmap(tmp_path / "good.json", 13, 8)
    assert ExtractConfig(**common, labelmap=good).labelmap == good
    names, attributes = read_labelmap(good, TINY)
    assert names[0] == "__background__" and names[12] == "object12" and attributes[0] == "__no_attribute__"
    with pytest.raises(ConfigError, match="label_to_idx has 1594 entries .* the detector has 12"):
        ExtractConfig(**common, labelmap=_labelmap(tmp_path / "full.json", 1595, 525))
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="has no label_to_idx"):
        ExtractConfig(**common, labelmap=tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="--labelmap: the butd-c4 backend reads no label map"):
        ExtractConfig(**{**common, "detector": "tiny"}, labelmap=good)


def test_other_families_weights_are_named(tmp_path, checkpoint):
    from detector_layouts import random_weights, write_d2_pickle

    from pipeline.detect.backends.butd_c4.config import DetectorConfig

    butd = tmp_path / "butd.pkl"
    write_d2_pickle(butd, random_weights(DetectorConfig.load("tiny")))
    with pytest.raises(ConfigError, match="a butd-c4 weights file .* read it with --detector vg-r101"):
        load_model("vinvl-tiny", butd)
    with pytest.raises(ConfigError, match="a vinvl-x152c4 weights file .* read it with --detector vinvl-x152c4"):
        load_model("tiny", checkpoint)
    with pytest.raises(ConfigError, match="a vinvl-x152c4 weights file"):
        load_model("grid-tiny", checkpoint)


def test_the_backend_is_registered_with_its_configs():
    backend = BACKENDS.get("vinvl-x152c4")
    assert backend.config_names() == ["vinvl-tiny", "vinvl-x152c4"] and backend.given_boxes


def test_a_vinvl_store_is_extracted_on_ray_and_replayed_bitwise(checkpoint, tmp_path):
    """`vlprep extract --detector vinvl-tiny` over a folder (Ray actors, the store writer), with its
    label map; then `StoreDetector` (what `vltrain predict` runs on new images) rebuilds the
    extractor from the store's provenance and gives every image's record back bit for bit."""
    from helpers import run_cli
    from PIL import Image

    from pipeline.detect.like_store import StoreDetector
    from pipeline.store import FeatureStore

    folder = tmp_path / "images"
    folder.mkdir()
    for i, rgb in enumerate(REF.images()):
        Image.fromarray(rgb).save(folder / f"im{i}.png")
    labels = _labelmap(tmp_path / "labelmap.json", 13, 8)
    proc = run_cli(
        *extract_args(
            tmp_path / "store",
            images=folder,
            detector="vinvl-tiny",
            weights=checkpoint,
            labelmap=labels,
            policy="class-agnostic",
        )
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "store", dtype="float32")
    prov = store.manifest.provenance
    assert prov["extractor"] == {"backend": "vinvl-x152c4", "config": TINY.to_json()}
    assert prov["box_policy"] == "class-agnostic boxes=10-100, conf>=0.2, nms=0.5, proposal boxes"
    assert prov["labels"]["objects"][:2] == ["object1", "object2"] and len(prov["labels"]["attributes"]) == 7
    assert store.layout.regions == "detections" and store.layout.cls_dim == 13 and store.layout.attr_dim == 8

    detector = StoreDetector.of(tmp_path / "store")
    records = detector.extract([detector.load(str(folder / f"im{i}.png")) for i in range(3)])
    for i, record in enumerate(records):
        stored = store.get(f"im{i}")
        for field, value in stored.array_fields().items():
            assert np.array_equal(getattr(record, field), value), (i, field)
