"""`vlprep serve` without a model: no file outside the given roots is ever served (ids with
``..``, absolute ids, symbolic links out, URL-encoded tricks, names instead of paths), a bad
parameter is a page saying what is wrong (HTTP 400, never a traceback), a page of a store of a
million records reads only the records it shows, and the command's bind and warning."""

import importlib.util
import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import REPO, make_record
from PIL import Image
from serve_helpers import fetch, multipart

from pipeline.store import write_records
from vl_models.serve.app import Running, make_app
from vl_models.serve.command import host_warning
from vl_models.serve.gallery import SCAN
from vl_models.serve.site import open_site

SECRET = b"\x89PNG\r\n\x1a\n top secret, outside every root"


def jpeg(width: int = 64, height: int = 48, color=(200, 40, 40)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buf, "JPEG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tricky(tmp_path_factory):
    """A store whose ids try to leave the image root, the root (an image, a link out of it, a
    folder), and a secret PNG beside the root."""
    base = tmp_path_factory.mktemp("tricky")
    root = base / "images"
    (root / "sub").mkdir(parents=True)
    (root / "ok.jpg").write_bytes(jpeg())
    (root / "sub" / "nested.jpg").write_bytes(jpeg(color=(20, 200, 20)))
    (base / "secret.png").write_bytes(SECRET)
    (root / "link.png").symlink_to(base / "secret.png")  # a link inside the root, to a file outside it
    (root / "sublink").symlink_to(base)  # a folder link out of the root
    ids = ["ok", "sub/nested", "../secret", "sub/../../secret", str(base / "secret"), "link", "sublink/secret"]
    rng = np.random.default_rng(0)
    records = [make_record(rng, i, num_boxes=3, feature_dim=8, cls_dim=5, attr_dim=4, size=(48, 64)) for i in ids]
    write_records(base / "store", records, feature_dim=8, dtype="float32")
    site = open_site([base / "store"], roots=[root])
    with Running(make_app(site)) as running:
        yield running.url, base


def test_only_files_under_the_roots_are_served(tricky):
    url, base = tricky
    assert fetch(url, "/stores/store/file?id=ok").body == (base / "images" / "ok.jpg").read_bytes()
    assert fetch(url, "/stores/store/file?id=sub%2Fnested").status == 200
    for image_id in ("..%2Fsecret", "sub%2F..%2F..%2Fsecret", "link", "sublink%2Fsecret"):  # ids of the store
        reply = fetch(url, f"/stores/store/file?id={image_id}")
        assert reply.status == 404 and SECRET not in reply.body, image_id
    absolute = str(base / "secret").replace("/", "%2F")
    assert fetch(url, f"/stores/store/file?id={absolute}").status == 404
    for path in (  # not ids of the store, and paths that are no routes: nothing is read for them
        "/stores/store/file?id=..%2F..%2Fsecret.png",
        "/stores/store/file?id=%2Fetc%2Fpasswd",
        "/stores/store/thumb?id=..%2F..%2Fsecret.png",
        "/stores/..%2F..%2Fetc/file?id=passwd",
        "/stores/store/../../secret.png",
        "/static/..%2F..%2Fsecret.png",
        "/static/%2e%2e/%2e%2e/secret.png",
        "/static/../app.py",
        "/static/..%5c..%5capp.py",
        "//etc/passwd",
    ):
        reply = fetch(url, path)
        assert reply.status in (400, 404) and SECRET not in reply.body and b"import" not in reply.body, path
    for image_id in ("..%2Fsecret", "link", "sublink%2Fsecret"):  # a refused file's thumbnail: grey, never the file
        thumb = fetch(url, f"/stores/store/thumb?id={image_id}")
        assert thumb.status == 200 and thumb.headers["content-type"] == "image/png" and SECRET not in thumb.body


def test_every_page_sends_the_protective_headers_and_only_local_host_names(tricky):
    url, _ = tricky
    reply = fetch(url, "/stores/store")
    assert reply.status == 200
    assert "default-src 'self'" in reply.headers["content-security-policy"]
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert fetch(url, "/", headers={"Host": "attacker.example"}).status == 400  # DNS rebinding
    assert fetch(url, "/", headers={"Host": "localhost:1234"}).status == 200


@pytest.mark.parametrize(
    "path, says",
    [
        ("/stores/store?page=abc", "page='abc' is not an integer"),
        ("/stores/store?page=99", "page=99 is out of range"),
        ("/stores/store?per=0", "per=0 is out of range"),
        ("/stores/store?min_conf=nan", "min_conf is not a number"),
        ("/stores/store?min_conf=2", "min_conf=2.0 is out of range"),
        ("/stores/store?object=unicorn", "object 'unicorn' is not a label of this store"),
        ("/stores/store/image", "name the image"),
        ("/stores/store/image?id=absent", "image 'absent' is not in the store store"),
        ("/stores/nope", "no store named 'nope' is served"),
        ("/tasks/nope", "no task dataset or mixture named 'nope'"),
        ("/runs/nope", "no run named 'nope' is served"),
        ("/nowhere", "Not Found"),
    ],
)
def test_a_bad_query_is_a_message_on_the_page_not_a_traceback(tricky, path, says):
    url, _ = tricky
    reply = fetch(url, path)
    assert reply.status in (400, 404), reply.text
    assert says in reply.text.replace("&#39;", "'") and "Traceback" not in reply.text
    assert 'id="error"' in reply.text


def test_a_bad_ask_is_a_message_too(tricky):
    url, _ = tricky
    reply = fetch(url, "/api/ask", "POST", b"{not json", {"Content-Type": "application/json"})
    assert reply.status == 400 and "not JSON" in reply.json()["detail"]
    reply = fetch(url, "/api/ask", "POST", b'{"kind": "question"}', {"Content-Type": "application/json"})
    assert reply.status == 400 and "no run is served" in reply.json()["detail"]
    body, kind = multipart({"kind": "question", "text": "what?"}, {"image": ("x.txt", b"not an image at all")})
    reply = fetch(url, "/ask", "POST", body, {"Content-Type": kind})
    assert reply.status == 400 and "not an image" in reply.text and "Traceback" not in reply.text
    reply = fetch(url, "/ask", "POST", b"--broken\r\nnothing", {"Content-Type": "multipart/form-data; boundary=x"})
    assert reply.status == 400 and "Traceback" not in reply.text
    other_site = {"Content-Type": "application/json", "Origin": "http://attacker.example"}
    reply = fetch(url, "/api/ask", "POST", b'{"kind": "question"}', other_site)
    assert reply.status == 403 and "another site" in reply.json()["detail"]
    for headers in ({"Origin": "null"}, {"Sec-Fetch-Site": "cross-site", "Origin": url.rstrip("/")}):
        reply = fetch(url, "/ask", "POST", b"kind=question", headers)
        assert reply.status == 403 and "another site" in reply.text
    host = url.split("//")[1].rstrip("/")
    for headers in ({"Origin": f"http://{host}", "Host": host}, {"Sec-Fetch-Site": "same-origin", "Origin": "null"}):
        assert "no run is served" in fetch(url, "/ask", "POST", b"kind=question", headers).text  # its own page
    too_long = {"Content-Type": "multipart/form-data; boundary=x", "Content-Length": "999999999"}
    huge = fetch(url, "/ask", "POST", b"", too_long)
    assert huge.status == 413 and "at most" in huge.text


# -- a store of a million records ---------------------------------------------------------------


def image_id(i: int) -> str:
    return f"COCO_train2014_{i:012d}"  # bench/serve.py's million_id


def bench():
    """bench/serve.py, whose simulated million-record store this test reads."""
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "bench" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    root = tmp_path_factory.mktemp("million") / "store"
    bench().write_million(root, present=(0, 1, 2, 479, 999))
    site = open_site([root])
    entry = site.stores["store"]
    reads = {"records": 0}
    for name in ("record_at", "get"):  # count the records a request reads (the store's own methods, wrapped)
        method = getattr(entry.store, name)

        def counted(*args, _method=method, **kwargs):
            reads["records"] += 1
            return _method(*args, **kwargs)

        setattr(entry.store, name, counted)
    with Running(make_app(site)) as running:
        yield running.url, reads


def read_by(million, path: str):
    url, reads = million
    before = reads["records"]
    reply = fetch(url, path)
    return reply, reads["records"] - before


def test_a_page_of_a_million_record_store_reads_only_its_records(million):
    start = time.perf_counter()
    reply, read = read_by(million, "/stores/store")
    assert reply.status == 200 and "page 1 of 41,667" in reply.text and read == 24
    reply, read = read_by(million, "/stores/store?page=19161&per=25")  # records 479,000-479,024: shard 479
    assert reply.status == 200 and image_id(479_000) in reply.text and image_id(479_024) in reply.text
    assert read == 25 and image_id(478_999) not in reply.text
    reply, read = read_by(million, f"/stores/store/image?id={image_id(999_999)}&pos=999999")
    assert reply.status == 200 and read <= 3  # the record, and its neighbour before it
    assert time.perf_counter() - start < 20


def test_a_filtered_page_scans_a_bounded_window(million):
    reply, read = read_by(million, "/stores/store?object=obj3")
    assert reply.status == 200 and read == 3 + 7 * 23 + 1  # the 24 matches: records 3, 10, ..., 164
    assert reply.text.count('class="card"') == 24 and "from=165" in reply.text.replace("&amp;", "&")
    reply, read = read_by(million, "/stores/store?object=obj9")  # no record has object 9
    assert reply.status == 200 and read == SCAN and "from=2000" in reply.text.replace("&amp;", "&")
    assert "looked at records 0–1,999" in reply.text and 'id="no-match"' in reply.text
    reply, read = read_by(million, "/stores/store?object=obj9&from=998000")  # shards 998 (absent: never read)...
    assert reply.status == 500 and "shard 00998.arrow is missing" in reply.text  # ... proves what a page touches


def test_an_exact_id_is_one_lookup(million):
    reply, read = read_by(million, f"/stores/store?q={image_id(2_345)}")
    assert reply.status == 303 and reply.headers["location"].endswith(f"id={image_id(2_345)}") and read == 0


# -- the command ---------------------------------------------------------------------------------


def test_a_bind_beyond_loopback_warns():
    assert host_warning("127.0.0.1") is None and host_warning("localhost") is None and host_warning("::1") is None
    assert "every network interface" in host_warning("0.0.0.0") and "no password" in host_warning("0.0.0.0")
    assert host_warning("192.168.1.5") is not None


def test_the_command_serves_and_stops(tricky):
    _, base = tricky
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "serve", str(base / "store"), "--images", str(base / "images"),
         "--port", "0", "--host", "0.0.0.0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()  # the URL, once it listens
        assert line.startswith("serving 1 store, 0 task datasets and mixtures, 0 runs at http://0.0.0.0:"), line
        port = int(line.split(":")[2].split("/")[0])
        reply = fetch(f"http://127.0.0.1:{port}", "/stores/store")  # loopback only, though it binds everything
        assert reply.status == 200 and "ok" in reply.text
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert "warning:" in err and "every network interface" in err


def test_the_command_says_what_is_wrong(tmp_path):
    from helpers import run_cli

    (tmp_path / "empty").mkdir()
    result = run_cli("serve", tmp_path / "empty", "--port", "0")
    assert result.returncode == 2 and "no feature store in it" in result.stdout + result.stderr
    result = run_cli("serve", "--port", "0")
    assert result.returncode == 2 and "nothing to serve" in result.stdout + result.stderr


def test_images_come_from_image_shards_by_id(tmp_path):
    from pipeline.image_shards import write_shard

    red, green = jpeg(color=(200, 0, 0)), jpeg(color=(0, 200, 0))
    rows = [
        {"image_id": "a", "status": "ok", "image": red, "format": "jpeg"},
        {"image_id": "b", "status": "failed", "error_kind": "http 404"},
        {"image_id": "../c", "status": "ok", "image": green, "format": "jpeg"},  # an id, never a path
    ]
    (tmp_path / "shards").mkdir()
    write_shard(tmp_path / "shards", 0, rows, {"ok": 2})
    rng = np.random.default_rng(1)
    records = [make_record(rng, i, num_boxes=2, feature_dim=8, size=(48, 64)) for i in ("a", "b", "../c")]
    write_records(tmp_path / "store", records, feature_dim=8, dtype="float32")
    with Running(make_app(open_site([tmp_path / "store"], roots=[tmp_path / "shards"]))) as running:
        assert fetch(running.url, "/stores/store/file?id=a").body == red
        assert fetch(running.url, "/stores/store/file?id=..%2Fc").body == green
        assert fetch(running.url, "/stores/store/file?id=b").status == 404  # a failed download has no image
        thumb = fetch(running.url, "/stores/store/thumb?id=a")
        assert thumb.status == 200 and thumb.headers["content-type"] == "image/jpeg"
