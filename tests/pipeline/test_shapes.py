"""The shapes world: determinism, scene invariants, language true of the scenes, our readers
on its files, and `vlprep make-shapes`."""

import io
import json
import re
from collections import Counter

import numpy as np
import pytest
from helpers import run_cli
from PIL import Image

from pipeline.datasets import Malformed, read_items
from pipeline.errors import ConfigError
from pipeline.items.answers import normalize_answer
from pipeline.mixture.sources import read_vqa
from pipeline.synthetic import (
    Background,
    Scene,
    SceneObject,
    generate_scene,
    load_scenes,
    render,
    write_cc_tsvs,
    write_world,
)
from pipeline.synthetic.scenes import (
    BACKGROUNDS,
    COLORS,
    GRADIENTS,
    RGB,
    SHAPES,
    SIZE_RANGE,
    SIZES,
    TEXTURES,
    occlusion_ok,
)
from pipeline.synthetic.words import NUMBER_WORDS
from pipeline.synthetic.world import JPEG_QUALITY

N_IMAGES, SEED = 30, 7


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes") / "world"
    return out, write_world(out, N_IMAGES, SEED)


def files_of(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def load(path):
    return json.loads(path.read_text())


# ----------------------------------------------------------------------------- a reading of the texts
# An independent interpretation of every template, on box centres without margins.

WORDS = {w: i for i, w in enumerate(NUMBER_WORDS)} | {"a": 1, "an": 1, "single": 1}
REL = r"(left of|to the left of|right of|to the right of|above|over|below|under|beneath)"
SIDE = {
    "left of": "left",
    "to the left of": "left",
    "right of": "right",
    "to the right of": "right",
    "above": "up",
    "over": "up",
    "below": "down",
    "under": "down",
    "beneath": "down",
}


def matching(scene, words):
    """Objects a phrase ('large red circle', 'red circles', 'red shapes', 'shapes') fits."""
    *attrs, noun = words.split()
    noun = noun[:-1] if noun.endswith("s") and noun[:-1] in SHAPES else noun
    return [
        o
        for o in scene.objects
        if noun in (o.shape, "shape", "shapes", "objects") and all(a in (o.color, o.size, o.texture) for a in attrs)
    ]


def the(scene, words):
    found = matching(scene, words)
    assert len(found) == 1, (words, scene)
    return found[0]


def side_of(a, b, side):
    (ax, ay), (bx, by) = a.center, b.center
    return {"left": ax < bx, "right": ax > bx, "up": ay < by, "down": ay > by}[side]


def only_one(scene, ref, rel, candidates):
    hits = [o for o in candidates if o is not ref and side_of(o, ref, SIDE[rel])]
    assert len(hits) == 1, (rel, ref, scene)
    return hits[0]


def yes(value):
    return "yes" if value else "no"


def answer_of(scene, q):
    """The answer our reading gives to a generated question (fails on an unknown template)."""
    counts = Counter(o.shape for o in scene.objects)
    if m := re.fullmatch(r"how many (.+?) (?:are there|are in the image|can you see)\?", q):
        return str(len(matching(scene, m[1])))
    if m := re.fullmatch(rf"what color is the shape {REL} the (.+)\?", q):
        return only_one(scene, the(scene, m[2]), m[1], scene.objects).color
    if m := re.fullmatch(rf"(?:what|which) shape is {REL} the (.+)\?", q):
        return only_one(scene, the(scene, m[2]), m[1], scene.objects).shape
    if m := re.fullmatch(r"(?:what color is|what is the color of|which color does) the (.+?)(?: have)?\?", q):
        return the(scene, m[1]).color
    if m := re.fullmatch(r"is there an? (.+?)(?: in the image| in the picture)?\?", q):
        return yes(matching(scene, m[1]))
    if m := re.fullmatch(r"are there (more|fewer) (\w+)s than (\w+)s\?", q):
        return yes(counts[m[2]] > counts[m[3]] if m[1] == "more" else counts[m[2]] < counts[m[3]])
    if m := re.fullmatch(r"are there any (.+)\?", q):
        return yes(matching(scene, m[1]))
    if m := re.fullmatch(r"is the (.+) (larger|bigger|smaller) than the (.+)\?", q):
        a, b = the(scene, m[1]), the(scene, m[3])
        assert a.size != b.size
        return yes((a.size == "large") == (m[2] != "smaller"))
    if m := re.fullmatch(rf"is the (.+?) {REL} the (.+)\?", q):
        return yes(side_of(the(scene, m[1]), the(scene, m[3]), SIDE[m[2]]))
    raise AssertionError(f"no reading of the question {q!r}")


COLOR = "|".join(COLORS)


def check_caption(scene, c):
    """Assert a generated caption is true of the scene (fails on an unknown template)."""
    counts = Counter(o.shape for o in scene.objects)
    c = re.sub(r" on a .+ background$", "", c)
    whole = re.sub(r"^an? .+ background with ", "", c)  # 'a beige background with three shapes'
    if m := re.fullmatch(rf"(?:a picture with |an image showing )?an? (.+?) {REL} an? (.+)", c):
        assert any(side_of(a, b, SIDE[m[2]]) for a in matching(scene, m[1]) for b in matching(scene, m[3])), c
    elif m := re.fullmatch(rf"(\w+) (\w+)s, (both|all) ({COLOR})", c):
        assert counts[m[2]] == WORDS[m[1]] and {o.color for o in matching(scene, m[2])} == {m[4]}, c
    elif m := re.fullmatch(rf"(\w+) (\w+)s, (\w+ (?:{COLOR})(?:(?:, | and )\w+ (?:{COLOR}))*)", c):
        told = {part.split()[1]: WORDS[part.split()[0]] for part in re.split(", | and ", m[3])}
        assert counts[m[2]] == WORDS[m[1]] and Counter(o.color for o in matching(scene, m[2])) == told, c
    elif re.fullmatch(r"the (only )?\w+ is \w+( and the (only )?\w+ is \w+)?", c):
        for shape, color in re.findall(r"the (?:only )?(\w+) is (\w+)", c):
            assert [o.color for o in scene.objects if o.shape == shape] == [color], c
    elif m := re.fullmatch(r"(\w+) (?:colorful )?shapes", whole):
        assert len(scene.objects) == WORDS[m[1]], c
    elif m := re.fullmatch(r"(?:a single|one) (.+)", c) or whole != c and re.fullmatch(r"an? (.+)", whole):
        assert len(scene.objects) == 1 and matching(scene, m[1]), c
    else:  # counts: 'there are two squares and a green star', 'a picture of ...'
        listed = re.sub(r"^(there (is|are)|a picture of) ", "", c)
        for part in re.split(", | and ", listed):
            number, rest = part.split(" ", 1)
            if rest.rstrip("s") in SHAPES and rest.endswith("s"):
                assert counts[rest[:-1]] == WORDS[number], c
            else:
                assert number in ("a", "an") and matching(scene, rest), c


def refexp_target(scene, sentence):
    """The one object our reading of a referring expression picks."""
    sides = {
        "on the left": "left",
        "on the right": "right",
        "at the top": "up",
        "at the bottom": "down",
        "leftmost": "left",
        "rightmost": "right",
        "topmost": "up",
        "bottommost": "down",
    }
    if m := re.fullmatch(r"the (.+) (on the left|on the right|at the top|at the bottom)", sentence):
        words, side = m[1], sides[m[2]]
    elif m := re.fullmatch(r"the (leftmost|rightmost|topmost|bottommost) (.+)", sentence):
        words, side = m[2], sides[m[1]]
    elif m := re.fullmatch(rf"the (\w+) {REL} the (.+)", sentence):
        return only_one(scene, the(scene, m[3]), m[2], matching(scene, m[1]))
    else:
        return the(scene, sentence[len("the ") :])
    group = matching(scene, words)
    hits = [o for o in group if all(side_of(o, g, side) for g in group if g is not o)]
    assert len(group) > 1 and len(hits) == 1, (sentence, scene)
    return hits[0]


def true_statement(left, right, s):
    count = {"left": lambda w: len(matching(left, w)), "right": lambda w: len(matching(right, w))}
    if m := re.fullmatch(r"the (left|right) image has (more|fewer) (\w+) than the (left|right) image", s):
        a, b = count[m[1]](m[3]), count[m[4]](m[3])
        return a > b if m[2] == "more" else a < b
    if m := re.fullmatch(r"both images contain an? (.+)", s):
        return bool(matching(left, m[1]) and matching(right, m[1]))
    if m := re.fullmatch(r"neither image contains an? (.+)", s):
        return not (matching(left, m[1]) or matching(right, m[1]))
    if m := re.fullmatch(r"there is an? (.+) in the (left|right) image", s):
        return count[m[2]](m[1]) > 0
    if m := re.fullmatch(r"the (left|right) image contains exactly (\w+) (\w+)", s):
        return count[m[1]](m[3]) == WORDS[m[2]]
    raise AssertionError(f"no reading of the statement {s!r}")


# ----------------------------------------------------------------------------- tests


def test_same_seed_gives_the_same_bytes_and_another_seed_differs(world, tmp_path):
    out, _ = world
    ours = files_of(out)
    write_world(tmp_path / "again", N_IMAGES, SEED)
    assert files_of(tmp_path / "again") == ours
    write_world(tmp_path / "again", N_IMAGES, SEED)  # an earlier world in the folder is replaced
    assert files_of(tmp_path / "again") == ours
    write_world(tmp_path / "other", N_IMAGES, SEED + 1)
    other = files_of(tmp_path / "other")
    assert other.keys() == ours.keys()
    differing = [name for name in ours if ours[name] != other[name]]
    assert sum(name.startswith("images/") for name in differing) == N_IMAGES


def test_layout_and_summary(world):
    out, summary = world
    train, val = summary["splits"]["train"], summary["splits"]["val"]
    assert (train["images"], val["images"]) == (27, 3)
    assert sorted(p.name for p in (out / "images").iterdir()) == [f"shapes_train_{i:08d}.jpg" for i in range(27)] + [
        f"shapes_val_{i:08d}.jpg" for i in range(3)
    ]
    for name in (
        "Train_GCC-training.tsv",
        "Validation_GCC-1.1.0-Validation.tsv",
        "image_map.tsv",
        "summary.json",
        "annotations/captions_val2014.json",
        "annotations/v2_mscoco_train2014_annotations.json",
        "annotations/v2_OpenEnded_mscoco_val2014_questions.json",
        "annotations/refexp_val.json",
        "annotations/nlvr2_dev.json",
        "annotations/scenes_train.json",
        "annotations/dataset_flickr30k.json",
        "annotations/refcoco+/refs(unc).p",
        "annotations/refcoco+/instances.json",
        "annotations/vcr/val.jsonl",
        "annotations/vcr/train.jsonl",
        "annotations/vcr/metadata/COCO_val2014_000000000003.json",
    ):
        assert (out / name).is_file(), name
    assert (out / "objects.txt").read_text().splitlines() == list(SHAPES)
    assert (out / "attributes.txt").read_text().splitlines() == [*COLORS, *SIZES, *TEXTURES]
    assert load(out / "summary.json") == summary and summary["seed"] == SEED
    assert train["captions"] >= 3 * 27 and train["questions"] >= 3 * 27 and train["refexps"] >= 27
    assert train["nlvr2_statements"] > 0 and val["nlvr2_statements"] > 0
    with Image.open(out / "images" / "shapes_val_00000002.jpg") as im:
        assert im.format == "JPEG" and im.size == (256, 256) and im.mode == "RGB"


def test_scene_invariants():
    for seed in range(300):
        scene = generate_scene(np.random.default_rng(seed))
        assert 1 <= len(scene.objects) <= 6
        for k, obj in enumerate(scene.objects):
            x1, y1, x2, y2 = obj.box
            assert 0 <= x1 < x2 <= scene.width and 0 <= y1 < y2 <= scene.height
            lo, hi = SIZE_RANGE[obj.size]
            assert lo * scene.width - 1 <= x2 - x1 <= hi * scene.width + 1 and x2 - x1 == y2 - y1
            assert occlusion_ok(obj.box, [o.box for o in scene.objects[:k]])
        assert set(scene.background.colors) <= set(BACKGROUNDS)
    assert SIZE_RANGE["small"][1] < SIZE_RANGE["large"][0]
    assert not occlusion_ok((10, 10, 20, 20), [(0, 0, 100, 100)])  # inside an earlier object
    assert not occlusion_ok((0, 0, 61, 100), [(30, 0, 130, 100)])  # covers 31 % of it
    assert occlusion_ok((0, 0, 60, 100), [(30, 0, 130, 100)])  # 30 % is allowed


def test_backgrounds_never_take_an_object_colour():
    def distance(rgb):
        return min(np.linalg.norm(np.asarray(rgb, float) - np.array(c)) for c in RGB.values())

    assert all(distance(rgb) > 90 for rgb in BACKGROUNDS.values())
    assert len(GRADIENTS) >= 5
    for a, b in GRADIENTS:
        for t in np.linspace(0, 1, 11):
            assert distance(np.array(BACKGROUNDS[a]) * (1 - t) + np.array(BACKGROUNDS[b]) * t) > 60


@pytest.mark.parametrize("shape", SHAPES)
def test_boxes_are_tight_around_the_drawn_shape(shape):
    bg = Background("solid", ("beige", "beige"), 0.0, 0)
    for texture, side in (("plain", 29), ("striped", 64)):
        obj = SceneObject(shape, "blue", "small", texture, (10.0, 20.0, 10.0 + side, 20.0 + side))
        pixels = np.asarray(render(Scene(128, 128, bg, (obj,)))).astype(int)
        ys, xs = np.nonzero(np.abs(pixels - np.array(BACKGROUNDS["beige"])).sum(2))
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == obj.box


def test_ground_truth_reloads_and_rerenders_to_the_same_jpeg(world):
    out, _ = world
    scenes = load_scenes(out, "val")
    assert list(scenes) == [f"shapes_val_{i:08d}.jpg" for i in range(3)]
    for name, scene in scenes.items():
        buf = io.BytesIO()
        render(scene).save(buf, "JPEG", quality=JPEG_QUALITY)
        assert buf.getvalue() == (out / "images" / name).read_bytes()
    with pytest.raises(ConfigError, match="not found"):
        load_scenes(out, "test")


def test_texts_are_true_of_their_scenes(world):
    out, _ = world
    for split, coco in (("train", "train2014"), ("val", "val2014")):
        scenes = list(load_scenes(out, split).values())
        for ann in load(out / f"annotations/captions_{coco}.json")["annotations"]:
            check_caption(scenes[ann["image_id"] - 1], ann["caption"])
        questions = {
            q["question_id"]: q
            for q in load(out / f"annotations/v2_OpenEnded_mscoco_{coco}_questions.json")["questions"]
        }
        for ann in load(out / f"annotations/v2_mscoco_{coco}_annotations.json")["annotations"]:
            q = questions[ann["question_id"]]
            assert answer_of(scenes[q["image_id"] - 1], q["question"]) == ann["multiple_choice_answer"], q
        by_name = load_scenes(out, split)
        for ref in load(out / f"annotations/refexp_{split}.json"):
            assert list(refexp_target(by_name[ref["image"]], ref["sentence"]).box) == ref["box"], ref


def test_nlvr2_statements_are_true_and_balanced(world):
    out, _ = world
    scenes = {**load_scenes(out, "train"), **load_scenes(out, "val")}
    labels = []
    for nlvr, split in (("train", "train"), ("dev", "val")):
        for line in (out / f"annotations/nlvr2_{nlvr}.json").read_text().splitlines():
            s = json.loads(line)
            assert re.fullmatch(rf"{nlvr}-\d+-0-\d", s["identifier"]) and s["label"] in ("True", "False")
            left, right = (scenes[s[k].rsplit("/", 1)[1]] for k in ("left_url", "right_url"))
            assert str(true_statement(left, right, s["sentence"])) == s["label"], s
            labels.append(s["label"] == "True")
    assert 0.3 <= np.mean(labels) <= 0.7


def test_language_has_variety_and_balanced_existence_questions(world):
    out, _ = world
    anns = load(out / "annotations/v2_mscoco_train2014_annotations.json")["annotations"]
    existence = [
        a["multiple_choice_answer"] == "yes" for a in anns if a["question_type"] in ("is there a", "are there")
    ]
    assert len(existence) > 20 and 0.3 <= np.mean(existence) <= 0.7
    assert {a["answer_type"] for a in anns} == {"yes/no", "number", "other"}
    assert len({a["question_type"] for a in anns}) >= 6
    captions = [a["caption"] for a in load(out / "annotations/captions_train2014.json")["annotations"]]
    assert len(set(captions)) > 0.8 * len(captions)
    assert any(re.search(REL, c) for c in captions) and any(re.search(r"\b(two|three)\b", c) for c in captions)
    raw = [a["answer"] for ann in anns for a in ann["answers"]]
    assert any(r != normalize_answer(r) for r in raw)  # some annotators wrote '2' as 'two', gray as 'grey', ...
    assert all(len(ann["answers"]) == 10 for ann in anns)


def test_files_load_through_our_readers(world):
    out, summary = world
    n_train = summary["splits"]["train"]["images"]
    tsvs = [out / "Train_GCC-training.tsv", out / "Validation_GCC-1.1.0-Validation.tsv"]
    cc = list(read_items("conceptual_captions", tsvs))
    assert not [r for r in cc if isinstance(r, Malformed)] and len(cc) == N_IMAGES
    assert [r.image_id for r in cc[:2]] == ["cc3m-train-00000000", "cc3m-train-00000001"]
    assert cc[n_train].image_id == "cc3m-val-00000000" and cc[n_train].split == "val"
    assert cc[1].url == "http://127.0.0.1:8000/images/shapes_train_00000001.jpg"

    coco = list(read_items("coco", [out / "annotations/captions_train2014.json"]))
    assert not [r for r in coco if isinstance(r, Malformed)] and len(coco) == n_train
    assert coco[0].image_id == "COCO_train2014_000000000001" and coco[0].split == "train2014"
    assert len(coco[0].texts) >= 3 and coco[0].url == cc[0].url
    assert cc[0].texts[0].text == coco[0].texts[0].text  # the TSV carries the first caption

    image_map = dict(line.split("\t") for line in (out / "image_map.tsv").read_text().splitlines())
    assert image_map["COCO_train2014_000000000001"] == "cc3m-train-00000000"
    assert image_map["COCO_val2014_000000000003"] == "cc3m-val-00000002"
    assert len(image_map) == N_IMAGES + 2 * (27 + 3)  # and the NLVR2 image names of each pair with statements

    nlvr = list(read_items("nlvr2", [out / "annotations/nlvr2_train.json"]))
    assert nlvr and not [r for r in nlvr if isinstance(r, Malformed)]
    assert nlvr[0].image_id == "train-0-0-img0" and nlvr[0].split == "train" and nlvr[0].texts[0].kind == "statement"

    items = list(
        read_vqa(
            out / "annotations/v2_OpenEnded_mscoco_train2014_questions.json",
            out / "annotations/v2_mscoco_train2014_annotations.json",
        )
    )
    anns = load(out / "annotations/v2_mscoco_train2014_annotations.json")["annotations"]
    assert len(items) == len(anns) == summary["splits"]["train"]["questions"]
    assert items[0].image == "COCO_train2014_000000000001" and items[0].kind == "question"
    for item, ann in zip(items, anns):
        assert item.answers[normalize_answer(ann["multiple_choice_answer"])] == 1.0
        assert all(0 < score <= 1 for score in item.answers.values())
    assert any(len(item.answers) > 1 for item in items)  # an annotator now and then disagrees


def test_cc_tsvs_can_be_rewritten_for_another_url(tmp_path):
    copy = tmp_path / "w"
    write_world(copy, 6, 1)
    before = files_of(copy)
    write_cc_tsvs(copy, "http://127.0.0.1:5555/")
    after = files_of(copy)
    rows = after["Train_GCC-training.tsv"].decode().splitlines()
    assert rows[0].endswith("\thttp://127.0.0.1:5555/images/shapes_train_00000000.jpg") and len(rows) == 5
    assert {k for k in before if before[k] != after[k]} == {
        "Train_GCC-training.tsv",
        "Validation_GCC-1.1.0-Validation.tsv",
    }


def test_no_textures_and_bad_arguments(tmp_path):
    summary = write_world(tmp_path / "plain", 5, 3, val_fraction=0.0, textures=False)
    assert summary["splits"]["val"]["images"] == 0
    assert {o.texture for s in load_scenes(tmp_path / "plain", "train").values() for o in s.objects} == {"plain"}
    assert (tmp_path / "plain" / "Validation_GCC-1.1.0-Validation.tsv").read_text() == ""
    for kwargs, message in (
        ({"n_images": 0}, "n-images"),
        ({"val_fraction": 1.0}, "val-fraction"),
        ({"seed": -1}, "seed"),
        ({"base_url": "ftp://x"}, "base-url"),
    ):
        with pytest.raises(ConfigError, match=message):
            write_world(tmp_path / "bad", **{"n_images": 4, "seed": 0, **kwargs})
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="notes.txt"):
        write_world(tmp_path / "busy", 3, 0)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"


def test_make_shapes_cli(tmp_path):
    proc = run_cli("make-shapes", "--out", tmp_path / "w", "--n-images", "8", "--seed", "2", "--val-fraction", "0.25")
    assert proc.returncode == 0, proc.stderr
    summary = load(tmp_path / "w" / "summary.json")
    assert summary["splits"]["train"]["images"] == 6 and summary["splits"]["val"]["images"] == 2
    assert "train: 6 images" in proc.stdout and str(tmp_path / "w") in proc.stdout.replace("\n", "")
    bad = run_cli("make-shapes", "--out", tmp_path / "bad", "--n-images", "0")
    assert bad.returncode != 0 and "--n-images must be at least 1" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "bad").exists()
    help_text = run_cli("make-shapes", "--help").stdout
    assert "Train_GCC-training.tsv" in help_text and "summary.json" in help_text
