"""`vlprep download` end to end: a real HTTP server on 127.0.0.1, real Ray, real processes."""

import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import REPO, no_shared_ray, run_cli
from image_server import ImageServer, write_tsv
from PIL import Image

from pipeline.image_shards import iter_images

LOCAL_FLAGS = [
    "--allow-network",
    "127.0.0.0/8",
    "--connect-timeout",
    "2",
    "--read-timeout",
    "1",
    "--deadline",
    "2",
    "--max-bytes",
    "1000000",
    "--retries",
    "1",
    "--workers",
    "2",
    "--threads",
    "8",
]

GOOD = [
    "rgb.jpg",
    "rgb.png",
    "rgb.webp",
    "anim.gif",
    "exif_rotated.jpg",
    "cmyk.jpg",
    "gray.jpg",
    "rgba.png",
    "palette.png",
    "sixteen.png",
    "big.jpg",
    "octet.jpg",
]
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
    urls += [
        server.url("/flaky/1/e2e"),
        server.url("/busy/e2e"),
        server.url("/redirect-ok"),
        server.url("/img/rgb.jpg"),
    ]
    tsv = tmp_path / "Validation_GCC-1.1.0-Validation.tsv"
    write_tsv(tsv, urls)
    with open(tsv, "a") as f:
        f.write("a malformed row without a url\n")
    out = tmp_path / "out"
    args = ("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, "--shard-size", "7")
    proc = run_cli(*args, *LOCAL_FLAGS, fresh=True)  # a process of its own: its Ray starts there, and prints there
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Token authentication" not in proc.stderr  # Ray's notice is no business of the user's

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
        assert row["status"] == "failed" and row["error_kind"] == reason and row["image"] is None, (
            path,
            row["error_kind"],
        )
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
        args = [
            sys.executable,
            "-m",
            "pipeline.cli",
            "download",
            "--dataset",
            "conceptual_captions",
            "--input",
            str(tsv),
            "--out",
            str(out),
            *KILL_SCRIPT_ARGS,
        ]
        proc = subprocess.Popen(
            args, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
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
    assert run_cli(*common).returncode == 1  # 2 of 3 failed: more than --max-failure-rate 0.5
    first = {r["url"]: r for r in all_rows(out)}
    assert first[urls[0]]["error_kind"] == "http 500" and first[urls[0]]["transient"]
    assert first[urls[1]]["error_kind"] == "http 404" and not first[urls[1]]["transient"]
    assert run_cli(*common).returncode == 1  # plain rerun: nothing to do, the same verdict
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
    assert (
        run_cli("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, *LOCAL_FLAGS).returncode
        == 0
    )
    proc = run_cli(
        "download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, "--shard-size", "3", *LOCAL_FLAGS
    )
    assert proc.returncode == 2 and "other inputs or settings" in proc.stderr
    proc = run_cli("download", "--dataset", "nope", "--input", tsv, "--out", out)
    assert (
        proc.returncode == 2
        and "Invalid value for '--dataset'" in proc.stderr
        and "'nope' is not one of" in proc.stderr
    )


def test_a_failing_shard_is_retried_then_reported(tmp_path, server):
    urls = [server.url(f"/img/rgb.jpg?shardfail={i}") for i in range(6)]
    tsv = tmp_path / "list.tsv"
    write_tsv(tsv, urls)
    out = tmp_path / "out"
    (out / "00001_stats.json").mkdir(parents=True)  # shard 1 cannot be finished: its task raises
    proc = run_cli(
        "download",
        "--dataset",
        "conceptual_captions",
        "--input",
        tsv,
        "--out",
        out,
        "--shard-size",
        "3",
        "--shard-retries",
        "1",
        *LOCAL_FLAGS,
    )
    assert proc.returncode == 1 and "shard 00001 failed" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    reason = summary["shards_failed"]["00001"]  # the task's own error, naming the file, without Ray's traceback
    assert (
        list(summary["shards_failed"]) == ["00001"]
        and reason.startswith("FileExistsError: ")
        and "00001_stats.json" in reason
    )
    assert "Traceback" not in reason and "ray::" not in reason
    assert summary["shards_complete"] == 1 and summary["successes"] == 3
    assert server.hits["/img/rgb.jpg?shardfail=3"] == 2  # the shard ran twice: first try and one retry


def hostile_urls(server, n_random: int, seed: int = 0) -> list[str]:
    """URL strings a careless or hostile list holds: fixed ones, then seeded random garbage in
    the path of a local URL and in host labels. None of them names a good image."""
    port = server.port
    fixed = [
        "http://a..b/x.jpg",
        "http://" + "a" * 64 + ".example/x.jpg",
        "http://\u00e9..example/x.jpg",
        "http://[::1",
        "http://[::1]x/",
        "http://user@",
        "http://user:pw@/x.jpg",
        "http://%zz/x.jpg",
        f"http://127.0.0.1:{port}99999/x.jpg",
        "http://127.0.0.1:-1/x.jpg",
        "http://127.0.0.1:0/x.jpg",
        "http://127.0.0.1:abc/x.jpg",
        "http://exa mple.com/x.jpg",
        f"http://127.0.0.1:{port}/a b.jpg",
        f"http://127.0.0.1:{port}/a\r\nX-Injected: 1",
        f"http://127.0.0.1:{port}/a\tb",
        f"http://127.0.0.1:{port}/\x00",
        f"http://127.0.0.1:{port}/\ud800.jpg",
        "ftp://127.0.0.1/x.jpg",
        "javascript:alert(1)",
        "//no-scheme/x.jpg",
        "http:",
        "http://",
        "\u00e9\u00e9\u00e9",
        f"http://127.0.0.1:{port}/img/nope\u00e9.jpg",
        f"http://alice:s3cret@127.0.0.1:{port}/status/404",
    ]
    rng = random.Random(seed)
    pieces = [
        "..",
        "a" * 70,
        "\u00e9",
        "\u4e2d\u6587",
        " ",
        "\r\n",
        "\t",
        "\x00",
        "\x7f",
        "%",
        "%zz",
        "%00",
        "[",
        "]",
        "@",
        "::",
        "\ud800",
        "#",
        "?",
        "\\",
        "\u202e",
        "\ufeff",
        "\U0001f600",
        "//",
        "%2e%2e/",
    ]
    out = []
    for i in range(n_random):
        garbage = "".join(rng.choice(pieces) + rng.choice(["", "x", "/"]) for _ in range(rng.randint(1, 4)))
        if i % 4 == 0:  # a host label that cannot be encoded: empty or longer than 63 characters
            label = "".join(c for c in garbage if c not in "/@#?\\[]:%")  # so the host stays the bad label
            out.append(f"http://{rng.choice(['', 'a' * rng.randint(64, 90)])}.{label}x.example/y.jpg")
        else:
            out.append(f"http://127.0.0.1:{port}/nothing/{garbage}x")
    return fixed + out


@pytest.mark.slow
def test_hostile_urls_fail_alone_and_the_good_images_of_their_shard_are_kept(tmp_path, server):
    good = [server.url(f"/img/{GOOD[i % len(GOOD)]}?fuzz={i}") for i in range(50)]
    bad = hostile_urls(server, 40)
    urls = good + bad
    lines = tmp_path / "fuzz.jsonl"  # JSON strings carry any character, CR/LF and lone surrogates included
    lines.write_text("".join(json.dumps({"url": u}) + "\n" for u in urls))
    out = tmp_path / "out"
    proc = run_cli(
        "download", "--dataset", "url_list", "--input", lines, "--out", out, "--shard-size", "1000", *LOCAL_FLAGS
    )
    rows = {r["image_id"]: r for r in all_rows(out)}
    assert len(rows) == len(urls), proc.stderr[-3000:]  # one shard, nothing lost
    for i in range(len(good)):
        assert rows[f"fuzz-{i:09d}"]["status"] == "ok", rows[f"fuzz-{i:09d}"]["error"]
    kinds = Counter()
    for i in range(len(good), len(urls)):
        row = rows[f"fuzz-{i:09d}"]
        assert row["status"] == "failed" and row["error_kind"] and row["error"] and row["image"] is None, (urls[i], row)
        kinds[row["error_kind"]] += 1
    assert set(kinds) <= {"invalid url", "unsupported scheme", "http 404"}, kinds  # each named, none "internal error"
    assert not any("s3cret" in (r["url"] or "") + (r["error"] or "") for r in rows.values())  # credentials stripped
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failure_rate"] == round(len(bad) / len(urls), 4) and summary["max_failure_rate"] == 0.5
    assert summary["verdict"] == "failed" and not summary["shards_failed"]
    assert proc.returncode == 1 and "invalid url" in proc.stderr and "--max-failure-rate" in proc.stderr


@pytest.mark.slow
def test_all_refused_exits_1_and_retry_failed_with_the_option_that_allows_them_fetches_them(tmp_path, server):
    urls = [server.url(f"/img/rgb.jpg?private={i}") for i in range(3)]
    tsv = tmp_path / "list.tsv"
    write_tsv(tsv, urls)
    out = tmp_path / "out"
    common = ["download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, "--retries", "0"]
    proc = run_cli(*common)  # loopback is refused by default: every item fails
    assert proc.returncode == 1 and "private address" in proc.stderr and "--allow-private-network" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["verdict"] == "failed"
        and summary["failure_rate"] == 1.0
        and summary["failures"] == {"private address": 3}
    )
    assert run_cli(*common, "--retry-failed").returncode == 1  # the same options: refused again, nothing fetched
    assert sum(server.hits[f"/img/rgb.jpg?private={i}"] for i in range(3)) == 0
    proc = run_cli(*common, "--retry-failed", "--allow-private-network")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["status"] for r in all_rows(out)] == ["ok"] * 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["verdict"] == "ok" and summary["failure_rate"] == 0.0 and summary["successes"] == 3


def test_a_second_download_into_the_same_folder_is_refused_at_once(tmp_path, server):
    from pipeline.io import exclusive_lock

    tsv = tmp_path / "list.tsv"
    write_tsv(tsv, [server.url("/img/rgb.jpg?locked")])
    out = tmp_path / "out"
    with exclusive_lock(out, "test holder"):  # another writer, alive, holding the folder
        started = time.monotonic()
        proc = run_cli("download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, *LOCAL_FLAGS)
        assert proc.returncode == 75 and "another process" in proc.stderr and str(os.getpid()) in proc.stderr
        assert time.monotonic() - started < 30 and not (out / "run.json").exists()
    assert server.hits["/img/rgb.jpg?locked"] == 0


def test_relative_paths_are_absolute_before_they_reach_the_tasks(tmp_path, monkeypatch):
    from pipeline.datasets import ReaderOptions
    from pipeline.distribute import DistributeConfig, MalformedRows
    from pipeline.download.run import DownloadConfig
    from pipeline.download.shard import shard_jobs

    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(b"x")
    (tmp_path / "results_20130124.token").write_text("a.jpg#0\tA thing .\n")
    monkeypatch.chdir(tmp_path)
    cfg = DownloadConfig(
        dataset="folder", inputs=(Path("imgs"),), out=Path("out"), distribute=DistributeConfig(ray_address="auto")
    )
    assert cfg.out == tmp_path / "out" and cfg.inputs == (tmp_path / "imgs",)
    assert cfg.to_json()["out"] == str(tmp_path / "out")
    cfg = DownloadConfig(
        dataset="flickr30k",
        inputs=(Path("results_20130124.token"),),
        out=Path("sub/../out"),
        reader=ReaderOptions(images_root=Path("imgs")),
    )
    assert cfg.out == tmp_path / "out"
    job = next(shard_jobs(cfg.dataset, cfg.inputs, cfg.reader, cfg.distribute.shard_size, MalformedRows()))
    assert job.items[0].path == str(tmp_path / "imgs" / "a.jpg")


def test_an_unexpected_error_in_one_item_becomes_its_failure():
    from pipeline.download.fetch import Fetched
    from pipeline.download.shard import process_item
    from pipeline.download.source_item import SourceItem
    from pipeline.images import ImageConfig

    item = SourceItem(image_id="x", url="http://u:p@example.com/x.jpg")
    raised = Future()
    raised.set_exception(RuntimeError("a bug in a fetch thread"))
    row = process_item(item, raised, ImageConfig())
    assert row["status"] == "failed" and row["error_kind"] == "internal error" and not row["transient"]
    assert row["error"] == "RuntimeError: a bug in a fetch thread" and row["url"] == "http://example.com/x.jpg"
    row = process_item(item, Fetched(None, "http://example.com/x.jpg", 200, "", 1), ImageConfig())  # not bytes
    assert row["error_kind"] == "internal error" and row["error"].startswith("TypeError")


def test_local_paths_no_file_can_have_fail_alone(tmp_path):
    from pipeline.download.fetch import FetchConfig
    from pipeline.download.shard import fetch_rows
    from pipeline.download.source_item import SourceItem
    from pipeline.images import ImageConfig

    items = [
        SourceItem(image_id="nul", path=str(tmp_path / "a\x00b.jpg")),
        SourceItem(image_id="dir", path=str(tmp_path)),
    ]
    rows = fetch_rows(items, [True, True], FetchConfig(threads=2), ImageConfig())
    assert [r["error_kind"] for r in rows] == ["file error", "file error"]


def test_retry_table():
    from pipeline.download.fetch import FetchConfig
    from pipeline.download.shard import policy_of
    from pipeline.failures import should_retry
    from pipeline.images import ImageConfig

    old = policy_of(FetchConfig(max_bytes=1000), ImageConfig(min_side=100, max_aspect_ratio=3))
    same = dict(old)
    assert should_retry("timeout", True, old, same) and should_retry("http 503", True, old, same)
    for kind in ("private address", "too large", "too small", "aspect ratio", "http 404", "opted out", "not an image"):
        assert not should_retry(kind, False, old, same), kind
    assert should_retry("internal error", False, old, same)  # a bug, perhaps fixed since
    looser = {
        "private address": [
            FetchConfig(max_bytes=1000, allow_private_network=True),
            FetchConfig(max_bytes=1000, allowed_networks=("10.0.0.0/8",)),
        ],
        "too large": [FetchConfig(max_bytes=2000)],
        "decompression bomb": [FetchConfig(max_bytes=1000), ImageConfig(max_pixels=10**9)],
    }
    for kind, configs in looser.items():
        fetch = next((c for c in configs if isinstance(c, FetchConfig)), FetchConfig(max_bytes=1000))
        image = next((c for c in configs if isinstance(c, ImageConfig)), ImageConfig(min_side=100, max_aspect_ratio=3))
        assert should_retry(kind, False, old, policy_of(fetch, image)), kind
    for image, kind in (
        (ImageConfig(min_side=50, max_aspect_ratio=3), "too small"),
        (ImageConfig(min_side=100, max_aspect_ratio=0), "aspect ratio"),
        (ImageConfig(min_side=100, max_aspect_ratio=4), "aspect ratio"),
    ):
        assert should_retry(kind, False, old, policy_of(FetchConfig(max_bytes=1000), image)), kind
    stricter = policy_of(FetchConfig(max_bytes=500), ImageConfig(min_side=200, max_aspect_ratio=2))
    assert not any(should_retry(k, False, old, stricter) for k in ("too large", "too small", "aspect ratio"))
    tighter_everything = policy_of(FetchConfig(max_bytes=10**9, allow_private_network=True), ImageConfig())
    assert not should_retry("opted out", False, old, tighter_everything)  # never, whatever the options
    assert should_retry("private address", False, None, same)  # made by a version that did not record its options


def test_verdict():
    from pipeline.failures import verdict

    ok = verdict(10, 6, Counter({"http 404": 4}), {}, 0.5)
    assert ok["verdict"] == "ok" and ok["failure_rate"] == 0.4 and ok["verdict_reason"] is None
    bad = verdict(10, 4, Counter({"http 404": 5, "private address": 1}), {}, 0.5)
    assert bad["verdict"] == "failed" and bad["failure_rate"] == 0.6
    assert "6 of 10" in bad["verdict_reason"] and "http 404 x 5" in bad["verdict_reason"]
    assert "--retry-failed" in bad["verdict_reason"] and "--allow-private-network" in bad["verdict_reason"]
    assert verdict(3, 0, Counter({"timeout": 3}), {}, 1.0)["verdict"] == "failed"  # all failed
    nothing = verdict(0, 0, Counter(), {}, 0.5, malformed=12)  # e.g. a wrong --url-col: every row malformed
    assert nothing["verdict"] == "failed" and "all 12 input rows are malformed" in nothing["verdict_reason"]
    assert verdict(0, 0, Counter(), {}, 0.5)["verdict_reason"] == "no items: the input lists none"
    shards = verdict(10, 10, Counter(), {"00001": "IsADirectoryError: x"}, 0.5)
    assert shards["verdict"] == "failed" and "00001" in shards["verdict_reason"]


def test_a_shard_task_error_is_reported_as_its_own_error_and_a_full_disk_stops_the_run():
    import errno

    from ray.exceptions import RayTaskError

    from pipeline.distribute import shard_failure
    from pipeline.errors import describe

    wrapped = RayTaskError(
        "_shard_task", "Traceback (most recent call last): ...", FileExistsError("/o/00001_stats.json")
    )
    assert shard_failure(wrapped.as_instanceof_cause()) == "FileExistsError: /o/00001_stats.json"
    full = OSError(errno.ENOSPC, "No space left on device", "/o/.tmp-00003.parquet.77")
    with pytest.raises(OSError) as info:  # not retried, not counted: the run stops (exit 74)
        shard_failure(RayTaskError("_shard_task", "Traceback ...", full).as_instanceof_cause())
    assert info.value is full and describe(info.value).startswith("disk full writing /o/.tmp-00003.parquet.77")
    flaky = OSError(errno.EIO, "Input/output error", "/nfs/o/00004.parquet")  # e.g. NFS: retried like any error
    assert shard_failure(RayTaskError("_shard_task", "Traceback ...", flaky).as_instanceof_cause()).startswith(
        "OSError"
    )


# -- the one distributor ----------------------------------------------------------


def test_one_distributor_runs_the_shards_of_download_and_extract():
    """Ray start, in-flight bound, retry-then-report, done-shard scan and the summary skeleton
    live in pipeline/distribute.py only: the stage runners keep their stage logic, and extract
    cuts its shards without a (fake) DownloadConfig."""
    root = REPO / "pipeline"
    assert "def run_shards" in (root / "distribute.py").read_text()
    for path in root.rglob("*.py"):
        if path.name == "distribute.py":
            continue
        text = path.read_text()
        for twin in (
            "ray.init(",
            "ray.wait(",
            "ray.shutdown(",
            "in_flight[",
            "def shard_failure",
            "def done_shards",
            'glob("[0-9]*',
            "MAX_LISTED_MALFORMED",
        ):
            assert twin not in text or (twin == "def done_shards" and path.name == "image_shards.py"), (path, twin)
    for path in (root / "detect").glob("*.py"):
        text = path.read_text()
        assert "DownloadConfig" not in text and "pipeline.download.run" not in text, path
    run = (root / "detect" / "run.py").read_text()
    for concern in (
        "class DetectorActor",
        "def read_given_boxes",
        "def resolve_device",
        "class ExtractConfig",
        "def _download_rows",
    ):
        assert concern not in run, concern


def test_distribute_cuts_scans_and_checks_its_config(tmp_path):
    from pipeline.distribute import (
        DistributeConfig,
        MalformedRows,
        capacity,
        chunks,
        done_shards,
        stats_path,
        task_resources,
        this_node,
    )
    from pipeline.errors import ConfigError, DataError

    assert list(chunks(range(5), 2)) == [(0, [0, 1]), (1, [2, 3]), (2, [4])] and list(chunks([], 3)) == []
    stats_path(tmp_path, 3).write_text('{"count": 1}')
    (tmp_path / "00004_stats.json").mkdir()  # not a file: not done
    (tmp_path / "x_stats.json").write_text("{}")
    assert done_shards(tmp_path, "stats") == {3: {"count": 1}}
    assert done_shards(tmp_path, "stats", complete=lambda n: n != 3) == {}
    stats_path(tmp_path, 5).write_text("{trunc")
    with pytest.raises(DataError, match="00005_stats.json: unreadable stats"):
        done_shards(tmp_path, "stats")
    for fields, flag in (
        ({"shard_size": 0}, "--shard-size"),
        ({"workers": 0}, "--workers"),
        ({"shard_retries": -1}, "--shard-retries"),
        ({"max_failure_rate": 1.5}, "--max-failure-rate"),
        ({"download_resource": "CPU"}, "--download-resource"),
        ({"capacity_timeout": -1}, "--capacity-timeout"),
    ):
        with pytest.raises(ConfigError, match=flag):
            DistributeConfig(**fields)
    cfg = DistributeConfig(download_resource="download")
    assert task_resources(cfg) == {"num_cpus": 1, "resources": {"download": 1}}
    gpu_actor = {"num_gpus": 1, "num_cpus": 0}
    assert capacity(cfg, gpu_actor, gpu_actor, task_resources(cfg)).needs == {"GPU": 2, "CPU": 1, "download": 1}
    assert task_resources(DistributeConfig()) == {"num_cpus": 1}
    no_shared_ray()
    assert this_node() == {"node_id": None, "hostname": socket.gethostname()}  # not in a Ray process
    malformed = MalformedRows()
    for i in range(150):
        malformed.add(f"row {i}")
    assert malformed.count == 150 and len(malformed.examples) == 100


def test_run_shards_bounds_in_flight_work_retries_then_reports():
    import ray

    from pipeline.distribute import DistributeConfig, Progress, capacity, ray_session, run_shards
    from pipeline.errors import NoCapacityError

    class Job:
        def __init__(self, number):
            self.number = number

    def work(number: int, attempt: int) -> int:
        if number == 3 or (number == 5 and attempt == 0):
            raise ValueError(f"shard {number} broke")
        return number * 10

    attempts, running, most, committed = Counter(), [0], [0], {}

    def submit(job):
        running[0] += 1
        most[0] = max(most[0], running[0])
        attempts[job.number] += 1
        return remote.remote(job.number, attempts[job.number] - 1)

    def commit(job, result):
        running[0] -= 1
        committed[job.number] = result

    no_shared_ray()  # this test is of a run's own Ray
    with ray_session(DistributeConfig(workers=1)):
        remote = ray.remote(num_cpus=1, max_retries=0)(work)
        progress = Progress()
        failed = run_shards(map(Job, range(8)), submit, commit, retries=2, max_in_flight=3, progress=progress)
        assert failed == {"00003": "ValueError: shard 3 broke"} and attempts[3] == 3 and attempts[5] == 2
        assert committed == {n: n * 10 for n in range(8) if n != 3}
        assert progress.shards_done == 7 and progress.shards_failed == 1
        running[0] = most[0] = 0
        committed.clear()
        run_shards(map(Job, range(10, 30)), submit, commit, retries=0, max_in_flight=3, progress=Progress())
        assert len(committed) == 20 and most[0] == 3  # never more than max_in_flight at once
        needs = {"num_cpus": 1, "resources": {"download": 1}}  # a resource no node of this cluster offers
        stuck = ray.remote(**needs)(work)
        with pytest.raises(NoCapacityError, match=r"no capacity left.*needs \{'download': 1\}.*offer \{'download': 0"):
            run_shards(
                [Job(0)],
                lambda job: stuck.remote(0, 0),
                commit,
                retries=0,
                max_in_flight=1,
                progress=Progress(),
                capacity=capacity(DistributeConfig(), needs),
            )  # local: at once
    assert not ray.is_initialized()  # the session it started is shut down
