"""The extraction backends' seam: the registry, every builder going through it, and BUTD's
outputs unchanged by a bit."""

import numpy as np
import pytest
from butd_golden import FIXTURE, outputs

from pipeline.detect.backends import BACKENDS, config_names, resolve


def test_butd_outputs_are_the_ones_from_before_the_seam():
    """Every pinned BUTD run (shapes detector and random tiny one; butd, maxnms, given boxes;
    caffe and detectron2 resizes; batches of 1 and 3) gives the arrays it gave before extraction
    had backends, bit for bit."""
    expected = dict(np.load(FIXTURE))
    got = outputs()
    assert sorted(got) == sorted(expected)
    differing = [k for k in expected if got[k].dtype != expected[k].dtype or not np.array_equal(got[k], expected[k])]
    assert not differing, differing[:10]


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
