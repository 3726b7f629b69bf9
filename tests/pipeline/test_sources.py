"""One reader per official source format (`pipeline.sources`), used by the dataset readers
(images to fetch) and the mixture (text items) alike, with one rule for texts and malformed
rows."""

import ast
import gzip
import json
from pathlib import Path

import pytest

from pipeline.datasets import Malformed, read_items
from pipeline.download.source_item import SourceItem
from pipeline.errors import ConfigError
from pipeline.mixture.sources import ImageIds, TextItem, read_coco_captions, read_conceptual_captions, read_vg_regions
from pipeline.sources.base import EMPTY_TEXT, NULL_TEXT, Skip, clean_text
from pipeline.sources.jsonstream import iter_json

REPO = Path(__file__).resolve().parents[2]


def dump(path, obj):
    path.write_text(json.dumps(obj))
    return path


def coco_file(tmp_path, annotations, images=None):
    return dump(
        tmp_path / "captions_train2014.json",
        {
            "images": images
            or [{"id": 9, "file_name": "COCO_train2014_000000000009.jpg", "coco_url": "http://i/9.jpg"}],
            "annotations": annotations,
        },
    )


def test_both_consumers_read_a_coco_file_with_the_same_text_rule(tmp_path):
    path = coco_file(
        tmp_path,
        [
            {"image_id": 9, "caption": "  A  plate\nof food. "},
            {"image_id": 9, "caption": "   "},
            {"image_id": 9, "caption": None},
            {"image_id": 9, "caption": "Dinner."},
        ],
    )
    (item,) = read_items("coco", [path])
    mixture = list(read_coco_captions(path))
    assert [t.text for t in item.texts] == ["A plate of food.", "Dinner."]
    assert [m.text for m in mixture if isinstance(m, TextItem)] == ["A plate of food.", "Dinner."]
    assert [m.reason for m in mixture if isinstance(m, Skip)] == [EMPTY_TEXT, NULL_TEXT]


@pytest.mark.parametrize(
    "annotation, reason",
    [
        ({"image_id": 7, "caption": "x"}, "image 7 is not in images"),  # was silently dropped by the dataset reader
        ({"image_id": 9}, "needs image_id and caption"),
        ("not an object", "needs image_id and caption"),
    ],
)
def test_a_malformed_coco_row_is_counted_by_download_and_refused_by_the_mixture(tmp_path, annotation, reason):
    path = coco_file(tmp_path, [{"image_id": 9, "caption": "fine"}, annotation])
    results = list(read_items("coco", [path]))
    bad = [r for r in results if isinstance(r, Malformed)]
    assert [str(b) for b in bad] == [f"captions_train2014.json:annotations[1]: {reason}"]
    assert [r.texts[0].text for r in results if isinstance(r, SourceItem)] == ["fine"]
    with pytest.raises(ConfigError, match=rf"{path}:annotations\[1\]: {reason}"):
        list(read_coco_captions(path))
    with pytest.raises(ConfigError, match=rf"{path}:annotations\[1\]"):
        ImageIds(None, [path])


def test_vg_image_data_rows_have_one_rule_for_both_consumers(tmp_path):
    path = dump(
        tmp_path / "image_data.json",
        [
            {"image_id": 1, "url": "http://vg/1.jpg", "coco_id": 9},
            {"image_id": 2, "url": "http://vg/2.jpg", "coco_id": None},
            {"image_id": 3, "url": "http://vg/3.jpg"},
        ],
    )  # no coco_id key
    results = list(read_items("visual_genome", [path]))
    assert [r.image_id for r in results if isinstance(r, SourceItem)] == ["1", "2"]
    assert [str(r) for r in results if isinstance(r, Malformed)] == [
        "image_data.json:[2]: needs image_id, url and coco_id (an integer, or null when not in COCO)"
    ]
    coco = coco_file(tmp_path, [])
    with pytest.raises(ConfigError, match=rf"{path}:\[2\]: needs image_id, url and coco_id"):
        ImageIds(path, [coco])
    dump(path, [{"image_id": 1, "url": "http://vg/1.jpg", "coco_id": 9}])
    assert ImageIds(path, [coco]).vg_to_coco == {"1": "COCO_train2014_000000000009"}
    dump(path, {"1": {"image_id": 1}})  # not a list
    with pytest.raises(ConfigError, match=r"image_data.json: expected '\['"):
        list(read_items("visual_genome", [path]))


def test_conceptual_captions_blank_caption_is_an_image_without_text_and_a_counted_skip(tmp_path):
    tsv = tmp_path / "Train_GCC-training.tsv"
    tsv.write_text("a  dog \thttp://x/1\n \thttp://x/2\n")
    items = list(read_items("conceptual_captions", [tsv]))
    assert [(i.image_id, [t.text for t in i.texts]) for i in items] == [
        ("cc3m-train-00000000", ["a dog"]),
        ("cc3m-train-00000001", []),
    ]
    assert list(read_conceptual_captions(tsv)) == [
        TextItem("cc3m-train-00000000", "a dog", "caption"),
        Skip("cc3m-train-00000001", EMPTY_TEXT),
    ]
    tsv.write_text("a dog\thttp://x/1\nno tab here\n")
    with pytest.raises(ConfigError, match=rf"{tsv}:2: expected 2 tab-separated fields"):
        list(read_conceptual_captions(tsv))


def test_streamed_json_follows_the_file_rules(tmp_path):
    """Bad bytes and lone surrogates become U+FFFD (as in the dataset readers), .gz is read."""
    raw = b'[{"id": 1, "regions": [{"phrase": "caf\xff \\ud800 table"}]}]'
    (tmp_path / "regions.json").write_bytes(raw)
    (tmp_path / "regions.json.gz").write_bytes(gzip.compress(raw))
    for name in ("regions.json", "regions.json.gz"):
        assert list(read_vg_regions(tmp_path / name)) == [
            TextItem("1", "caf\ufffd \ufffd table", "caption", in_vg=True)
        ]
    assert list(iter_json(tmp_path / "regions.json", array=True))[0][0] == 0


def test_an_input_that_cannot_be_read_at_all_is_named_by_both_consumers(tmp_path):
    from pipeline.mixture.sources import read_source

    bad = tmp_path / "Train_GCC-training.tsv.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ConfigError, match=f"conceptual_captions input {bad}: cannot be read"):
        list(read_items("conceptual_captions", [bad]))
    for kind in ("conceptual_captions", "vg_regions", "coco_captions"):
        with pytest.raises(ConfigError, match=f"{bad}: cannot be read"):
            list(read_source(kind, "src", [bad]))


def test_clean_text():
    assert clean_text(" a\t b\n\nc  ") == "a b c" and clean_text(" \n ") == ""


# -- structure: the formats are parsed in pipeline/sources alone

# Modules that must read their files through pipeline.sources, never by hand.
THROUGH_SOURCES = [
    "pipeline/datasets/coco.py",
    "pipeline/datasets/visual_genome.py",
    "pipeline/datasets/nlvr2.py",
    "pipeline/datasets/conceptual_captions.py",
    "pipeline/mixture/sources.py",
    "pipeline/mixture/build.py",
]
PARSING = {
    "json",
    "csv",
    "gzip",
    "pipeline.sources.jsonstream",
    "iter_json",
    "open_text",
    "load_json",
    "load_json_file",
}


@pytest.mark.parametrize("module", THROUGH_SOURCES)
def test_shared_formats_have_one_reader(module):
    """The old twins (COCO captions / VG image_data parsed in datasets/ and again in
    mixture/) must not come back: these modules import no file-parsing tools."""
    tree = ast.parse((REPO / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported |= {node.module, *(alias.name for alias in node.names)}
    assert not imported & PARSING, f"{module} parses files itself: {sorted(imported & PARSING)}"


def test_the_old_mixture_json_stream_is_gone():
    assert not (REPO / "pipeline" / "mixture" / "jsonstream.py").exists()


def test_source_readers_sit_below_datasets_and_mixture():
    """pipeline.sources knows no consumer: it imports only itself, the shared errors and the
    restricted unpickler (RefCOCO's refs are pickles)."""
    for path in sorted((REPO / "pipeline" / "sources").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
                assert node.module in ("pipeline.errors", "pipeline.safe_pickle") or node.module.startswith(
                    "pipeline.sources"
                ), (path, node.module)
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("pipeline") for a in node.names), path
