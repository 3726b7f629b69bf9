"""`vlprep download` end to end: a real HTTP server on 127.0.0.1, real Ray, real processes."""

import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
from helpers import REPO, run_cli
from image_server import ImageServer, write_tsv
from PIL import Image

from pipeline.image_shards import iter_images

LOCAL_FLAGS = ["--allow-network", "127.0.0.0/8", "--connect-timeout", "2", "--read-timeout", "1", "--deadline", "2",
               "--max-bytes", "1000000", "--retries", "1", "--workers", "2", "--threads", "8"]

GOOD = ["rgb.jpg", "rgb.png", "rgb.webp", "anim.gif", "exif_rotated.jpg", "cmyk.jpg", "gray.jpg", "rgba.png",
        "palette.png", "sixteen.png", "big.jpg", "octet.jpg"]
BAD = {  # path -> expected reason
    "/status/404": "http 404",
    "/status/403": "http 403",
    "/trickle": "deadline",
    "/endless": "too large",
    "/html-as-jpeg": "not an image",
    "/truncated.jpg": "decode error",
    "/bomb.png": "decompression bomb",
    "/loop": "redirect loop",
    "/to-private": "private address",
    "/noai": "opted out",
}


def all_rows(out):
    rows = []
    for shard in sorted(out.glob("*.parquet")):
        rows += pq.read_table(shard).to_pylist()
    return rows


def test_download_end_to_end(tmp_path, server):
    urls = [server.url(f"/img/{n}") for n in GOOD] + [server.url(p) for p in BAD]
    urls += [server.url("/flaky/1/e2e"), server.url("/busy/e2e"), server.url("/redirect-ok"), server.url("/img/rgb.jpg")]
    tsv = tmp_path / "Validation_GCC-1.1.0-Validation.tsv"
    write_tsv(tsv, urls)
    with open(tsv, "a") as f:
        f.write("a malformed row without a url\n")
    out = tmp_path / "out"
    proc = run_cli("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, "--shard-size", "7", *LOCAL_FLAGS)
    assert proc.returncode == 0, proc.stderr[-3000:]

    rows = {r["image_id"]: r for r in all_rows(out)}
    assert len(rows) == len(urls)  # every item is a row, failed ones included
    by_url = {}
    for r in rows.values():
        by_url.setdefault(r["url"], []).append(r)
    for name in GOOD:
        row = by_url[server.url(f"/img/{name}")][0]
        assert row["status"] == "ok", (name, row["error_kind"], row["error"])
        im = Image.open(io.BytesIO(row["image"]))
        im.load()
        assert im.mode == "RGB" and (im.width, im.height) == (row["width"], row["height"])
        import hashlib

        assert hashlib.sha256(row["image"]).hexdigest() == row["sha256"]
    rotated = np.asarray(Image.open(io.BytesIO(by_url[server.url("/img/exif_rotated.jpg")][0]["image"])))
    assert rotated.shape == (48, 64, 3) and rotated[24, 5, 0] > 200 and rotated[24, 58, 2] > 200
    assert by_url[server.url("/img/rgb.jpg")][0]["image"] == server.corpus["rgb.jpg"][0]  # original bytes kept
    for path, reason in BAD.items():
        row = by_url[server.url(path)][0]
        assert row["status"] == "failed" and row["error_kind"] == reason and row["image"] is None, (path, row["error_kind"])
    assert all(r["status"] == "ok" for r in by_url[server.url("/img/rgb.jpg")])  # duplicate URL: both stored
    assert len(by_url[server.url("/img/rgb.jpg")]) == 2
    for path in ("/flaky/1/e2e", "/busy/e2e", "/redirect-ok"):
        assert by_url[server.url(path)][0]["status"] == "ok"
    assert rows["cc3m-val-00000000"]["texts"] == [{"kind": "caption", "text": "caption 0"}]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["items_in_shards"] == len(urls) and summary["successes"] == len(urls) - len(BAD)
    assert summary["malformed_rows"] == 1 and "expected 2 tab-separated fields" in summary["malformed_examples"][0]
    assert summary["failures"]["http 404"] == 1 and not summary["shards_failed"]
    stats = json.loads((out / "00000_stats.json").read_text())
    assert stats["count"] == 7 and stats["successes"] + sum(stats["failures"].values()) == 7
    assert "stored" in proc.stdout and "http 404" in proc.stdout
    assert len(list(iter_images(out))) == len(urls) - len(BAD)


KILL_SCRIPT_ARGS = ["--shard-size", "4", "--workers", "2", "--threads", "2", "--allow-network", "127.0.0.0/8"]


def test_killed_download_resumes_with_nothing_lost_or_duplicated(tmp_path):
    server = ImageServer(delay=0.15)
    try:
        urls = [server.url(f"/img/{GOOD[i % len(GOOD)]}?n={i}") for i in range(48)]
        tsv = tmp_path / "list.tsv"
        write_tsv(tsv, urls)
        out = tmp_path / "out"
        args = [sys.executable, "-m", "pipeline.cli", "download", "--dataset", "conceptual_captions",
                "--input", str(tsv), "--out", str(out), *KILL_SCRIPT_ARGS]
        proc = subprocess.Popen(args, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline and len(list(out.glob("*_stats.json"))) < 2:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray processes it started
        proc.wait(timeout=30)
        done_before = len(list(out.glob("*_stats.json")))
        assert 2 <= done_before < 12, "the run was not killed mid-way"
        for shard in out.glob("*.parquet"):  # nothing half-written under a final name
            assert pq.read_table(shard).num_rows == 4

        rerun = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        ids = [r["image_id"] for r in all_rows(out)]
        assert sorted(ids) == [f"cc3m-list-{i:08d}" for i in range(48)]  # each exactly once
        summary = json.loads((out / "summary.json").read_text())
        assert summary["successes"] == 48 and summary["shards_complete"] == 12
        assert not list(out.glob(".tmp-*"))
    finally:
        server.close()


def test_retry_failed_reattempts_only_transient_failures(tmp_path, server):
    urls = [server.url("/flaky/3/retry"), server.url("/status/404?retry"), server.url("/img/rgb.jpg?retry")]
    tsv = tmp_path / "list.tsv"
    write_tsv(tsv, urls)
    out = tmp_path / "out"
    common = ["download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, *LOCAL_FLAGS]
    assert run_cli(*common).returncode == 0
    first = {r["url"]: r for r in all_rows(out)}
    assert first[urls[0]]["error_kind"] == "http 500" and first[urls[0]]["transient"]
    assert first[urls[1]]["error_kind"] == "http 404" and not first[urls[1]]["transient"]
    assert run_cli(*common).returncode == 0  # plain rerun: nothing to do
    assert server.hits["/flaky/3/retry"] == 2
    proc = run_cli(*common, "--retry-failed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    second = {r["url"]: r for r in all_rows(out)}
    assert second[urls[0]]["status"] == "ok" and second[urls[2]]["image"] == first[urls[2]]["image"]
    assert second[urls[1]]["status"] == "failed" and server.hits["/status/404?retry"] == 1  # not retried
    assert server.hits["/img/rgb.jpg?retry"] == 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["successes"] == 2 and summary["failures"] == {"http 404": 1}


def test_download_refuses_a_folder_made_from_other_inputs(tmp_path, server):
    tsv = tmp_path / "a.tsv"
    write_tsv(tsv, [server.url("/img/rgb.jpg?x")])
    out = tmp_path / "out"
    assert run_cli("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, *LOCAL_FLAGS).returncode == 0
    proc = run_cli("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, "--shard-size", "3", *LOCAL_FLAGS)
    assert proc.returncode == 2 and "other inputs or settings" in proc.stderr
    proc = run_cli("download", "--dataset", "nope", "--input", tsv, "--out", out)
    assert proc.returncode == 2 and "unknown dataset" in proc.stderr


def test_a_failing_shard_is_retried_then_reported(tmp_path, server):
    urls = [server.url(f"/img/rgb.jpg?shardfail={i}") for i in range(6)]
    tsv = tmp_path / "list.tsv"
    write_tsv(tsv, urls)
    out = tmp_path / "out"
    (out / "00001_stats.json").mkdir(parents=True)  # shard 1 cannot be finished: its task raises
    proc = run_cli("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out,
                   "--shard-size", "3", "--shard-retries", "1", *LOCAL_FLAGS)
    assert proc.returncode == 1 and "shard 00001 failed" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["shards_failed"]) == ["00001"] and "IsADirectoryError" in summary["shards_failed"]["00001"]
    assert summary["shards_complete"] == 1 and summary["successes"] == 3
    assert server.hits["/img/rgb.jpg?shardfail=3"] == 2  # the shard ran twice: first try and one retry
