import io
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_server import make_corpus

from pipeline.datasets import read_items
from pipeline.download.fetch import FetchConfig
from pipeline.download.shard import ShardJob, download_shard
from pipeline.errors import ConfigError
from pipeline.image_shards import IMAGE_SHARD_SCHEMA, done_shards, iter_images
from pipeline.images import ImageConfig

CORPUS = make_corpus()


def image_folder(root):
    for name in ("rgb.jpg", "cmyk.jpg", "rgba.png"):
        (root / "imgs" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "imgs" / name).write_bytes(CORPUS[name][0])
    (root / "imgs" / "broken.jpg").write_bytes(b"\xff\xd8\xff garbage")
    return root / "imgs"


def test_local_files_become_a_shard_and_read_back(tmp_path):
    folder = image_folder(tmp_path)
    items = tuple(read_items("folder", [folder]))
    items += (items[0].__class__(image_id="gone", path=str(tmp_path / "missing.jpg")),)
    out = tmp_path / "shards"
    out.mkdir()
    stats = download_shard(ShardJob(0, items), out, FetchConfig(threads=2), ImageConfig())
    assert stats["count"] == 5 and stats["successes"] == 3
    assert stats["failures"] == {"decode error": 1, "file not found": 1}
    table = pq.read_table(out / "00000.parquet")
    assert table.schema.equals(IMAGE_SHARD_SCHEMA, check_metadata=False)
    assert table.column("image_id").to_pylist() == ["broken", "cmyk", "rgb", "rgba", "gone"]  # input order
    assert set(done_shards(out)) == {0}
    got = {i.image_id: i for i in iter_images(out)}
    assert set(got) == {"cmyk", "rgb", "rgba"} and got["rgb"].data == CORPUS["rgb.jpg"][0]
    folder_items = {i.image_id: i for i in iter_images(folder)}  # a plain folder is a source too
    assert set(folder_items) == {"broken", "cmyk", "rgb", "rgba"}


def test_img2dataset_outputs(tmp_path):
    """img2dataset's webdataset (<key>.jpg/.txt/.json in tars) and parquet (key, jpg, caption, status) outputs."""
    wds = tmp_path / "wds"
    wds.mkdir()
    with tarfile.open(wds / "00000.tar", "w") as tar:
        for key, caption in (("000000000", "a red thing"), ("000000001", "blue")):
            for ext, data in (
                ("jpg", CORPUS["rgb.jpg"][0]),
                ("txt", caption.encode()),
                ("json", json.dumps({"key": key, "url": f"http://x/{key}", "status": "success"}).encode()),
            ):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    items = list(iter_images(wds))
    assert [i.image_id for i in items] == ["000000000", "000000001"]
    assert items[0].texts[0].text == "a red thing" and items[0].meta["url"] == "http://x/000000000"

    par = tmp_path / "par"
    par.mkdir()
    pq.write_table(
        pa.table(
            {
                "key": ["000000000", "000000001"],
                "jpg": [CORPUS["rgb.jpg"][0], None],
                "caption": ["c", "d"],
                "url": ["u0", "u1"],
                "status": ["success", "failed_to_download"],
            }
        ),
        par / "00000.parquet",
    )
    (par / "00000_stats.json").write_text("{}")  # img2dataset writes stats files as we do
    items = list(iter_images(par))
    assert [i.image_id for i in items] == ["000000000"] and items[0].data == CORPUS["rgb.jpg"][0]
    with pytest.raises(ConfigError, match="not found"):
        list(iter_images(tmp_path / "nothing"))


def write_img2dataset_files_output(out):
    """What `img2dataset --output_format files` (its default) writes, as its FilesSampleWriter
    does: per shard a folder OUT/NNNNN/ with <key>.jpg, <key>.txt (caption) and <key>.json
    (metadata) for each successful sample, beside OUT/NNNNN.parquet (the metadata of every
    sample, failed ones included; no image bytes) and OUT/NNNNN_stats.json."""
    out.mkdir()
    samples = [  # (shard, key, url, caption, image or None for a failed download)
        (0, "000000000", "http://x/a.jpg", "a red thing", CORPUS["rgb.jpg"][0]),
        (0, "000000001", "http://x/b.jpg", "gone", None),
        (0, "000000002", "http://x/c.jpg", "grey", CORPUS["gray.jpg"][0]),
        (1, "000010000", "http://x/d.jpg", "cmyk", CORPUS["cmyk.jpg"][0]),
    ]
    for shard in (0, 1):
        folder = out / f"{shard:05d}"
        folder.mkdir()
        meta_rows = []
        for number, key, url, caption, image in samples:
            if number != shard:
                continue
            meta = {
                "url": url,
                "caption": caption,
                "key": key,
                "status": "success" if image else "failed_to_download",
                "error_message": None if image else "HTTP Error 404",
                "width": 64 if image else None,
                "height": 48 if image else None,
                "original_width": 64 if image else None,
                "original_height": 48 if image else None,
                "exif": None,
                "sha256": None,
            }
            meta_rows.append(meta)
            if image is not None:
                (folder / f"{key}.jpg").write_bytes(image)
                (folder / f"{key}.txt").write_text(caption)
                (folder / f"{key}.json").write_text(json.dumps(meta, indent=4))
        pq.write_table(pa.Table.from_pylist(meta_rows), out / f"{shard:05d}.parquet")
        (out / f"{shard:05d}_stats.json").write_text(json.dumps({"count": len(meta_rows), "successes": 0}))
    return out


def test_img2dataset_files_output(tmp_path):
    out = write_img2dataset_files_output(tmp_path / "i2d")
    items = list(iter_images(out))
    assert [i.image_id for i in items] == ["000000000", "000000002", "000010000"]
    assert items[0].data == CORPUS["rgb.jpg"][0] and items[2].data == CORPUS["cmyk.jpg"][0]
    assert items[0].texts[0].text == "a red thing" and items[0].meta["url"] == "http://x/a.jpg"


def test_file_names_that_are_not_utf8_do_not_lose_the_shard(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    (folder / "rgb.jpg").write_bytes(CORPUS["rgb.jpg"][0])
    with open(bytes(folder) + b"/caf\xe9.jpg", "wb") as f:  # a Latin-1 file name (undecodable as UTF-8)
        f.write(CORPUS["rgb.png"][0])
    out = tmp_path / "shards"
    out.mkdir()
    stats = download_shard(
        ShardJob(0, tuple(read_items("folder", [folder]))), out, FetchConfig(threads=2), ImageConfig()
    )
    assert stats["successes"] == 2
    rows = pq.read_table(out / "00000.parquet").to_pylist()
    assert [r["image_id"] for r in rows] == ["caf\ufffd", "rgb"] and rows[0]["image"] == CORPUS["rgb.png"][0]
