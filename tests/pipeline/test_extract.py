"""`vlprep extract` end to end: served images, real Ray, the tiny detector config."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from detector_layouts import random_weights, write_d2_pickle
from helpers import REPO, command_lines, extract_args, process_tree, run_cli
from image_server import ImageServer, write_tsv
from PIL import Image

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.errors import ConfigError
from pipeline.io import sha256_file
from pipeline.store import FeatureStore, verify_store

TINY = DetectorConfig.load("tiny")
GOOD = ["rgb.jpg", "rgb.png", "cmyk.jpg", "gray.jpg", "rgba.png", "exif_rotated.jpg", "big.jpg", "anim.gif"]
NET = ["--allow-network", "127.0.0.0/8", "--deadline", "3", "--workers", "2", "--threads", "4"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "tiny.pkl"
    write_d2_pickle(path, random_weights(TINY, seed=5))
    return path


def test_extract_downloads_and_fills_a_verified_store(tmp_path, server, weights):
    urls = [server.url(f"/img/{n}") for n in GOOD] + [server.url("/truncated.jpg"), server.url("/status/404")]
    tsv = tmp_path / "val.tsv"
    write_tsv(tsv, urls)
    out = tmp_path / "feats"
    proc = run_cli(
        *extract_args(
            out,
            dataset="conceptual_captions",
            input=tsv,
            weights=weights,
            boxes="5-12",
            shard_size=4,
            batch_size=2,
            keep_images=tmp_path / "images",
        ),
        *NET,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(out)
    assert len(store) == len(GOOD)
    prov = store.manifest.provenance
    assert prov["detector"] == "tiny" and prov["weights_sha256"] == sha256_file(weights)
    assert prov["box_policy"].startswith("butd boxes=5-12") and prov["weights_layout"] == "d2-pickle"
    assert (
        store.manifest.layout.cls_dim == TINY.num_classes + 1
        and store.manifest.layout.attr_dim == TINY.num_attributes + 1
    )
    for rec in store:
        assert 5 <= rec.num_boxes <= 12 and rec.features.shape[1] == 128
    rotated = store.get("cc3m-val-00000005")  # the EXIF-rotated image: stored upright size
    assert (rotated.image_h, rotated.image_w) == (48, 64)
    assert verify_store(out).ok
    stats = [json.loads(p.read_text()) for p in sorted((out / "extract").glob("*_stats.json"))]
    failed = {f["image_id"]: f["kind"] for s in stats for f in s["failed_images"]}
    assert failed == {"cc3m-val-00000008": "decode error", "cc3m-val-00000009": "http 404"}
    summary = json.loads((out / "extract_summary.json").read_text())
    assert summary["images"] == len(urls) and summary["extracted"] == len(GOOD) and summary["shards_done"] == 3
    assert len(list((tmp_path / "images").glob("*.parquet"))) == 3  # --keep-images

    # the downloaded image shards are an image source too; same detector -> same features
    proc = run_cli(
        *extract_args(tmp_path / "again", images=tmp_path / "images", weights=weights, boxes="5-12", workers=2)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = FeatureStore.open(tmp_path / "again")
    np.testing.assert_array_equal(again.get("cc3m-val-00000000").features, store.get("cc3m-val-00000000").features)

    png = tmp_path / "show.png"
    proc = run_cli("show", out, "cc3m-val-00000006", "--image", tmp_path / "big.jpg", "-o", png)
    assert proc.returncode == 2 and "image not found" in proc.stderr
    (tmp_path / "big.jpg").write_bytes(server.corpus["big.jpg"][0])
    vocab = tmp_path / "objects_vocab.txt"
    vocab.write_text("\n".join(f"thing{i},synonym" for i in range(TINY.num_classes)))
    proc = run_cli(
        "show", out, "cc3m-val-00000006", "--image", tmp_path / "big.jpg", "-o", png, "--objects-vocab", vocab
    )
    assert proc.returncode == 0, proc.stderr
    drawn = np.asarray(Image.open(png))
    assert drawn.shape == (480, 640, 3) and not np.array_equal(drawn, np.asarray(Image.open(tmp_path / "big.jpg")))
    proc = run_cli("show", out, "cc3m-val-00000000", "--image", tmp_path / "big.jpg", "-o", png)
    assert proc.returncode == 2 and "not the same picture" in proc.stderr


def test_extract_refuses_without_weights(tmp_path):
    proc = run_cli("extract", "--images", tmp_path, "--out", tmp_path / "s")
    assert proc.returncode == 2 and "--weights is required" in proc.stderr and "py-bottom-up-attention" in proc.stderr


def test_random_weights_are_stamped_into_provenance(tmp_path, server):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("rgb.jpg", "gray.jpg"):
        (folder / name).write_bytes(server.corpus[name][0])
    (folder / "broken.jpg").write_bytes(b"\xff\xd8\xff not really")
    proc = run_cli(*extract_args(tmp_path / "s", images=folder, boxes=4, backend="lmdb"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "s")
    assert sorted(store.ids()) == ["gray", "rgb"] and store.manifest.provenance["random_weights"] is True
    assert store.get("rgb").num_boxes == 4


def test_killed_extract_resumes_without_loss_or_duplicates(tmp_path, weights):
    server = ImageServer(delay=0.2)
    try:
        urls = [server.url(f"/img/{GOOD[i % len(GOOD)]}?k={i}") for i in range(24)]
        tsv = tmp_path / "list.tsv"
        write_tsv(tsv, urls)
        out = tmp_path / "feats"
        args = [
            sys.executable,
            "-m",
            "pipeline.cli",
            *extract_args(
                out, dataset="conceptual_captions", input=tsv, weights=weights, boxes="5-12", shard_size=3, threads=1
            ),
            *NET,
        ]
        proc = subprocess.Popen(
            args, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.time() + 120
        while time.time() < deadline and len(list((out / "extract").glob("*_stats.json"))) < 2:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        before = len(list((out / "extract").glob("*_stats.json")))
        assert 2 <= before < 8
        rerun = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        store = FeatureStore.open(out)
        assert sorted(store.ids()) == sorted(f"cc3m-list-{i:08d}" for i in range(24))
        assert verify_store(out).ok
    finally:
        server.close()


def test_given_boxes_file(tmp_path, server, weights):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("rgb.jpg", "gray.jpg", "big.jpg"):
        (folder / name).write_bytes(server.corpus[name][0])
    boxes = {"rgb": [[0, 0, 64, 48], [5, 5, 20, 30]], "big": [[10, 10, 600, 470]], "gray": [[0, 0, 500, 500]]}
    (tmp_path / "boxes.json").write_text(json.dumps(boxes))
    proc = run_cli(
        *extract_args(
            tmp_path / "s", images=folder, weights=weights, given_boxes=tmp_path / "boxes.json", dtype="float32"
        )
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(tmp_path / "s")
    np.testing.assert_array_equal(store.get("rgb").boxes, np.array(boxes["rgb"], np.float32))
    assert store.get("big").num_boxes == 1 and "gray" not in store  # its box lies outside the 64x48 image
    stats = json.loads((tmp_path / "s" / "extract" / "00000_stats.json").read_text())
    assert stats["failures"] == {"invalid record": 1} and stats["failed_images"][0]["image_id"] == "gray"
    assert store.manifest.provenance["box_policy"].startswith("given boxes from boxes.json")
    (tmp_path / "bad.json").write_text(json.dumps({"x": [[5, 5, 1, 1]]}))
    proc = run_cli(*extract_args(tmp_path / "t", images=folder, weights=weights, given_boxes=tmp_path / "bad.json"))
    assert proc.returncode == 2 and "x1 <= x2" in proc.stderr


def _actor_pids(root: int) -> list[int]:
    """The detector actors of the extract run `root` (its own process tree only: never another
    test's or another run's actors on this machine)."""
    return [pid for pid, line in command_lines(process_tree(root)[1:]).items() if "ray::DetectorActor" in line]


def test_a_dead_detector_actor_is_replaced_and_its_shard_retried(tmp_path, weights):
    server = ImageServer(delay=0.1)
    try:
        urls = [server.url(f"/img/{GOOD[i % len(GOOD)]}?a={i}") for i in range(18)]
        tsv = tmp_path / "list.tsv"
        write_tsv(tsv, urls)
        out = tmp_path / "feats"
        args = [
            sys.executable,
            "-m",
            "pipeline.cli",
            *extract_args(
                out, dataset="conceptual_captions", input=tsv, weights=weights, boxes=5, shard_size=3, threads=1
            ),
            *NET,
        ]
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and not (_actor_pids(proc.pid) and list((out / "extract").glob("*_stats.json"))):
            time.sleep(0.05)
        pids = _actor_pids(proc.pid)
        assert pids, "no detector actor seen"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        store = FeatureStore.open(out)
        assert sorted(store.ids()) == sorted(f"cc3m-list-{i:08d}" for i in range(18))
    finally:
        server.close()


@pytest.mark.slow
def test_extract_where_all_failed_exits_1_and_retry_failed_extracts_them_once(tmp_path, server, weights):
    urls = [server.url(f"/img/{n}?xr={i}") for i, n in enumerate(("rgb.jpg", "gray.jpg", "big.jpg"))]
    urls.append(server.url("/status/404?xr"))
    tsv = tmp_path / "val.tsv"
    write_tsv(tsv, urls)
    out = tmp_path / "feats"
    common = extract_args(
        out, dataset="conceptual_captions", input=tsv, weights=weights, boxes=5, shard_size=2, workers=2, threads=2
    )
    proc = run_cli(*common)  # loopback is refused by default: every image fails
    assert proc.returncode == 1 and "private address x 4" in proc.stderr and "--allow-private-network" in proc.stderr
    summary = json.loads((out / "extract_summary.json").read_text())
    assert summary["verdict"] == "failed" and summary["failure_rate"] == 1.0 and summary["max_failure_rate"] == 0.5
    first_stats = (out / "extract" / "00000_stats.json").read_text()

    proc = run_cli(*common, "--retry-failed", "--allow-private-network")
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(out)
    assert sorted(store.ids()) == ["cc3m-val-00000000", "cc3m-val-00000001", "cc3m-val-00000002"]
    assert verify_store(out).ok
    stats = [json.loads(p.read_text()) for p in sorted((out / "extract").glob("*_stats.json"))]
    assert [f["kind"] for s in stats for f in s["failed_images"]] == [
        "http 404"
    ]  # re-attempted, now for its own reason
    assert [s["count"] for s in stats] == [2, 2] and stats[0]["extracted"] == 2 and stats[0]["failures"] == {}
    summary = json.loads((out / "extract_summary.json").read_text())
    assert summary["verdict"] == "ok" and summary["extracted"] == 3 and summary["failures"] == {"http 404": 1}
    assert server.hits["/status/404?xr"] == 1

    # killed after the store commit but before its stats were updated: the retry redoes the
    # shard's images, the store keeps one copy of each, and the stats end up right
    (out / "extract" / "00000_stats.json").write_text(first_stats)
    proc = run_cli(*common, "--retry-failed", "--allow-private-network")
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(out)
    assert len(store) == 3 and verify_store(out).ok
    stats = json.loads((out / "extract" / "00000_stats.json").read_text())
    assert stats["failed_images"] == [] and stats["extracted"] + stats["already_present"] == 2
    assert server.hits["/status/404?xr"] == 1  # shard 1 had nothing left to retry


@pytest.mark.slow
def test_extract_reads_img2dataset_files_output(tmp_path):
    from test_image_shards import write_img2dataset_files_output

    source = write_img2dataset_files_output(tmp_path / "i2d")
    proc = run_cli(*extract_args(tmp_path / "s", images=source, boxes=4))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(FeatureStore.open(tmp_path / "s").ids()) == ["000000000", "000000002", "000010000"]


def test_relative_extract_paths_are_absolute_before_they_reach_the_workers(tmp_path, monkeypatch):
    from pipeline.detect.config import ExtractConfig
    from pipeline.distribute import DistributeConfig

    for name in ("imgs", "keep"):
        (tmp_path / name).mkdir()
    (tmp_path / "boxes.json").write_text("{}")
    (tmp_path / "w.pkl").write_bytes(b"")
    (tmp_path / "list.tsv").write_text("")
    monkeypatch.chdir(tmp_path)
    cfg = ExtractConfig(
        out=Path("feats"),
        images=Path("imgs"),
        weights=Path("w.pkl"),
        keep_images=Path("keep"),
        given_boxes=Path("boxes.json"),
        distribute=DistributeConfig(ray_address="auto"),
    )
    assert (cfg.out, cfg.images, cfg.weights, cfg.keep_images, cfg.given_boxes) == (
        tmp_path / "feats",
        tmp_path / "imgs",
        tmp_path / "w.pkl",
        tmp_path / "keep",
        tmp_path / "boxes.json",
    )
    cfg = ExtractConfig(
        out=Path("feats"), dataset="conceptual_captions", inputs=(Path("list.tsv"),), random_weights=True
    )
    assert cfg.inputs == (tmp_path / "list.tsv",)
    assert cfg.to_json()["out"] == str(tmp_path / "feats")


def test_one_image_that_breaks_the_decoder_fails_alone(server):
    from pipeline.detect.actor import DetectorActor
    from pipeline.detect.config import BoxCount, SelectionConfig

    tiny = {"backend": "butd-c4", "config": TINY.to_json()}
    actor = DetectorActor(tiny, None, 0, SelectionConfig("butd", BoxCount.parse("4")), "cpu", False, 2)
    rows = [
        {"image_id": "good", "status": "ok", "image": server.corpus["rgb.jpg"][0], "url": None},
        {"image_id": "none", "status": "ok", "image": None, "url": "http://u:p@example.com/none.jpg"},
        {"image_id": "junk", "status": "ok", "image": b"junk", "url": None},
        {
            "image_id": "gone",
            "status": "failed",
            "error_kind": "http 404",
            "error": "x",
            "transient": False,
            "url": None,
        },
    ]
    result = actor.extract(7, rows)
    assert [r.image_id for r in result["records"]] == ["good"]
    failed = {f["image_id"]: f for f in result["failures"]}
    assert {k: f["kind"] for k, f in failed.items()} == {
        "none": "internal error",
        "junk": "not an image",
        "gone": "http 404",
    }
    assert failed["none"]["detail"].startswith("TypeError") and failed["none"]["url"] == "http://example.com/none.jpg"
    assert failed["gone"]["transient"] is False


def test_keep_images_inside_the_store_is_refused(tmp_path):
    """`--keep-images X --out X` answered "another process (pid <its own>) is writing", exit 75."""
    from pipeline.detect.config import ExtractConfig

    (tmp_path / "imgs").mkdir()
    for keep in (tmp_path / "feats", tmp_path / "feats" / "images", tmp_path):
        with pytest.raises(ConfigError, match="--keep-images .* and --out .* overlap"):
            ExtractConfig(out=tmp_path / "feats", images=tmp_path / "imgs", random_weights=True, keep_images=keep)


@pytest.mark.parametrize(
    "detector,dataset,extra",
    [
        ("vinvl-tiny", "conceptual_captions", ["--boxes", "3-5"]),  # a dataset, downloaded on Ray
        ("grid-tiny", "url_list", ["--grid-pool", "2x2"]),  # a plain URL list
    ],
)
def test_the_newer_backends_extract_downloads_on_ray(tmp_path, server, detector, dataset, extra):
    urls = [server.url(f"/img/{n}") for n in ("rgb.jpg", "gray.jpg", "exif_rotated.jpg")] + [server.url("/status/404")]
    if dataset == "url_list":
        source = tmp_path / "urls.txt"
        source.write_text("\n".join(urls) + "\n")
    else:
        source = tmp_path / "val.tsv"
        write_tsv(source, urls)
    out = tmp_path / "feats"
    proc = run_cli(*extract_args(out, dataset=dataset, input=source, detector=detector, shard_size=2), *extra, *NET)
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = FeatureStore.open(out)
    assert len(store) == 3 and verify_store(out).ok
    prov = store.manifest.provenance
    assert prov["extractor"]["backend"] == ("vinvl-x152c4" if detector == "vinvl-tiny" else "grid")
    stats = [json.loads(p.read_text()) for p in sorted((out / "extract").glob("*_stats.json"))]
    assert [f["kind"] for s in stats for f in s["failed_images"]] == ["http 404"]
    counts = {rec.num_boxes for rec in store}
    assert counts <= set(range(3, 6)) if detector == "vinvl-tiny" else counts == {4}


def test_a_weights_file_of_another_family_is_refused_before_any_work(tmp_path, weights):
    """A BUTD pickle given to --detector vinvl-x152c4 (and a grid config): named, exit 2, nothing written."""
    (tmp_path / "images").mkdir()
    for detector in ("vinvl-tiny", "grid-tiny"):
        proc = run_cli(
            *extract_args(tmp_path / detector, images=tmp_path / "images", detector=detector, weights=weights)
        )
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "a butd-c4 weights file (its key names), not a" in proc.stderr and "--detector vg-r101" in proc.stderr
        assert not (tmp_path / detector).exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--detector", "grid-x152", "--grid-pool", "20x8"], "--grid-pool 20x8 is larger than the map"),
        (["--detector", "vinvl-x152c4", "--labelmap", "LABELMAP"], "label_to_idx has 3 entries"),
        (["--detector", "vg-r101", "--policy", "per-class"], "--policy per-class is not a butd-c4 policy"),
        (["--detector", "grid-r50", "--boxes", "36"], "selects no regions, so --boxes mean nothing"),
    ],
)
def test_options_a_backend_cannot_take_are_named_before_any_work(tmp_path, args, message):
    (tmp_path / "images").mkdir()
    labelmap = tmp_path / "labelmap.json"
    labelmap.write_text(json.dumps({"label_to_idx": {"a": 1, "b": 2, "c": 3}, "attribute_to_idx": {}}))
    args = [str(labelmap) if a == "LABELMAP" else a for a in args]
    proc = run_cli(*extract_args(tmp_path / "out", images=tmp_path / "images", detector=None), *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()
