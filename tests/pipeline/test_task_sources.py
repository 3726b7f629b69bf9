"""The readers of the downstream tasks' official files: VQA test questions, GQA
without answers, NLVR2, the Karpathy splits, RefCOCO's refs + instances, VCR. Each test
writes small files in the official format; malformed rows are named file:where and counted."""

import json
import os
import pickle

import numpy as np
import pytest
from helpers import run_cli

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.sources.base import EMPTY_TEXT, NULL_ANSWER, NULL_TEXT, Malformed, Skip
from pipeline.sources.coco import coco_split
from pipeline.sources.gqa import GqaQuestion, read_questions
from pipeline.sources.karpathy import KarpathyImage, read_karpathy
from pipeline.sources.nlvr2 import Nlvr2Example, read_nlvr2
from pipeline.sources.refcoco import RefExpression, read_refs
from pipeline.sources.vcr import NAMES, VcrQuestion, read_vcr, read_vcr_metadata, render_tokens
from pipeline.sources.vqa import VqaQuestion, read_vqa, read_vqa_questions


def dump(path, obj):
    path.write_text(json.dumps(obj))
    return path


def lines(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def bad(results):
    return [str(r) for r in results if isinstance(r, Malformed)]


# -- VQA


def test_vqa_pair_carries_ids_and_annotation_fields(tmp_path):
    questions = dump(
        tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json",
        {
            "questions": [
                {"image_id": 42, "question": " What  color? ", "question_id": 420},
                {"image_id": 42, "question": "Why?", "question_id": "421"},
            ]
        },
    )  # a question id that is not an integer
    annotations = dump(
        tmp_path / "v2_mscoco_val2014_annotations.json",
        {
            "annotations": [
                {
                    "question_id": 420,
                    "answers": [{"answer": "red"}, {"answer": None}],
                    "question_type": "what color is the",
                    "answer_type": "other",
                    "multiple_choice_answer": "red",
                }
            ]
        },
    )
    results = list(read_vqa(questions, annotations))
    assert results[0] == VqaQuestion(
        "COCO_val2014_000000000042", "What color?", ("red",), 420, "what color is the", "other", "red"
    )
    assert bad(results) == [
        "v2_OpenEnded_mscoco_val2014_questions.json:questions[1]: needs an integer image_id, "
        "question and an integer question_id"
    ]


@pytest.mark.parametrize(
    "name", ["v2_OpenEnded_mscoco_test-dev2015_questions.json", "v2_OpenEnded_mscoco_test2015_questions.json"]
)
def test_vqa_test_questions_are_read_without_annotations(tmp_path, name):
    """test-dev's images are test2015 images: both files name them COCO_test2015_<id>."""
    path = dump(
        tmp_path / name,
        {
            "questions": [
                {"image_id": 1, "question": "Is it?", "question_id": 10},
                {"image_id": 1, "question": "  ", "question_id": 11},
                {"image_id": "x", "question": "Bad?", "question_id": 12},
            ]
        },
    )
    results = list(read_vqa_questions(path))
    assert results[:2] == [
        VqaQuestion("COCO_test2015_000000000001", "Is it?", (), 10, "", "", ""),
        Skip("COCO_test2015_000000000001", EMPTY_TEXT),
    ]
    assert bad(results) == [f"{name}:questions[2]: needs an integer image_id, question and an integer question_id"]
    assert coco_split(name) == "test2015"
    with pytest.raises(ConfigError, match="cannot tell the COCO split"):
        list(read_vqa_questions(dump(tmp_path / "questions.json", {"questions": []})))


# -- GQA


def test_gqa_questions_carry_their_id_and_may_have_no_answer(tmp_path):
    path = dump(
        tmp_path / "testdev_balanced_questions.json",
        {
            "201307251": {"imageId": "n15740", "question": "Is the  sky blue?", "answer": "yes"},
            "201307252": {"imageId": "n15740", "question": "What is it?"},  # submission files: no answer
            "201307253": {"imageId": "n15740", "question": "Who?", "answer": None},
            "201307254": {"question": "No image?"},
        },
    )
    results = list(read_questions(path))
    assert results[:3] == [
        GqaQuestion("n15740", "Is the sky blue?", "yes", "201307251"),
        GqaQuestion("n15740", "What is it?", None, "201307252"),
        Skip("n15740", NULL_ANSWER),
    ]
    assert bad(results) == ['testdev_balanced_questions.json:["201307254"]: needs imageId and question']
    kept = list(read_questions(path, answers_required=False))
    assert kept[2] == GqaQuestion("n15740", "Who?", None, "201307253") and len(bad(kept)) == 1


# -- NLVR2


def test_nlvr2_examples_labels_and_image_names(tmp_path):
    path = lines(
        tmp_path / "dev.json",
        [
            {
                "identifier": "dev-850-0-0",
                "sentence": " One  dog. ",
                "left_url": "http://l",
                "right_url": "http://r",
                "label": "True",
                "writer": "x",
            },
            {"identifier": "train-10171-0-1", "sentence": "Two.", "label": False, "directory": 41},  # image release
            {"identifier": "test1-0-1-0", "sentence": "Three."},  # no label
            {"identifier": "dev-850-0-2", "sentence": None, "label": "false"},
            {"identifier": "dev-850-0-3", "sentence": "x", "label": "Maybe"},
            {"identifier": "nodash", "sentence": "x"},
            "",
            "{not json",
            {"identifier": "dev-850-0-4", "sentence": "x", "left_url": 3.5},
        ],
    )
    results = list(read_nlvr2(path))
    first, second, third = results[:3]
    assert first == Nlvr2Example(
        "dev-850-0-0", "One dog.", "dev-850-0-img0", "dev-850-0-img1", "http://l", "http://r", True, ""
    )
    assert (first.pair, first.split) == ("dev-850-0", "dev")
    assert (second.left_image, second.left_url, second.label, second.directory, second.split) == (
        "train-10171-0-img0",
        "",
        False,
        "41",
        "train",
    )
    assert third.label is None and third.right_image == "test1-0-1-img1"
    assert bad(results) == [
        'dev.json:4: label must be "True" or "False", not \'false\'',
        'dev.json:5: label must be "True" or "False", not \'Maybe\'',
        "dev.json:6: needs identifier (split-set-pair-sentence)",
        "dev.json:8: invalid JSON: Expecting property name enclosed in double quotes",
        "dev.json:9: left_url, right_url and directory must be strings when given",
    ]
    lines(path, [{"identifier": "dev-850-0-2", "sentence": " ", "label": True}, {"identifier": "dev-850-0-3"}])
    blank, null = read_nlvr2(path)
    assert blank.sentence == Skip("dev-850-0", EMPTY_TEXT) and blank.label is True
    assert null.sentence == Skip("dev-850-0", NULL_TEXT) and null.left_image == "dev-850-0-img0"
    assert bad(read_nlvr2(path, urls_required=True)) == [
        f"dev.json:{n}: needs left_url and right_url (the URL release)" for n in (1, 2)
    ]


# -- Karpathy splits


def test_karpathy_splits_and_blank_captions(tmp_path):
    def image(filename, split, raws, first=10, **more):
        return {
            "filename": filename,
            "split": split,
            "imgid": 0,
            "sentids": [],
            "sentences": [{"raw": r, "tokens": [], "sentid": first + j, "imgid": 0} for j, r in enumerate(raws)],
            **more,
        }

    path = dump(
        tmp_path / "dataset_coco.json",
        {
            "dataset": "coco",
            "images": [
                image(
                    "COCO_val2014_000000391895.jpg",
                    "test",
                    ["A man  riding.", " ", None, "A bike."],
                    filepath="val2014",
                    cocoid=391895,
                ),
                image("COCO_val2014_000000000042.jpg", "restval", ["x"], first=20, filepath="val2014"),
                image("1000092795.jpg", "train", ["Two guys."], first=30),
                image("3.jpg", "holdout", ["x"]),
                {"filename": "4.jpg", "split": "val", "sentences": [{"raw": "no sentid"}]},
            ],
        },
    )
    results = list(read_karpathy(path))
    stem = "COCO_val2014_000000391895"
    assert results[:2] == [Skip(stem, EMPTY_TEXT), Skip(stem, NULL_TEXT)]  # counted, before their image
    assert results[2:5] == [
        KarpathyImage(stem, "test", ("A man riding.", "A bike."), (10, 13)),
        KarpathyImage("COCO_val2014_000000000042", "restval", ("x",), (20,)),
        KarpathyImage("1000092795", "train", ("Two guys.",), (30,)),
    ]
    reason = "needs filename, split (train | val | test | restval) and sentences (objects with an integer sentid)"
    assert bad(results) == [f"dataset_coco.json:images[3]: {reason}", f"dataset_coco.json:images[4]: {reason}"]


# -- RefCOCO


def instances_file(tmp_path):
    return dump(
        tmp_path / "instances.json",
        {
            "images": [
                {"id": 9, "file_name": "COCO_train2014_000000000009.jpg", "width": 640, "height": 480},
                {"id": 25, "file_name": "COCO_train2014_000000000025.jpg", "width": 500, "height": 375},
                {"file_name": "no id.jpg"},
            ],
            "annotations": [
                {"id": 100, "image_id": 9, "bbox": [10.0, 20.0, 30.5, 40.0], "category_id": 1},
                {"id": 200, "image_id": 25, "bbox": [1, 2, 3, 4], "category_id": 3},
                {"id": 300, "image_id": 25, "bbox": [1, 2]},
            ],
            "categories": [{"id": 1, "name": "person"}],
        },
    )


def ref(ref_id, ann_id, image_id, sentences, split="train"):
    return {
        "ref_id": ref_id,
        "ann_id": ann_id,
        "image_id": image_id,
        "split": split,
        "category_id": 1,
        "file_name": f"COCO_train2014_{image_id:012d}_{ann_id}.jpg",
        "sent_ids": [s[0] for s in sentences],
        "sentences": [{"sent": text, "raw": text, "tokens": [], "sent_id": sid} for sid, text in sentences],
    }


def test_refcoco_expressions_with_boxes_from_instances(tmp_path):
    refs = tmp_path / "refs(unc).p"
    refs.write_bytes(
        pickle.dumps(
            [
                ref(1, 100, 9, [(11, "man  on the left"), (12, "  ")], split="testA"),
                ref(2, 200, 25, [(21, "the car")], split="val"),
                {"ref_id": 3, "image_id": 9},  # missing fields
                ref(4, 999, 9, [(41, "gone")]),  # an annotation instances.json lacks
                ref(5, 200, 9, [(51, "wrong image")]),  # annotation 200 is of image 25
            ],
            protocol=2,
        )
    )
    results = list(read_refs(refs, instances_file(tmp_path)))
    assert [r for r in results if not isinstance(r, Malformed)] == [
        RefExpression(
            1, 11, "testA", "COCO_train2014_000000000009", 9, 100, "man on the left", (10.0, 20.0, 40.5, 60.0), 640, 480
        ),
        Skip("COCO_train2014_000000000009", EMPTY_TEXT),
        RefExpression(2, 21, "val", "COCO_train2014_000000000025", 25, 200, "the car", (1.0, 2.0, 4.0, 6.0), 500, 375),
    ]
    assert bad(results) == [
        "instances.json:images[2]: needs an integer id, file_name, width and height",
        "instances.json:annotations[2]: needs an integer id and image_id and a bbox [x, y, w, h]",
        "refs(unc).p:[2]: needs integer ref_id, ann_id and image_id, a split and sentences (objects with an integer "
        "sent_id)",
        "refs(unc).p:[3]: annotation 999 of image 9 is not in instances.json",
        "refs(unc).p:[4]: annotation 200 of image 9 is not in instances.json",
    ]


class _Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_hostile_refs_pickle_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "pwned"
    refs = tmp_path / "refs(umd).p"
    refs.write_bytes(pickle.dumps([ref(1, 100, 9, [(11, "x")]), _Hostile(marker)], protocol=2))
    with pytest.raises(UnsafePickleError, match=r"refs\(umd\)\.p: refused to load"):
        list(read_refs(refs, instances_file(tmp_path)))
    assert not marker.exists()
    refs.write_bytes(pickle.dumps({"not": "a list"}, protocol=2))
    with pytest.raises(ConfigError, match="not a refs file"):
        list(read_refs(refs, instances_file(tmp_path)))


@pytest.mark.parametrize("content", ["hostile", "truncated"])
def test_build_task_names_a_refused_refs_pickle_in_one_line(tmp_path, content):
    """The command's answer to a refused or unreadable refs(unc).p: one `error:` line naming the
    file, exit 2, nothing written (not a traceback)."""
    marker = tmp_path / "pwned"
    refs = tmp_path / "refs(unc).p"
    good = pickle.dumps([ref(1, 100, 9, [(11, "x")])], protocol=2)
    hostile = pickle.dumps([ref(1, 100, 9, [(11, "x")]), _Hostile(marker)], protocol=2)
    refs.write_bytes(hostile if content == "hostile" else good[: len(good) // 2])
    out = tmp_path / "task"
    proc = run_cli("build-task", "--task", "refcoco+", "--out", out, refs, instances_file(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error:") and "refs(unc).p" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists() and not out.exists()


# -- VCR


def vcr_line(**changes):
    row = {
        "annot_id": "val-0",
        "objects": ["person", "person", "car"] + ["person"] * 14,
        "img_fn": "lsmdc_1054_Harry_Potter/1054_Harry_Potter_00.01.46.736-00.01.50.168@0.jpg",
        "metadata_fn": "lsmdc_1054_Harry_Potter/1054_Harry_Potter_00.01.46.736-00.01.50.168@0.json",
        "question": ["Why", "is", [0], "looking", "at", [1, 2], "?"],
        "answer_choices": [["Because", [1], "is", "loud", "."], ["No", "."], ["Yes", "."], [[16], "waves", "."]],
        "rationale_choices": [["It", "is", "."]] * 4,
        "answer_label": 0,
        "rationale_label": 3,
    }
    row.update(changes)
    return row


def test_vcr_tags_render_as_names_and_class_names(tmp_path):
    test_row = vcr_line(annot_id="test-0")
    del test_row["answer_label"], test_row["rationale_label"]
    path = lines(tmp_path / "val.jsonl", [vcr_line(), test_row])
    question, test_question = read_vcr(path)
    assert question == VcrQuestion(
        "val-0",
        "lsmdc_1054_Harry_Potter/1054_Harry_Potter_00.01.46.736-00.01.50.168@0",
        "lsmdc_1054_Harry_Potter/1054_Harry_Potter_00.01.46.736-00.01.50.168@0.json",
        ("person", "person", "car") + ("person",) * 14,
        "Why is Casey looking at Riley and car ?",
        ("Because Riley is loud .", "No .", "Yes .", "Riley waves ."),
        ("It is .",) * 4,
        0,
        3,
    )
    assert NAMES[16 % len(NAMES)] == "Riley"  # names cycle past the list's 15
    assert (test_question.answer_label, test_question.rationale_label) == (None, None)
    assert render_tokens(["a", [2, 0, 1], "b"], ("person", "person", "dog")) == "a dog and Casey and Riley b"


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"answer_label": 4}, "label 4 is not in 0-3"),
        ({"rationale_label": "1"}, "label '1' is not in 0-3"),
        ({"answer_choices": [["a"]] * 3}, "needs 4 answer and 4 rationale choices"),
        ({"question": ["Is", [17], "?"]}, "tag 17 is not an index of the 17 objects"),
        ({"question": ["Is", [], "?"]}, "token [] is neither a word nor a list of object indices"),
        ({"question": []}, "a text needs a non-empty list of tokens"),
        ({"img_fn": None}, "needs annot_id, img_fn and objects (a list of class names)"),
    ],
)
def test_vcr_malformed_lines_are_named_and_counted(tmp_path, changes, reason):
    path = lines(tmp_path / "train.jsonl", [vcr_line(), vcr_line(**changes), "[1, 2"])
    results = list(read_vcr(path))
    assert isinstance(results[0], VcrQuestion)
    assert bad(results) == [f"train.jsonl:2: {reason}", "train.jsonl:3: invalid JSON: Expecting ',' delimiter"]


def test_vcr_metadata_gives_boxes_for_given_boxes(tmp_path):
    path = dump(
        tmp_path / "meta.json",
        {
            "boxes": [[1, 2, 30.5, 40, 0.99], [5, 6, 7, 8, 0.5]],
            "names": ["person", "car"],
            "width": 1920,
            "height": 800,
            "segms": [[], []],
        },
    )
    boxes, names, width, height = read_vcr_metadata(path)
    assert boxes.dtype == np.float32 and boxes.tolist() == [[1, 2, 30.5, 40], [5, 6, 7, 8]]
    assert (names, width, height) == (("person", "car"), 1920, 800)
    assert read_vcr_metadata(dump(path, {"boxes": [], "names": [], "width": 1, "height": 1})).boxes.shape == (0, 4)
    with pytest.raises(ConfigError, match="not a VCR metadata file"):
        read_vcr_metadata(dump(path, {"boxes": [[1, 2, 3, 4, 1]], "names": [], "width": 1, "height": 1}))
