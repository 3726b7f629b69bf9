"""Grid features (``--detector grid-*``) against grid-feats-vqa's own extraction.

`tests/reference/grid_feats.py` ran the reference (``extract_grid_feature.py`` with detectron2 at
the commit grid-feats-vqa pins) on a tiny model of the X-152 family, with random weights in the
published checkpoint layout, on PNG files it wrote; its fixture holds the decoded and resized
inputs and the conv5 maps the reference saved. Here the same checkpoint file and PNG files go
through our loader, image decoder, preprocessing and backbone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import extract_args, load_reference

from pipeline.detect.backends import BACKENDS, Detector, build_extractor, load_model, resolve
from pipeline.detect.backends.grid.config import GridConfig
from pipeline.detect.backends.grid.extractor import GridExtractor, GridTooSmall
from pipeline.detect.backends.grid.model import GridBackbone
from pipeline.detect.config import GridPool
from pipeline.detect.preprocess import prepare_image
from pipeline.errors import ConfigError
from pipeline.images import load_rgb

REFERENCE = Path(__file__).parents[1] / "reference"
FIXTURE = json.loads((REFERENCE / "grid_feats.json").read_text())
GRID = BACKENDS.get("grid")
TINY = resolve("grid-tiny").config


REF = load_reference("grid_feats")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("grid") / "X-tiny.pth"
    torch.save(REF.published_checkpoint(FIXTURE["tiny_shapes"]), path)
    return path


def test_the_tiny_config_is_the_reference_tiny_model():
    spec = FIXTURE["tiny_spec"]
    assert TINY.blocks == tuple(spec["blocks_per_stage"])
    assert (TINY.groups, TINY.width_per_group) == (spec["num_groups"], spec["width_per_group"])
    assert (TINY.stem_channels, TINY.res2_out_channels, TINY.feature_dim) == (
        spec["stem_out_channels"],
        spec["res2_out_channels"],
        spec["out_channels"],
    )
    assert (TINY.stride_in_1x1, TINY.res5_dilation, TINY.norm_eps) == (
        spec["stride_in_1x1"],
        spec["res5_dilation"],
        spec["frozen_bn_eps"],
    )
    assert (TINY.min_size, TINY.max_size) == (spec["min_size_test"], spec["max_size_test"])
    assert list(TINY.pixel_mean_bgr) == spec["pixel_mean"] and list(TINY.pixel_std_bgr) == spec["pixel_std"]


@pytest.mark.parametrize("name,published", [("grid-x152", "X-152"), ("grid-x101", "X-101"), ("grid-r50", "R-50")])
def test_full_configs_hold_the_published_backbone_keys_and_shapes(name, published):
    """Our X-152 / X-101 / R-50 grid models have exactly the ``backbone.*`` keys and shapes of
    the published checkpoints (built on the meta device: no memory), and the rest of a
    published file is the detection heads a grid never runs."""
    with torch.device("meta"):
        model = GridBackbone(resolve(name).config)
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    theirs = FIXTURE["full_shapes"][published]
    assert ours == {k: v for k, v in theirs.items() if k.startswith("backbone.")}
    assert all(k.startswith(("proposal_generator.", "roi_heads.")) for k in theirs if k not in ours)


def test_the_published_layout_loads_strictly_and_counts_the_heads(checkpoint):
    model, report = load_model("grid-tiny", checkpoint)
    assert report.layout == "detectron2-torch" and len(report.sha256) == 64
    heads = [k for k in FIXTURE["tiny_shapes"] if not k.startswith("backbone.")]
    assert sorted(report.unused) == sorted(heads) and report.identity_norm_stats == 0
    assert sorted(model.state_dict()) == sorted(FIXTURE["tiny_grid_keys"])


@pytest.mark.parametrize("case", FIXTURE["cases"], ids=lambda c: c["name"])
def test_grid_features_equal_the_reference(case, checkpoint, tmp_path):
    """The decoded image, the resized and normalized input (bitwise: the same uint8 resize, the
    same ``(x - mean) / std``) and the conv5 map (float arithmetic of another order: within
    1e-5 relative, cosine 1.000000) of each reference case; EXIF orientation and a gray PNG included."""
    path = tmp_path / "image.png"
    REF.write_png(path, case)
    rgb = load_rgb(path.read_bytes())
    assert list(rgb.shape[:2]) == case["decoded_hw"]
    cfg = TINY if "pixel_std" not in case else replace(TINY, pixel_std_bgr=tuple(case["pixel_std"]))
    x, resize = prepare_image(rgb, cfg, "detectron2")
    assert list(x.shape) == case["input_shape"] and [resize.new_height, resize.new_width] == case["resized_hw"]
    samples = [round(float(x[0, c, y, xx]), 6) for c, y, xx in FIXTURE["sample_points"]]
    assert samples == pytest.approx(case["input_samples"], abs=2e-6)
    if "pixel_std" not in case:  # the resized uint8 image, recovered from x: the reference's bytes
        uint8 = (x[0] + torch.tensor(cfg.pixel_mean_bgr).view(3, 1, 1)).round().to(torch.uint8)
        assert hashlib.sha256(uint8.numpy().tobytes()).hexdigest() == case["mapper_chw_sha256"]

    model, _ = load_model(Detector(GRID, cfg), checkpoint)
    extractor = build_extractor(Detector(GRID, cfg), model)
    fmap, _ = extractor.grid(rgb)
    expected = REF.unb64(case["conv5"], case["conv5_shape"])
    assert list(fmap.shape) == case["conv5_shape"]
    torch.testing.assert_close(fmap, expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    cos = torch.nn.functional.cosine_similarity(fmap.flatten(2), expected.flatten(2), dim=1)
    assert float(cos.min()) > 0.999999


@pytest.fixture(scope="module")
def tiny_extractor(checkpoint) -> GridExtractor:
    model, _ = load_model("grid-tiny", checkpoint)
    return build_extractor("grid-tiny", model)


def test_every_cell_is_a_region_with_its_box(tiny_extractor):
    rgb = REF.images()[3]  # 480 x 1100 -> resized 112 x 256 -> a 4 x 8 map
    rec = tiny_extractor([rgb], ["x"])[0]
    fmap, _ = tiny_extractor.grid(rgb)
    h, w = fmap.shape[-2:]
    assert rec.num_boxes == h * w and rec.features.shape == (h * w, TINY.feature_dim)
    np.testing.assert_array_equal(rec.features, fmap[0].flatten(1).t().numpy())  # row-major cells
    boxes = rec.boxes.reshape(h, w, 4)
    assert boxes[0, 0, :2].tolist() == [0, 0] and np.allclose(boxes[-1, -1, 2:], [1100, 480], atol=1e-3)
    assert np.allclose(boxes[0, 1:, 0], boxes[0, :-1, 2]) and np.allclose(boxes[1:, 0, 1], boxes[:-1, 0, 3])
    assert rec.objects_id is None and rec.cls_prob is None  # a grid has no labels


def test_pooled_cells_average_the_map_and_union_their_boxes(checkpoint):
    model, _ = load_model("grid-tiny", checkpoint)
    rgb = REF.images()[1]  # 233 x 151 -> 247 x 160 -> an 8 x 5 map
    whole = build_extractor("grid-tiny", model)([rgb], ["x"])[0]
    pooled = build_extractor("grid-tiny", model, grid_pool=GridPool(3, 2))([rgb], ["x"])[0]
    fmap = torch.from_numpy(whole.features).t().reshape(1, -1, 8, 5)
    expected = torch.nn.functional.adaptive_avg_pool2d(fmap, (3, 2))[0].flatten(1).t().numpy()
    np.testing.assert_allclose(pooled.features, expected, rtol=1e-6, atol=1e-6)
    cells = whole.boxes.reshape(8, 5, 4)
    # adaptive bins of 8 rows into 3: [0, 3), [2, 6), [5, 8); of 5 columns into 2: [0, 3), [2, 5)
    for i, (r0, r1) in enumerate([(0, 3), (2, 6), (5, 8)]):
        for j, (c0, c1) in enumerate([(0, 3), (2, 5)]):
            union = [*cells[r0, c0, :2], *cells[r1 - 1, c1 - 1, 2:]]
            assert np.allclose(pooled.boxes[i * 2 + j], union)


def test_a_map_smaller_than_the_pool_is_that_images_named_error(checkpoint):
    model, _ = load_model("grid-tiny", checkpoint)
    extractor = build_extractor("grid-tiny", model, grid_pool=GridPool(4, 4))
    strip = np.zeros((20, 600, 3), np.uint8)  # 20 x 600 -> 9 x 256 -> a 1 x 8 map
    with pytest.raises(GridTooSmall, match="1x8 map is smaller than --grid-pool 4x4") as err:
        extractor([strip], ["strip"])
    assert err.value.kind == "grid too small"


def test_grid_pool_parsing():
    assert GridPool.parse("8x8") == GridPool(8, 8) and GridPool.parse("6") == GridPool(6, 6)
    assert str(GridPool.parse("3X4")) == "3x4"
    for bad in ("0x8", "8x", "x", "a", "1x2x3", "-1"):
        with pytest.raises(ConfigError, match="--grid-pool"):
            GridPool.parse(bad)


def test_the_smallest_map_bounds_grid_pool_before_any_work(tmp_path):
    from pipeline.detect.config import ExtractConfig

    common = dict(out=tmp_path / "out", images=tmp_path, random_weights=True, detector="grid-x152")
    assert ExtractConfig(**common, grid_pool=GridPool(19, 19)).grid_pool == GridPool(19, 19)
    with pytest.raises(ConfigError, match="--grid-pool 20x8 is larger than the map: grid-x152 gives an image 19x19"):
        ExtractConfig(**common, grid_pool=GridPool(20, 8))
    with pytest.raises(ConfigError, match="--grid-pool is for grid backends"):
        ExtractConfig(**{**common, "detector": "vg-r101"}, grid_pool=GridPool(2, 2))


def test_a_grid_config_refuses_what_it_has_no_use_for(tmp_path):
    from pipeline.detect.config import BoxCount, ExtractConfig, SelectionConfig

    common = dict(out=tmp_path / "out", images=tmp_path, random_weights=True, detector="grid-r50")
    cfg = ExtractConfig(**common)
    assert cfg.selection is None and cfg.preprocess == "detectron2"
    with pytest.raises(ConfigError, match="selects no regions, so --boxes mean nothing"):
        ExtractConfig(**common, selection=SelectionConfig(boxes=BoxCount(36, 36)))
    with pytest.raises(ConfigError, match="--preprocess must be one of detectron2"):
        ExtractConfig(**common, preprocess="caffe")
    (tmp_path / "b.json").write_text('{"a": [[0, 0, 1, 1]]}')
    with pytest.raises(ConfigError, match="--given-boxes: the grid backend extracts no features for given boxes"):
        ExtractConfig(**common, given_boxes=tmp_path / "b.json")


def test_other_families_weights_are_named(tmp_path, checkpoint):
    """A BUTD pickle given to a grid config, or a grid checkpoint to the BUTD detector: the
    family is named with the --detector that reads it, before anything is built."""
    from detector_layouts import random_weights, write_d2_pickle

    from pipeline.detect.backends.butd_c4.config import DetectorConfig

    butd = tmp_path / "butd.pkl"
    write_d2_pickle(butd, random_weights(DetectorConfig.load("tiny")))
    with pytest.raises(ConfigError, match="a butd-c4 weights file .* read it with --detector vg-r101"):
        load_model("grid-tiny", butd)
    with pytest.raises(ConfigError, match="a grid weights file .* read it with --detector grid-x152"):
        load_model("tiny", checkpoint)
    with pytest.raises(ConfigError, match="does not match detector config 'grid-r50'"):
        load_model("grid-r50", checkpoint)  # the right family, the wrong architecture: the keys listed


def test_random_grid_weights_stay_finite():
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GridBackbone(GridConfig(**{**TINY.to_json(), "blocks": (3, 8, 36, 3)}))
    fmap, _ = GridExtractor(model).grid(REF.images()[0])
    assert torch.isfinite(fmap).all() and 0 < float(fmap.std()) < 100


def test_a_grid_store_is_replayed_bitwise(checkpoint, tmp_path):
    """`vlprep extract --detector grid-tiny --grid-pool 2x3` on Ray, then `StoreDetector` (what
    `vltrain predict` runs on new images): every record back bit for bit, pooled cells included."""
    from helpers import run_cli
    from PIL import Image

    from pipeline.detect.like_store import StoreDetector
    from pipeline.store import FeatureStore

    folder = tmp_path / "images"
    folder.mkdir()
    for i, rgb in enumerate(REF.images()):
        Image.fromarray(rgb).save(folder / f"im{i}.png")
    proc = run_cli(
        *extract_args(tmp_path / "store", images=folder, detector="grid-tiny", weights=checkpoint, grid_pool="2x3")
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "store", dtype="float32")
    assert store.manifest.provenance["box_policy"] == "grid cells pooled to 2x3"
    detector = StoreDetector.of(tmp_path / "store")
    records = detector.extract([detector.load(str(folder / f"im{i}.png")) for i in range(4)])
    for i, record in enumerate(records):
        stored = store.get(f"im{i}")
        assert record.num_boxes == 6
        for field, value in stored.array_fields().items():
            assert np.array_equal(getattr(record, field), value), (i, field)
