"""The shapes world's Visual Genome files (`pipeline.synthetic.regions`): region descriptions in
VG's format, each phrase true of its region and boxed by it, read by our VG reader into a
mixture through the world's image maps; and the files the world had before them, unchanged."""

import hashlib
import json
import re

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.mixture import Mixture
from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.sources.visual_genome import VgImage, VgText, read_image_data, read_region_descriptions
from pipeline.synthetic import load_scenes, write_world
from pipeline.synthetic.world import VG_ID_BASE

N_IMAGES, SEED = 30, 7  # test_shapes.py's world
# sha256 over (path, sha256 of the bytes) of every file of write_world(30, seed 7) before the
# world had its vg/ folder: those files stay byte-identical.
BEFORE_VG = "f7f874cc73464854da0069d79f1c0e880e1679e91a671752ce08446eeefbf4f2"
REL = {"left of": "left", "to the left of": "left", "right of": "right", "to the right of": "right"}
REL |= {"above": "up", "over": "up", "below": "down", "under": "down", "beneath": "down"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes_vg") / "world"
    write_world(out, N_IMAGES, SEED)
    return out


def load(path):
    return json.loads(path.read_text())


def test_the_files_before_the_vg_ones_are_byte_identical(world):
    digest = hashlib.sha256()
    files = [p for p in sorted(world.rglob("*")) if p.is_file() and not p.relative_to(world).parts[0] == "vg"]
    for p in files:
        digest.update(p.relative_to(world).as_posix().encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    assert digest.hexdigest() == BEFORE_VG
    assert sorted(p.name for p in (world / "vg").iterdir()) == [
        "image_data.json",
        "image_map.tsv",
        "region_descriptions.json",
    ]


def _object_of(scene, words):
    """The objects a region's object phrase ('a large striped red circle', 'the circle is red') fits."""
    m = re.fullmatch(r"the (\w+) is (\w+)", words)
    if m:
        shape, attrs = m[1], [m[2]]
    else:
        *attrs, shape = re.sub(r"^(an?|the) | in the picture$", "", words).split()
    return [o for o in scene.objects if o.shape == shape and all(a in (o.color, o.size, o.texture) for a in attrs)]


def _clearly(a, b, side, margin):
    dx, dy = b.center[0] - a.center[0], b.center[1] - a.center[1]
    return {"left": dx, "right": -dx, "up": dy, "down": -dy}[side] > margin


def _box(region):
    return (region["x"], region["y"], region["x"] + region["width"], region["y"] + region["height"])


def _rounded(box):
    return tuple(round(v) for v in box)


def test_region_descriptions_are_true_of_their_regions_in_vgs_format(world):
    scenes = list(load_scenes(world, "train").values())
    entries = load(world / "vg" / "region_descriptions.json")
    assert [e["id"] for e in entries] == [VG_ID_BASE + i + 1 for i in range(len(scenes))]  # the train split's
    relations = 0
    for entry, scene in zip(entries, scenes):
        assert entry["regions"] and all(r["image_id"] == entry["id"] for r in entry["regions"])
        assert {"region_id", "image_id", "phrase", "x", "y", "width", "height"} == set(entry["regions"][0])
        for region in entry["regions"]:
            text = region["phrase"]
            m = re.fullmatch(rf"an? (\w+) (\w+) ({'|'.join(REL)}) an? (\w+) (\w+)", text)
            if m:  # a relation phrase: boxed by both objects, the relation clear on the box centres
                relations += 1
                pairs = [
                    (a, b)
                    for a in scene.objects
                    for b in scene.objects
                    if a is not b
                    and (a.color, a.shape, b.color, b.shape) == (m[1], m[2], m[4], m[5])
                    and _rounded(
                        (
                            min(a.box[0], b.box[0]),
                            min(a.box[1], b.box[1]),
                            max(a.box[2], b.box[2]),
                            max(a.box[3], b.box[3]),
                        )
                    )
                    == _box(region)
                ]
                assert any(_clearly(a, b, REL[m[3]], scene.margin) for a, b in pairs), (text, region, scene)
            else:  # an object phrase: boxed by an object it names
                fits = [o for o in _object_of(scene, text) if _rounded(o.box) == _box(region)]
                assert fits, (text, region, scene)
    assert relations > N_IMAGES // 2


def test_our_vg_readers_read_them(world):
    images = list(read_image_data(world / "vg" / "image_data.json"))
    assert all(isinstance(i, VgImage) and i.coco_id is None for i in images) and len(images) == 27
    texts = list(read_region_descriptions(world / "vg" / "region_descriptions.json"))
    assert all(isinstance(t, VgText) for t in texts) and len(texts) >= 2 * 27
    keys = dict(line.split("\t") for line in (world / "vg" / "image_map.tsv").read_text().splitlines())
    assert keys[str(VG_ID_BASE + 1)] == "cc3m-train-00000000" and len(keys) == 27


def test_the_lxmert_mixture_takes_them_through_both_image_maps(world, tmp_path):
    from vl_models.demo import MIXTURE_KINDS, MIXTURES, mixture_spec

    kinds = MIXTURE_KINDS[MIXTURES["lxmert"]]
    spec = mixture_spec(world, kinds)
    assert "vg_regions" in kinds and len(spec["image_map"]) == 2
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    manifest = build_mixture(MixtureSpec.load(tmp_path / "spec.yaml"), tmp_path / "mix")
    regions = sum(len(e["regions"]) for e in load(world / "vg" / "region_descriptions.json"))
    captions = len(load(world / "annotations" / "captions_train2014.json")["annotations"])
    assert manifest["totals"]["train/caption"] == captions + regions  # every phrase found its image
    mixture = Mixture.open(tmp_path / "mix")
    first = list(mixture.store_keys).index("cc3m-train-00000000")
    assert mixture.store_keys[first] == "cc3m-train-00000000"
    val_images = {mixture.store_keys[r] for r in mixture.rows("val")}
    assert val_images and all(k.startswith("cc3m-val-") for k in val_images)  # no region text of a held-out image


def test_two_image_maps_that_disagree_are_refused(world, tmp_path):
    from vl_models.demo import mixture_spec

    other = tmp_path / "other.tsv"
    other.write_text(f"{VG_ID_BASE + 1}\tcc3m-train-00000005\n")
    spec = mixture_spec(world, ("coco_captions", "vg_regions"))
    spec["image_map"].append(str(other))
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(
        ConfigError, match=r"other\.tsv: source id '1000001' maps to 'cc3m-train-00000005', but .*image_map\.tsv"
    ):
        build_mixture(MixtureSpec.load(tmp_path / "spec.yaml"), tmp_path / "mix")
