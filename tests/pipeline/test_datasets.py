import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.datasets import READERS, Malformed, ReaderOptions, read_items
from pipeline.download.source_item import SourceItem, Text
from pipeline.errors import ConfigError


def split_results(results):
    results = list(results)
    return [r for r in results if isinstance(r, SourceItem)], [r for r in results if isinstance(r, Malformed)]


def test_conceptual_captions_ids_are_stable_rows_and_malformed_lines_named(tmp_path):
    tsv = tmp_path / "Validation_GCC-1.1.0-Validation.tsv"
    tsv.write_text(
        "a dog on a beach\thttp://a.example/1.jpg\nbroken line without tab\n"
        "a cat\thttp://a.example/2.jpg\n\t\nsame url again\thttp://a.example/1.jpg\n"
    )
    items, bad = split_results(read_items("conceptual_captions", [tsv]))
    assert [i.image_id for i in items] == ["cc3m-val-00000000", "cc3m-val-00000002", "cc3m-val-00000004"]
    assert items[0].texts == (Text("caption", "a dog on a beach"),) and items[0].split == "val"
    assert dict(items[0].extra)["url_sha1"] == dict(items[2].extra)["url_sha1"]  # same URL, distinct ids
    assert [b.location for b in bad] == [f"{tsv.name}:2", f"{tsv.name}:4"]
    assert "expected 2 tab-separated fields" in bad[0].reason
    gz = tmp_path / "Train_GCC-training.tsv.gz"
    gz.write_bytes(gzip.compress(b"c\thttp://x/1\n"))
    assert split_results(read_items("conceptual_captions", [gz]))[0][0].image_id == "cc3m-train-00000000"


def test_url_list_formats_and_columns(tmp_path):
    (tmp_path / "l.tsv").write_text("url\tcaption\nhttp://x/1\thello\nhttp://x/2\n")
    (tmp_path / "l.csv").write_text('link,text,key\nhttp://x/3,"a, b",k3\n')
    (tmp_path / "l.jsonl").write_text('{"url": "http://x/4", "caption": "c4"}\nnot json\n{"caption": "no url"}\n')
    pq.write_table(pa.table({"url": ["http://x/5"], "caption": ["c5"]}), tmp_path / "l.parquet")
    items, bad = split_results(
        read_items("url_list", [tmp_path / "l.tsv", tmp_path / "l.jsonl", tmp_path / "l.parquet"])
    )
    assert [i.image_id for i in items] == ["l-000000000", "l-000000000", "l-000000000"]
    assert [i.url for i in items] == ["http://x/1", "http://x/4", "http://x/5"]
    assert [b.location for b in bad] == ["l.tsv:3", "l.jsonl:2", "l.jsonl:3"]
    opts = ReaderOptions(url_col="link", caption_col="text", id_col="key")
    items, _ = split_results(read_items("url_list", [tmp_path / "l.csv"], opts))
    assert items[0].image_id == "k3" and items[0].texts == (Text("caption", "a, b"),)


def test_url_list_plain_text_files_one_url_a_line(tmp_path):
    """img2dataset's txt input: one URL a line, no header; blank lines skipped."""
    (tmp_path / "urls.txt").write_text("http://x/1.jpg\n\n  http://x/2.jpg  \r\nhttp://x/3.jpg")
    gz = tmp_path / "more.txt.gz"
    gz.write_bytes(gzip.compress(b"http://x/4.jpg\n"))
    items, bad = split_results(read_items("url_list", [tmp_path / "urls.txt", gz], ReaderOptions(split="train")))
    assert [(i.image_id, i.url) for i in items] == [
        ("urls-000000000", "http://x/1.jpg"),
        ("urls-000000001", "http://x/2.jpg"),
        ("urls-000000002", "http://x/3.jpg"),
        ("more-000000000", "http://x/4.jpg"),
    ]
    assert not bad and items[0].texts == () and items[0].split == "train"


def test_json_lone_surrogates_become_replacement_characters(tmp_path):
    """A JSON escape can hold text no UTF-8 file can (a lone surrogate): read it as bad bytes are read."""
    (tmp_path / "l.jsonl").write_text('{"url": "http://x/\\ud800.jpg", "caption": "a \\udc00 b \\ud83d\\ude00"}\n')
    items, bad = split_results(read_items("url_list", [tmp_path / "l.jsonl"]))
    assert not bad and items[0].url == "http://x/\ufffd.jpg" and items[0].texts[0].text == "a \ufffd b \U0001f600"
    path = tmp_path / "dev.json"
    path.write_text(
        json.dumps({"identifier": "dev-1-0-0", "sentence": "x\ud800", "left_url": "http://l", "right_url": "http://r"})
        + "\n"
    )
    items, _ = split_results(read_items("nlvr2", [path]))
    assert items[0].texts[0].text == "x\ufffd"


def test_coco_captions(tmp_path):
    path = tmp_path / "captions_val2014.json"
    path.write_text(
        json.dumps(
            {
                "images": [
                    {
                        "id": 42,
                        "file_name": "COCO_val2014_000000000042.jpg",
                        "coco_url": "http://i/42.jpg",
                        "height": 1,
                        "width": 1,
                    },
                    {"id": 7, "file_name": "COCO_val2014_000000000007.jpg"},
                ],
                "annotations": [
                    {"image_id": 42, "id": 1, "caption": "A man. "},
                    {"image_id": 42, "id": 2, "caption": "A bike."},
                    {"image_id": 42},
                ],
            }
        )
    )
    items, bad = split_results(read_items("coco", [path]))
    assert len(items) == 1 and items[0].image_id == "COCO_val2014_000000000042" and items[0].split == "val2014"
    assert [t.text for t in items[0].texts] == ["A man.", "A bike."]
    assert len(bad) == 2 and "no coco_url" in bad[1].reason
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ConfigError, match="not a COCO captions file"):
        list(read_items("coco", [tmp_path / "bad.json"]))


def test_visual_genome_image_data(tmp_path):
    path = tmp_path / "image_data.json"
    path.write_text(
        json.dumps(
            [
                {"image_id": 1, "url": "https://vg/1.jpg", "width": 800, "height": 600, "coco_id": None},
                {"image_id": 51, "url": "https://vg/51.jpg", "coco_id": 9},
                {"url": "x"},
            ]
        )
    )
    items, bad = split_results(read_items("visual_genome", [path]))
    assert [i.image_id for i in items] == ["1", "51"] and dict(items[1].extra) == {"coco_id": "9"}
    assert len(bad) == 1


def test_nlvr2_pairs(tmp_path):
    path = tmp_path / "dev.json"
    rows = [
        {
            "identifier": "dev-850-0-0",
            "sentence": "One dog.",
            "left_url": "http://l",
            "right_url": "http://r",
            "label": "True",
        },
        {
            "identifier": "dev-850-0-1",
            "sentence": "Two dogs.",
            "left_url": "http://l",
            "right_url": "http://r",
            "label": "False",
        },
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{}\n")
    items, bad = split_results(read_items("nlvr2", [path]))
    assert [i.image_id for i in items] == ["dev-850-0-img0", "dev-850-0-img1"]
    assert items[0].url == "http://l" and items[0].texts == (Text("statement", "One dog."),) and items[0].split == "dev"
    assert len(bad) == 1


def test_flickr30k_token_file(tmp_path):
    token = tmp_path / "results_20130124.token"
    token.write_text(
        "1000092795.jpg#0\tTwo young guys .\n1000092795.jpg#1\tTwo men .\n10002456.jpg#0\tSeveral men .\nbad\n"
    )
    items, bad = split_results(read_items("flickr30k", [token], ReaderOptions(images_root=tmp_path / "imgs")))
    assert [i.image_id for i in items] == ["1000092795", "10002456"]
    assert items[0].path == str(tmp_path / "imgs" / "1000092795.jpg") and len(items[0].texts) == 2
    assert len(bad) == 1


def test_folder(tmp_path):
    for rel in ("b/2.PNG", "a.jpg", ".hidden/x.jpg", "notes.txt", "c/d/e.webp"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    items, _ = split_results(read_items("folder", [tmp_path]))
    assert [i.image_id for i in items] == ["a", "b/2", "c/d/e"] and items[0].path == str(tmp_path / "a.jpg")


def test_registry_and_manifests_agree():
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[2] / "data_manifests" / "datasets"
    described = {p.stem: yaml.safe_load(p.read_text()) for p in root.glob("*.yaml")}
    generated = {name for name, manifest in described.items() if "generated_by" in manifest}  # e.g. shapes
    assert generated == {"shapes"} and set(described) - generated == set(READERS)
    for name, manifest in described.items():
        assert (
            manifest["name"] == name
            and manifest["files"]
            and (name in generated or manifest["obtain"] and manifest["ids"])
        )
    with pytest.raises(ConfigError, match="unknown dataset"):
        read_items("nope", [])


@pytest.mark.parametrize("name, content", [("urls.tsv.gz", b"not gzip at all"), ("urls.parquet", b"PAR1 not parquet")])
def test_an_input_that_cannot_be_read_at_all_is_a_named_error(tmp_path, name, content):
    """A corrupt .gz or Parquet input: a ConfigError naming the file (it was a raw
    BadGzipFile / ArrowInvalid traceback, in the driver and in the progress bar's counter)."""
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"url_list input {path}: cannot be read"):
        list(read_items("url_list", [path]))
