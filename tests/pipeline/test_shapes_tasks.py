"""The shapes world's task files (`pipeline.synthetic.tasks`): Flickr30k retrieval (Karpathy
format), NLVR2 image names in the image map, RefCOCO+ refs and instances, VCR — each parsed in
its format and checked against the scenes' ground truth. Byte-identity for the same seed is
test_shapes.py's (it walks every file)."""

import json
from collections import Counter

import numpy as np
import pytest

from pipeline.datasets import read_items
from pipeline.safe_pickle import safe_loads
from pipeline.synthetic import generate_scene, load_scenes, write_world
from pipeline.synthetic.scenes import COLORS, SHAPES
from pipeline.synthetic.tasks import retrieval_captions, tokens, vcr_question

N_IMAGES, SEED, N_TRAIN, N_VAL = 12, 5, 9, 3


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("shapes_tasks") / "world"
    summary = write_world(out, N_IMAGES, SEED, val_fraction=0.25)
    assert (summary["splits"]["train"]["images"], summary["splits"]["val"]["images"]) == (N_TRAIN, N_VAL)
    return out, summary


def load(path):
    return json.loads(path.read_text())


def image_map(out):
    return dict(line.split("\t") for line in (out / "image_map.tsv").read_text().splitlines())


def scene_of(out, coco_file_name):
    """The ground-truth scene of an image named by its COCO file name, via image_map.tsv."""
    _, split, i = image_map(out)[coco_file_name[:-4]].split("-")
    return list(load_scenes(out, split).values())[int(i)]


def test_retrieval_split_has_five_captions_per_image(world):
    out, summary = world
    data = load(out / "annotations/dataset_flickr30k.json")
    assert data["dataset"] == "flickr30k"
    images = data["images"]
    assert Counter(img["split"] for img in images) == {"train": N_TRAIN, "val": N_VAL}
    assert [img["imgid"] for img in images] == list(range(N_IMAGES))
    sentids = [s["sentid"] for img in images for s in img["sentences"]]
    assert sentids == list(range(5 * N_IMAGES))
    coco = {}
    for split in ("train", "val"):
        captions = load(out / f"annotations/captions_{split}2014.json")
        names = {img["id"]: img["file_name"] for img in captions["images"]}
        for ann in captions["annotations"]:
            coco.setdefault(names[ann["image_id"]], []).append(ann["caption"])
    for img in images:
        assert len(img["sentences"]) == 5 and img["sentids"] == [s["sentid"] for s in img["sentences"]]
        raws = [s["raw"] for s in img["sentences"]]
        assert raws[: len(coco[img["filename"]])] == coco[img["filename"]]  # the COCO captions first
        for s in img["sentences"]:
            assert s["imgid"] == img["imgid"] and s["tokens"] == s["raw"].replace(",", "").split()
        assert img["filename"][:-4] in image_map(out)
    for split in ("train", "val"):
        assert summary["splits"][split]["retrieval_captions"] == 5 * summary["splits"][split]["retrieval_images"]


def test_retrieval_captions_are_exactly_five_and_keep_the_coco_ones():
    for seed in range(40):
        scene = generate_scene(np.random.default_rng(seed))
        drawn = retrieval_captions(scene, [], np.random.default_rng(seed))
        assert len(set(drawn)) == len(drawn) == 5  # every scene offers five distinct captions
        assert retrieval_captions(scene, ["x", "y"], np.random.default_rng(seed))[:2] == ["x", "y"]
    assert tokens("Two circles, both red.") == ["two", "circles", "both", "red"]


def test_retrieval_captions_repeat_only_when_the_scene_offers_no_more(monkeypatch):
    monkeypatch.setattr("pipeline.synthetic.tasks.captions", lambda scene, rng: ["b"])
    assert retrieval_captions(generate_scene(np.random.default_rng(0)), ["a"], np.random.default_rng(0)) == [
        "a",
        "b",
        "a",
        "b",
        "a",
    ]


def test_every_nlvr2_image_name_is_mapped_to_its_image(world):
    out, _ = world
    mapping = image_map(out)
    for nlvr2, split in (("train", "train"), ("dev", "val")):
        rows = [json.loads(line) for line in (out / f"annotations/nlvr2_{nlvr2}.json").read_text().splitlines()]
        items = list(read_items("nlvr2", [out / f"annotations/nlvr2_{nlvr2}.json"]))
        assert rows and {item.image_id for item in items} <= set(mapping)
        for row in rows:
            pair = row["identifier"].rsplit("-", 1)[0]
            for side, url in (("img0", row["left_url"]), ("img1", row["right_url"])):
                i = int(url.rsplit("_", 1)[1][:-4])  # .../images/shapes_<split>_<i:08d>.jpg
                assert mapping[f"{pair}-{side}"] == f"cc3m-{split}-{i:08d}"
    names = [line.split("\t")[0] for line in (out / "image_map.tsv").read_text().splitlines()]
    assert names[:N_IMAGES] == [f"COCO_train2014_{i + 1:012d}" for i in range(N_TRAIN)] + [
        f"COCO_val2014_{i + 1:012d}" for i in range(N_VAL)
    ]  # the COCO lines come first, as before
    assert len(names) == len(set(names)) > N_IMAGES


def test_refcoco_refs_name_their_objects_boxes_and_expressions(world):
    out, summary = world
    refs = safe_loads((out / "annotations/refcoco+/refs(unc).p").read_bytes())
    instances = load(out / "annotations/refcoco+/instances.json")
    assert [c["name"] for c in instances["categories"]] == list(SHAPES)
    images = {img["id"]: img for img in instances["images"]}
    assert len(images) == N_IMAGES and all(img["file_name"][:-4] in image_map(out) for img in images.values())
    anns = {ann["id"]: ann for ann in instances["annotations"]}
    assert len(anns) == summary["splits"]["train"]["objects"] + summary["splits"]["val"]["objects"]
    expressions = {}  # (COCO file name, box) -> the object's expressions in refexp_<split>.json
    for split, coco in (("train", "train2014"), ("val", "val2014")):
        for ref in load(out / f"annotations/refexp_{split}.json"):
            i = int(ref["image"][-12:-4])
            expressions.setdefault((f"COCO_{coco}_{i + 1:012d}.jpg", tuple(ref["box"])), []).append(ref["sentence"])
    assert len(refs) == len(expressions) == sum(summary["splits"][s]["refcoco_refs"] for s in ("train", "val"))
    assert len({r["ref_id"] for r in refs}) == len(refs)
    for ref in refs:
        ann, image = anns[ref["ann_id"]], images[ref["image_id"]]
        assert ann["image_id"] == ref["image_id"] and ann["category_id"] == ref["category_id"]
        assert ref["file_name"] == f"{image['file_name'][:-4]}_{ann['id']}.jpg"
        x, y, w, h = ann["bbox"]
        obj = next(o for o in scene_of(out, image["file_name"]).objects if o.box == (x, y, x + w, y + h))
        assert SHAPES[ann["category_id"] - 1] == obj.shape and ann["area"] == w * h and ann["iscrowd"] == 0
        assert [s["raw"] for s in ref["sentences"]] == expressions[(image["file_name"], obj.box)]
        assert ref["sent_ids"] == [s["sent_id"] for s in ref["sentences"]]
        assert all(s["tokens"] == s["sent"].split() == s["raw"].split() for s in ref["sentences"])
        i = ref["image_id"] - 1_000_001  # val image i has image id 1_000_000 + i + 1, train ones ids below
        assert ref["split"] == ("train" if i < 0 else ("val", "testA", "testB")[i % 3])
        assert image["file_name"].startswith("COCO_train" if i < 0 else "COCO_val")
    assert {r["split"] for r in refs} == {"train", "val", "testA", "testB"}


def test_vcr_questions_point_at_the_true_colour(world):
    out, summary = world
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        rows = [json.loads(line) for line in (out / f"annotations/vcr/{split}.jsonl").read_text().splitlines()]
        assert (
            [r["annot_id"] for r in rows]
            == [f"{split}-{i}" for i in range(n)]
            == [f"{split}-{i}" for i in range(summary["splits"][split]["vcr_questions"])]
        )
        for row in rows:
            scene = scene_of(out, row["img_fn"])
            meta = load(out / "annotations/vcr/metadata" / row["metadata_fn"])
            assert row["metadata_fn"] == row["img_fn"][:-4] + ".json"
            assert meta["names"] == row["objects"] == [o.shape for o in scene.objects]
            assert meta["boxes"] == [[*o.box, 1.0] for o in scene.objects] and meta["width"] == scene.width
            texts = [row["question"], *row["answer_choices"], *row["rationale_choices"]]
            indices = [k for t in texts for part in t if isinstance(part, list) for k in part]
            assert indices and all(0 <= k < len(row["objects"]) for k in indices)
            [i] = row["question"][3]
            color = scene.objects[i].color
            answers = [a[2] for a in row["answer_choices"]]
            assert len(set(answers)) == 4 and set(answers) <= set(COLORS) and answers[row["answer_label"]] == color
            rationales = [(r[1][0], r[5]) for r in row["rationale_choices"]]
            assert rationales[row["rationale_label"]] == (i, color)
            assert len({(row["objects"][j], c) for j, c in rationales}) == 4  # distinct with indices read as names


def test_vcr_labels_are_uniformly_placed_and_choices_distinct():
    labels = Counter()
    for seed in range(400):
        scene = generate_scene(np.random.default_rng(seed))
        q = vcr_question(scene, np.random.default_rng(seed))
        labels.update([("answer", q["answer_label"]), ("rationale", q["rationale_label"])])
        assert len({tuple(a) for a in q["answer_choices"]}) == 4
        assert len({(scene.objects[r[1][0]].shape, r[5]) for r in q["rationale_choices"]}) == 4
    assert sorted(labels) == [(kind, k) for kind in ("answer", "rationale") for k in range(4)]
    assert all(60 <= n <= 140 for n in labels.values())
