from dataclasses import replace

import numpy as np
import pytest
from helpers import make_record

from pipeline.errors import InvalidRecordError
from pipeline.records import RegionFeatures, labels_from_probs, validate_record
from pipeline.store.buffer import pad_regions


def _simple() -> RegionFeatures:
    boxes = np.array([[0, 0, 100, 50], [10, 20, 30, 60], [200, 100, 400, 300]], np.float32)
    return RegionFeatures(
        image_id="COCO_val2014_000000000042",
        image_h=300,
        image_w=400,
        boxes=boxes,
        features=np.arange(3 * 4, dtype=np.float32).reshape(3, 4),
    )


def test_derived_views_match_hand_computation():
    rec = _simple()
    np.testing.assert_allclose(
        rec.normalized_boxes(),
        [[0, 0, 0.25, 50 / 300], [10 / 400, 20 / 300, 30 / 400, 0.2], [0.5, 1 / 3, 1.0, 1.0]],
        rtol=1e-6,
    )
    # area / (W*H) without +1: 100*50/120000, 20*40/120000, 200*200/120000
    np.testing.assert_allclose(rec.spatial5()[:, 4], [5000 / 120000, 800 / 120000, 40000 / 120000], rtol=1e-6)
    np.testing.assert_allclose(rec.spatial5()[:, :4], rec.normalized_boxes(), rtol=1e-6)
    assert rec.num_boxes == 3


def test_labels_from_probs_skip_background_and_do_not_renormalize():
    prob = np.array([[0.9, 0.06, 0.04], [0.1, 0.3, 0.6]], np.float32)
    ids, conf = labels_from_probs(prob)
    assert ids.tolist() == [0, 1]  # 0-based over the non-background classes
    np.testing.assert_allclose(conf, [0.06, 0.6])


def test_valid_record_passes(rng):
    validate_record(
        make_record(rng, "a", feature_dim=2048, cls_dim=1601, attr_dim=401),
        feature_dim=2048,
        prob_dims={"cls_prob": 1601, "attr_prob": 401},
        float16=True,
    )


@pytest.mark.parametrize(
    "change, field, words",
    [
        (dict(image_id=""), "image_id", "non-empty"),
        (dict(image_id="a\tb"), "image_id", "tab"),
        (dict(image_h=0), "image_h", "positive"),
        (dict(boxes=np.zeros((3, 5), np.float32)), "boxes", "(N, 4)"),
        (dict(boxes=np.zeros((0, 4), np.float32)), "boxes", "no boxes"),
        (dict(boxes=np.array([[0, 0, 500, 10]] * 3, np.float32)), "boxes", "outside"),
        (dict(boxes=np.array([[50, 0, 10, 10]] * 3, np.float32)), "boxes", "x2 < x1"),
        (dict(boxes=np.array([[0, 0, np.nan, 10]] * 3, np.float32)), "boxes", "NaN"),
        (dict(features=np.zeros((2, 4), np.float32)), "features", "num_boxes=3"),
        (dict(features=np.full((3, 4), np.inf, np.float32)), "features", "infinite"),
        (dict(features=np.full((3, 4), 1e6, np.float32)), "features", "float16 range"),
        (dict(objects_id=np.zeros(3, np.int64)), "objects_id", "together"),
        (dict(objects_id=np.zeros(2, np.int64), objects_conf=np.zeros(2, np.float32)), "objects_id", "entries"),
        (dict(objects_id=np.zeros(3, np.int64), objects_conf=np.full(3, 1.5, np.float32)), "objects_conf", "[0, 1]"),
        (dict(objects_id=-np.ones(3, np.int64), objects_conf=np.zeros(3, np.float32)), "objects_id", "ids"),
        (dict(cls_prob=np.full((3, 5), -0.1, np.float32)), "cls_prob", "[0, 1]"),
        (dict(cls_prob=np.full((3, 9), 0.1, np.float32)), "cls_prob", "columns"),
        (dict(attr_prob=np.full((2, 5), 0.1, np.float32)), "attr_prob", "rows"),
        # Stored as int32 (Arrow) / uint32 (LMDB): a larger value used to fail at flush time,
        # aborting a whole import with "too large to fit in C integer type".
        (dict(image_h=99999999999), "image_h", "2**31"),
        (dict(image_w=np.uint64(2**31)), "image_w", "2**31"),
        (dict(image_h=True), "image_h", "positive integer"),
        (dict(objects_id=np.full(3, 2**40, np.int64), objects_conf=np.zeros(3, np.float32)), "objects_id", "2**31"),
        (dict(attrs_id=np.full(3, 2**32, np.uint64), attrs_conf=np.zeros(3, np.float32)), "attrs_id", "2**31"),
    ],
)
def test_invalid_records_name_image_and_field(change, field, words):
    rec = replace(_simple(), **change)
    with pytest.raises(InvalidRecordError) as info:
        validate_record(rec, feature_dim=4, prob_dims={"cls_prob": 5, "attr_prob": None}, float16=True)
    assert info.value.field == field
    assert words in str(info.value)
    assert repr(rec.image_id) in str(info.value)


def test_float64_values_beyond_float32_are_refused_for_a_float32_store():
    """They would be stored as inf, silently."""
    rec = replace(_simple(), features=np.full((3, 4), 1e300, np.float64))
    with pytest.raises(InvalidRecordError, match="features.*float32 range"):
        validate_record(rec, feature_dim=4)


def test_feature_dim_checked():
    with pytest.raises(InvalidRecordError, match="dim 4, store expects 2048"):
        validate_record(_simple(), feature_dim=2048)


def test_pad_regions_vilbert_style_with_img_token(rng):
    recs = [make_record(rng, "a", num_boxes=3, feature_dim=8), make_record(rng, "b", num_boxes=7, feature_dim=8)]
    batch = pad_regions(recs, max_regions=5, position="5d", img_token=True)
    assert batch.features.shape == (2, 6, 8) and batch.positions.shape == (2, 6, 5)
    assert batch.mask.tolist() == [[True] * 4 + [False] * 2, [True] * 6]
    assert batch.slots_used.tolist() == [4, 6]
    np.testing.assert_allclose(batch.features[0, 0], recs[0].features.mean(0), rtol=1e-6)
    np.testing.assert_allclose(batch.features[1, 0], recs[1].features[:5].mean(0), rtol=1e-6)  # the 5 it gets of 7
    assert batch.positions[0, 0].tolist() == [0, 0, 1, 1, 1]
    np.testing.assert_allclose(batch.positions[0, 1:4], recs[0].spatial5())
    np.testing.assert_allclose(batch.features[1, 1:], recs[1].features[:5])
    assert (batch.features[0, 4:] == 0).all() and (batch.positions[0, 4:] == 0).all()
    assert batch.objects_id[0, 0] == -1 and batch.objects_id[0, 4] == -1
    assert batch.objects_id[0, 1:4].tolist() == recs[0].objects_id.tolist()
    assert batch.cls_prob.shape == (2, 6, 11)


def test_pad_regions_lxmert_style_and_missing_optional_fields(rng):
    recs = [
        make_record(rng, "a", num_boxes=2, feature_dim=4, cls_dim=None, labels=False),
        make_record(rng, "b", num_boxes=2, feature_dim=4),
    ]
    batch = pad_regions(recs, max_regions=3, position="4d")
    assert batch.positions.shape == (2, 3, 4)
    np.testing.assert_allclose(batch.positions[1, :2], recs[1].normalized_boxes())
    assert batch.objects_id is None and batch.cls_prob is None  # not every record has them
    assert batch.attr_prob is not None
