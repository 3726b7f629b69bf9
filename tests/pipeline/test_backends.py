"""The extraction backends' seam: the registry, every builder going through it, and BUTD's
outputs unchanged by a bit."""

import numpy as np
import pytest
from butd_golden import FIXTURE, outputs

from pipeline.detect.backends import BACKENDS, config_names, resolve


def test_butd_outputs_are_the_ones_from_before_the_seam():
    """Every pinned BUTD run (shapes detector and random tiny one; butd, maxnms, given boxes;
    caffe and detectron2 resizes; batches of 1 and 3), through the model's own modules, gives the
    arrays it gave before extraction had backends, bit for bit."""
    expected = dict(np.load(FIXTURE))
    got = outputs("torch")
    assert sorted(got) == sorted(expected)
    differing = [k for k in expected if got[k].dtype != expected[k].dtype or not np.array_equal(got[k], expected[k])]
    assert not differing, differing[:10]


def relative_difference(got: np.ndarray, expected: np.ndarray) -> float:
    """The largest difference over the array's largest magnitude. Storing the array in float16
    moves its values by up to half a float16 step, 2**-11 (4.9e-4) of that magnitude."""
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    return float(np.abs(got.astype(np.float64) - expected).max()) / scale if scale else float(np.abs(got).max())


def test_butd_outputs_on_the_fast_cpu_path_are_within_the_stores_float16_rounding():
    """The same pinned runs through the fast CPU ROI head (`pipeline.detect.cpu`: res5 in oneDNN,
    ten proposals a unit; its arithmetic is not the modules', deliberately): the same regions
    with the same labels, the proposal boxes bit for bit (the backbone and RPN are the modules'
    at one thread), and every float array (features, probabilities, confidences, maxnms's
    regressed boxes) well within the store's float16 rounding of the fixture: at most 1e-5 of the
    array's largest value, where float16 rounds by up to 4.9e-4 (measured: 1.2e-6 at most)."""
    expected = dict(np.load(FIXTURE))
    got = outputs("fast")
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        have = got[key]
        assert have.dtype == want.dtype and have.shape == want.shape, key
        regressed = key.startswith(("shapes-maxnms/", "tiny-random-maxnms-d2/")) and key.endswith("/boxes")
        if want.dtype.kind != "f" or (key.endswith("/boxes") and not regressed):
            assert np.array_equal(have, want), key
        else:
            assert relative_difference(have, want) < 1e-5, key


def test_every_named_config_belongs_to_one_backend():
    names = config_names()
    assert {"vg-r101", "tiny", "shapes-tiny", "vinvl-x152c4", "grid-x152", "grid-x101", "grid-r50"} <= set(names)
    for name, backend in names.items():
        det = resolve(name)
        assert det.backend is backend and det.name == name
    assert [b.name for b in BACKENDS] == ["butd-c4", "vinvl-x152c4", "grid"]


def test_a_detector_json_names_its_backend(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text('{"backend": "grid", "name": "mine", "blocks": [1, 1, 1, 1], "groups": 1, "width_per_group": 4}')
    det = resolve(str(path))
    assert det.backend.name == "grid" and det.config.blocks == (1, 1, 1, 1)
    legacy = tmp_path / "old.json"  # a BUTD config written before backends: no "backend" key
    legacy.write_text('{"name": "old", "blocks": [1, 1, 1, 1], "num_classes": 3, "num_attributes": 0}')
    assert resolve(str(legacy)).backend.name == "butd-c4"


@pytest.mark.parametrize("name", ["vg-r101x", "vinvl", "grid"])
def test_an_unknown_detector_lists_the_known_ones(name):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="known: .*grid-x152.*vg-r101"):
        resolve(name)
