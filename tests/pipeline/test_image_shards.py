import io
import json
import tarfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from image_server import make_corpus

from pipeline.datasets import read_items
from pipeline.download.fetch import FetchConfig
from pipeline.download.images import ImageConfig
from pipeline.download.shard import ShardJob, download_shard
from pipeline.errors import ConfigError
from pipeline.image_shards import IMAGE_SHARD_SCHEMA, done_shards, iter_images

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
    stats = download_shard(ShardJob(0, items), out, FetchConfig(), ImageConfig(), threads=2)
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
            for ext, data in (("jpg", CORPUS["rgb.jpg"][0]), ("txt", caption.encode()),
                              ("json", json.dumps({"key": key, "url": f"http://x/{key}", "status": "success"}).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    items = list(iter_images(wds))
    assert [i.image_id for i in items] == ["000000000", "000000001"]
    assert items[0].texts[0].text == "a red thing" and items[0].meta["url"] == "http://x/000000000"

    par = tmp_path / "par"
    par.mkdir()
    pq.write_table(pa.table({"key": ["000000000", "000000001"], "jpg": [CORPUS["rgb.jpg"][0], None],
                             "caption": ["c", "d"], "url": ["u0", "u1"], "status": ["success", "failed_to_download"]}),
                   par / "00000.parquet")
    (par / "00000_stats.json").write_text("{}")  # img2dataset writes stats files as we do
    items = list(iter_images(par))
    assert [i.image_id for i in items] == ["000000000"] and items[0].data == CORPUS["rgb.jpg"][0]
    with pytest.raises(ConfigError, match="not found"):
        list(iter_images(tmp_path / "nothing"))
