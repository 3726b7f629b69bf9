"""The official-file readers (`pipeline.sources`) against hostile and careless files: numbers
JSON does not allow (NaN, Infinity, overflowing floats), nesting too deep to decode, ids of
the wrong type or repeated, blank texts, a file of the wrong shape, and one huge streamed
member (linear time)."""

import gc
import json
import pickle

import pytest
from helpers import run_cli

from pipeline.errors import ConfigError
from pipeline.sources import jsonstream
from pipeline.sources.base import DUPLICATE_ID, EMPTY_TEXT, NON_FINITE, NULL_TEXT, TOO_DEEP, TOO_LONG, Malformed, Skip
from pipeline.sources.gqa import read_questions
from pipeline.sources.jsonstream import iter_json
from pipeline.sources.karpathy import KarpathyImage, read_karpathy
from pipeline.sources.lxmert import read_lxmert
from pipeline.sources.nlvr2 import read_nlvr2
from pipeline.sources.refcoco import annotation_boxes, read_refs
from pipeline.sources.vcr import VcrQuestion, read_vcr, read_vcr_metadata
from pipeline.sources.vqa import VqaQuestion, read_vqa
from vl_models import transfer
from vl_models.transfer.build import build_task

DEEP = "[" * 100_000  # RecursionError in Python's json


def write(path, text):
    path.write_text(text)
    return path


def lines(path, rows):
    """A JSON-lines file; a str row is written as it is (JSON the encoder would not write)."""
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def bad(results):
    return [str(r) for r in results if isinstance(r, Malformed)]


def skips(results):
    return [r for r in results if isinstance(r, Skip)]


# -- the JSON every reader reads: strict


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity"])
def test_a_streamed_member_with_a_non_finite_number_is_malformed_and_the_stream_goes_on(tmp_path, number):
    path = write(tmp_path / "a.json", f'{{"x": [1, {{"v": [0, {number}]}}, 3.5e2], "y": 2}}')
    assert list(iter_json(path, member="x")) == [
        (0, 1),
        (1, Malformed(path, "x[1]", NON_FINITE)),
        (2, 350.0),
    ]


def test_finite_numbers_that_look_large_are_kept(tmp_path):
    path = write(tmp_path / "a.json", '[1e-400, 1.5e300, "1e999", ' + "9" * 120 + "]")
    assert [v for _, v in iter_json(path)] == [0.0, 1.5e300, "1e999", int("9" * 120)]


def test_a_member_nested_too_deep_is_malformed_and_the_stream_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "_CHUNK", 4096)  # the deep member spans many reads
    deep = "[" * 5000 + '"]]} [{\\"", {"k": "}"}' + "]" * 5000
    path = write(tmp_path / "a.json", '{"images": [1, ' + deep + ', {"ok": true}]}')
    assert list(iter_json(path, member="images")) == [
        (0, 1),
        (1, Malformed(path, "images[1]", TOO_DEEP)),
        (2, {"ok": True}),
    ]
    write(path, '{"images": [1, ' + "[" * 5000 + "]")  # never closed
    with pytest.raises(ConfigError, match="a.json: invalid JSON: unterminated value at character"):
        list(iter_json(path, member="images"))


@pytest.mark.parametrize("chunk", [1, 1024])
def test_an_integer_of_too_many_digits_is_malformed_and_the_stream_goes_on(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(jsonstream, "_CHUNK", chunk)
    long = "7" * 5000  # Python refuses to convert more than 4,300 digits
    path = write(tmp_path / "a.json", f'[{long}, {{"a": [1, -{long}]}}, 2, {long}.5, 3]')
    assert list(iter_json(path)) == [
        (0, Malformed(path, "[0]", TOO_LONG)),
        (1, Malformed(path, "[1]", TOO_LONG)),
        (2, 2),
        (3, float(long + ".5")),
        (4, 3),
    ]
    lines_path = lines(tmp_path / "dev.json", ['{"identifier": "dev-1-0-0", "directory": ' + long + "}"])
    assert bad(read_nlvr2(lines_path)) == [f"dev.json:1: invalid JSON: {TOO_LONG}"]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 8])
def test_members_cut_anywhere_by_the_read_buffer_decode_whole(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(jsonstream, "_CHUNK", chunk)
    members = [0.5, -12.25e-1, 1e5, 123456789, 'caf\u00e9 \\ " ]}', [True, False, None], {"a": [1, {"b": ""}]}, -0.0]
    path = write(tmp_path / "a.json", json.dumps({"m": members, "n": 1}, ensure_ascii=True))
    assert [v for _, v in iter_json(path, member="m")] == members


def test_one_huge_member_is_decoded_in_linear_time(tmp_path, monkeypatch):
    """A member of many reads is decoded again only a logarithmic number of times (the old
    reader decoded it from its start after every read: quadratic)."""

    class Counting(json.JSONDecoder):
        chars = 0

        def raw_decode(self, s, idx=0):
            Counting.chars += len(s) - idx
            return super().raw_decode(s, idx)

    monkeypatch.setattr(jsonstream, "_CHUNK", 1024)
    member = [{"raw": f"caption {i}", "sentid": i} for i in range(8000)]
    path = write(tmp_path / "a.json", json.dumps([member]))
    size = path.stat().st_size
    reader = jsonstream._Reader(path)
    reader.decoder = Counting()
    reader.expect("[")
    assert reader.value() == member
    reader.close()
    assert size > 200 * 1024 and Counting.chars < 4 * size
    assert gc.isenabled()  # paused while a member of many reads is decoded, on again after


@pytest.mark.parametrize(
    "name, rows, reason",
    [
        ("val.jsonl", [DEEP], TOO_DEEP),
        ("val.jsonl", ['{"annot_id": "val-1", "x": NaN}'], NON_FINITE),
        ("dev.json", ['{"identifier": "dev-1-0-0", "x": [Infinity]}'], NON_FINITE),
    ],
)
def test_a_json_line_too_deep_or_with_a_non_finite_number_is_malformed(tmp_path, name, rows, reason):
    path = lines(tmp_path / name, [*rows, "[1"])
    read = read_vcr if name == "val.jsonl" else read_nlvr2
    assert bad(read(path)) == [f"{name}:1: invalid JSON: {reason}", f"{name}:2: invalid JSON: Expecting ',' delimiter"]


def test_a_hostile_value_is_shown_short_in_a_message(tmp_path):
    nested = "[" * 500 + "1" + "]" * 500
    path = lines(tmp_path / "dev.json", ['{"identifier": "dev-1-0-0", "label": ' + nested + "}"])
    (message,) = bad(read_nlvr2(path))
    assert message.startswith('dev.json:1: label must be "True" or "False", not [[') and len(message) < 120


@pytest.mark.parametrize("number", ["NaN", "-Infinity", "1e400", "9" * 400])
def test_vcr_metadata_with_a_non_finite_number_is_refused_by_name(tmp_path, number):
    path = write(
        tmp_path / "meta.json", f'{{"boxes": [[1, 2, {number}, 4, 0.9]], "names": ["a"], "width": 9, "height": 9}}'
    )
    with pytest.raises(ConfigError, match=r"meta.json: not (usable JSON|a VCR metadata file)"):
        read_vcr_metadata(path)


def test_lxmert_scores_that_overflow_are_a_null_answer(tmp_path):
    path = write(
        tmp_path / "mscoco_minival.json",
        '[{"img_id": "1", "sentf": {"vqa": ["Q?", "R?"]}, "labelf": {"vqa": [{"yes": 1e400}, {"no": 0.5}]}}, '
        '{"img_id": "2", "sentf": {"vqa": ["Q?"]}, "labelf": {"vqa": [{"yes": ' + "9" * 400 + "}]}}]",
    )
    results = list(read_lxmert(path))
    assert [type(r).__name__ for r in results] == ["Skip", "LxmertSentence", "Skip"]


# -- each reader


def vqa_pair(tmp_path, questions, annotations):
    q = write(tmp_path / "v2_OpenEnded_mscoco_val2014_questions.json", json.dumps({"questions": []}))
    a = write(tmp_path / "v2_mscoco_val2014_annotations.json", json.dumps({"annotations": []}))
    write(q, '{"questions": [' + ", ".join(questions) + "]}")
    write(a, '{"annotations": [' + ", ".join(annotations) + "]}")
    return q, a


def test_vqa_non_finite_numbers_list_ids_and_duplicate_ids(tmp_path):
    def question(qid, text="What is it?", image=9):
        return json.dumps({"image_id": image, "question": text, "question_id": qid})

    def annotation(qid, extra=""):
        return f'{{"question_id": {json.dumps(qid)}, "image_id": 9, "answers": [{{"answer": "a"}}]{extra}}}'

    q, a = vqa_pair(
        tmp_path,
        [question(1), question([1]), question(2), question(1, "Again?"), '{"image_id": 9, "question": NaN}'],
        [annotation(1), annotation([2]), annotation(2, ', "x": -Infinity'), annotation(1)],
    )
    results = list(read_vqa(q, a))
    stem = "COCO_val2014_000000000009"
    assert [r.question_id for r in results if isinstance(r, VqaQuestion)] == [1]
    assert skips(results) == [Skip(stem, DUPLICATE_ID), Skip(stem, DUPLICATE_ID)]  # annotation 1, question 1
    assert bad(results) == [
        "v2_mscoco_val2014_annotations.json:annotations[1]: needs an integer question_id and answers (a list)",
        f"v2_mscoco_val2014_annotations.json:annotations[2]: {NON_FINITE}",
        "v2_OpenEnded_mscoco_val2014_questions.json:questions[1]: "
        "needs an integer image_id, question and an integer question_id",
        "v2_OpenEnded_mscoco_val2014_questions.json:questions[2]: question 2 has no annotation in "
        "v2_mscoco_val2014_annotations.json",
        f"v2_OpenEnded_mscoco_val2014_questions.json:questions[4]: {NON_FINITE}",
    ]


def test_gqa_non_finite_member_is_malformed(tmp_path):
    path = write(
        tmp_path / "val_balanced_questions.json",
        '{"1": {"imageId": "n1", "question": "Is it red?", "answer": "no"}, '
        '"2": {"imageId": "n2", "question": "Is it?", "answer": "yes", "x": NaN}}',
    )
    results = list(read_questions(path))
    assert [r.question_id for r in results if not isinstance(r, Malformed)] == ["1"]
    assert bad(results) == [f'val_balanced_questions.json:["2"]: {NON_FINITE}']


def test_a_gqa_file_that_is_a_list_is_refused_by_name(tmp_path):
    path = tmp_path / "val_balanced_questions.json"
    write(path, json.dumps([{"imageId": "n1", "question": "Is it red?", "answer": "no"}]))
    with pytest.raises(
        ConfigError, match=r"val_balanced_questions.json: .*not its format: needs an object, found an array"
    ):
        list(read_questions(path))


def test_nlvr2_duplicate_identifiers_are_skipped_as_such(tmp_path):
    row = {"identifier": "dev-1-0-0", "sentence": "Two dogs.", "label": "True"}
    path = lines(tmp_path / "dev.json", [row, {**row, "sentence": "Again."}, {**row, "identifier": "dev-1-0-1"}])
    first, again, other = read_nlvr2(path)
    assert (first.sentence, again.sentence, other.sentence) == ("Two dogs.", Skip("dev-1-0", DUPLICATE_ID), "Two dogs.")


def karpathy_image(filename, sentences, split="test"):
    return {"filename": filename, "split": split, "sentences": [{"raw": r, "sentid": s} for s, r in sentences]}


def test_karpathy_blank_null_and_duplicate_texts_are_counted(tmp_path):
    images = [
        karpathy_image("1.jpg", [(0, "A dog."), (1, "  "), (2, None)]),
        karpathy_image("2.jpg", [(3, "A cat."), (0, "Repeated sentid.")]),
        karpathy_image("1.jpg", [(4, "The same image again."), (5, "x")]),
    ]
    path = write(tmp_path / "dataset_flickr30k.json", json.dumps({"images": images, "dataset": "flickr30k"}))
    text = path.read_text()
    write(path, text.replace('"images": [', '"images": [' + DEEP[:3000] + "]" * 3000 + ', {"x": NaN}, ', 1))
    results = list(read_karpathy(path))
    assert bad(results) == [
        f"dataset_flickr30k.json:images[0]: {TOO_DEEP}",
        f"dataset_flickr30k.json:images[1]: {NON_FINITE}",
    ]
    assert [r for r in results if isinstance(r, KarpathyImage)] == [
        KarpathyImage("1", "test", ("A dog.",), (0,)),
        KarpathyImage("2", "test", ("A cat.",), (3,)),
    ]
    assert skips(results) == [
        Skip("1", EMPTY_TEXT),
        Skip("1", NULL_TEXT),
        Skip("2", DUPLICATE_ID),
        Skip("1", DUPLICATE_ID),
        Skip("1", DUPLICATE_ID),
    ]


def vcr_row(annot_id="val-0", question=("Why", "?")):
    return {
        "annot_id": annot_id,
        "objects": ["person"],
        "img_fn": "movie/clip@0.jpg",
        "question": list(question),
        "answer_choices": [["Yes", "."]] * 4,
        "rationale_choices": [["It", "is", "."]] * 4,
        "answer_label": 0,
        "rationale_label": 1,
    }


def test_vcr_blank_question_and_duplicate_annot_id_are_counted_skips(tmp_path):
    path = lines(tmp_path / "val.jsonl", [vcr_row(), vcr_row("val-1", (" ", "\t")), vcr_row("val-0")])
    results = list(read_vcr(path))
    assert [r.annot_id for r in results if isinstance(r, VcrQuestion)] == ["val-0"]
    assert results[1:] == [Skip("movie/clip@0", EMPTY_TEXT), Skip("movie/clip@0", DUPLICATE_ID)]


def refcoco_files(tmp_path, box, ref_extra=None):
    instances = write(
        tmp_path / "instances.json",
        '{"images": [{"id": 7, "file_name": "COCO_train2014_000000000007.jpg", "width": 100, "height": 80}], '
        f'"annotations": [{{"id": 70, "image_id": 7, "bbox": {box}}}, '
        '{"id": 71, "image_id": 7, "bbox": [1, 2, 3, 4]}]}',
    )
    refs = [
        {"ref_id": 1, "ann_id": 70, "image_id": 7, "split": "train", "sentences": [{"sent_id": 1, "raw": "the dog"}]},
        {"ref_id": 2, "ann_id": 71, "image_id": 7, "split": "train", "sentences": [{"sent_id": 2, "raw": "a cat"}]},
    ]
    if ref_extra is not None:
        refs[1]["score"] = ref_extra
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps(refs))
    return path, instances


@pytest.mark.parametrize(
    "box", ["[NaN, 0, 10, 10]", "[0, 0, Infinity, 10]", "[0, 0, 1e400, 10]", f"[0, 0, {'9' * 400}, 1]"]
)
def test_refcoco_non_finite_boxes_are_malformed_rows_and_never_given_boxes(tmp_path, box):
    refs, instances = refcoco_files(tmp_path, box)
    results = list(read_refs(refs, instances))
    assert bad(results) == [
        f"instances.json:annotations[0]: {NON_FINITE}",
        "refs(unc).p:[0]: annotation 70 of image 7 is not in instances.json",
    ]
    assert [r.box for r in results if not isinstance(r, (Malformed, Skip))] == [(1.0, 2.0, 4.0, 6.0)]
    assert annotation_boxes(instances, {"COCO_train2014_000000000007"}) == {
        "COCO_train2014_000000000007": [[1.0, 2.0, 4.0, 6.0]]
    }


def test_a_ref_holding_a_non_finite_number_is_malformed(tmp_path):
    refs, instances = refcoco_files(tmp_path, "[0, 0, 10, 10]", ref_extra=[1.0, float("nan")])
    results = list(read_refs(refs, instances))
    assert bad(results) == [f"refs(unc).p:[1]: {NON_FINITE}"]
    assert [r.ref_id for r in results if not isinstance(r, Malformed)] == [1]


# -- what build-task records


def test_build_task_counts_duplicates_and_blank_texts_per_reason(tmp_path):
    path = lines(
        tmp_path / "val.jsonl",
        [
            vcr_row(),
            vcr_row("val-1"),
            vcr_row("val-2", (" ",)),
            vcr_row("val-0"),
            '{"annot_id": "val-3", "x": NaN}',
            DEEP,
        ],
    )
    manifest = build_task(transfer.get("vcr-q2a"), [path], tmp_path / "task")
    assert manifest["rows"] == 2
    assert manifest["skipped"] == {EMPTY_TEXT: 1, DUPLICATE_ID: 1}
    assert manifest["malformed"] == {
        "count": 2,
        "examples": [f"val.jsonl:5: invalid JSON: {NON_FINITE}", f"val.jsonl:6: invalid JSON: {TOO_DEEP}"],
    }


def test_build_task_refuses_a_gqa_list_in_one_line(tmp_path):
    path = write(
        tmp_path / "val_balanced_questions.json", json.dumps([{"imageId": "1", "question": "Q?", "answer": "a"}])
    )
    proc = run_cli("build-task", "--task", "gqa", "--out", tmp_path / "task", path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error:") and "not its format" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
