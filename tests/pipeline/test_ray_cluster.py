"""`vlprep download` / `extract` on a real Ray cluster of several nodes on one host, with faults.

One cluster for the module (tests/ray_cluster.py, from the recipe's `ray start` commands):
a head that runs no work and two worker nodes of one CPU each, ``w1`` offering the custom
resource ``download`` and ``w2`` not, so placement is visible in the node ids every
shard's stats record. The cluster checks its nodes' health as Ray does by default (a lost
node is declared dead ~15 s later), as a real one does. The drivers are separate
processes (the real CLI, the recipe's script workflows/cluster/ray-extract.sh). The tests
run in file order, each killing one thing (the driver, a node mid-download, the only node
able to download, the node holding the detector actor) and starting the node the next
test needs.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from detector_layouts import random_weights, write_d2_pickle
from helpers import REPO, extract_args
from image_server import ImageServer, write_tsv
from interpreter import running_env
from ray_cluster import ray_cluster

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.store import FeatureStore, verify_store

pytestmark = pytest.mark.slow
RECIPE_SCRIPT = REPO / "workflows" / "cluster" / "ray-extract.sh"
NET = ["--allow-network", "127.0.0.0/8", "--deadline", "10", "--threads", "1"]
W1 = (1, {"node_w1": 1, "download": 1})  # CPUs, resources
W2 = (1, {"node_w2": 1})
RUN_TIMEOUT = 180


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster({"w1": W1, "w2": W2}) as started:
        yield started


@pytest.fixture(scope="module")
def slow_server():
    """Every image takes 0.2 s: a shard of 2 lasts ~0.4 s, so "mid-run" is a moment to act in."""
    srv = ImageServer(delay=0.2)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "tiny.pkl"
    write_d2_pickle(path, random_weights(DetectorConfig.load("tiny"), seed=3))
    return path


def driver_env(cluster, **extra) -> dict:
    return {**running_env(), **cluster.env, "COLUMNS": "200", "NO_COLOR": "1", **extra}  # the recipe's `vlprep`


def vlprep(cluster, *args) -> list:
    return [sys.executable, "-m", "pipeline.cli", *map(str, args), "--ray-address", cluster.address]


DRIVERS: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def no_driver_left():
    """A test that fails half-way leaves no driver process running."""
    yield
    while DRIVERS:
        driver = DRIVERS.pop()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.communicate(timeout=30)


def start(cluster, cmd, **env) -> subprocess.Popen:
    """A driver process (its own session: a test can SIGKILL its group) of `cluster`."""
    driver = subprocess.Popen(
        list(map(str, cmd)),
        cwd=REPO,
        env=driver_env(cluster, **env),
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    DRIVERS.append(driver)
    return driver


def finish(driver: subprocess.Popen, cluster, code: int = 0) -> tuple[str, str]:
    """Wait (bounded) for `driver` to exit with `code`; its stdout and stderr. The message
    of a failure carries the driver's output and the tails of the nodes' raylet logs."""
    try:
        stdout, stderr = driver.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        stdout, stderr = driver.communicate(timeout=30)
    assert driver.returncode == code, f"exit {driver.returncode}\n{stdout[-2000:]}\n{stderr[-3000:]}\n{cluster.logs()}"
    return stdout, stderr


def run(cluster, cmd, **env) -> tuple[str, str]:
    return finish(start(cluster, cmd, **env), cluster)


def url_list(path: Path, server: ImageServer, n: int) -> Path:
    write_tsv(path, [server.url(f"/img/rgb.jpg?{path.stem}={i}") for i in range(n)])
    return path


def expected_ids(tsv: Path, n: int) -> list[str]:
    return [f"cc3m-{tsv.stem}-{i:08d}" for i in range(n)]


def shard_stats(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("[0-9]*_stats.json"))]


def downloaded_ids(folder: Path) -> list[str]:
    """Every row's id over the folder's shards, sorted, duplicates kept; all must be ok."""
    rows = [
        row
        for shard in sorted(folder.glob("*.parquet"))
        for row in pq.read_table(shard, columns=["image_id", "status"]).to_pylist()
    ]
    assert {r["status"] for r in rows} == {"ok"}, rows
    return sorted(r["image_id"] for r in rows)


def wait_for(condition, what: str, cluster, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{cluster.logs()}"
        time.sleep(0.05)


def test_without_an_address_a_run_starts_its_own_ray_beside_a_running_cluster(cluster, slow_server, tmp_path):
    """Ray's plain ``ray.init()`` attaches to the latest `ray start` cluster of the machine (its
    address file in Ray's temp folder; refused with a ValueError when a CPU count is given); a
    run without --ray-address starts a local Ray of its own instead."""
    temp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        (temp / "ray").mkdir()  # Ray's temp folder under RAY_TMPDIR, naming the cluster as `ray start` does
        shutil.copy(cluster.root / "head" / "ray_current_cluster", temp / "ray" / "ray_current_cluster")
        tsv = url_list(tmp_path / "local.tsv", slow_server, 2)
        out = tmp_path / "images"
        args = ["download", "--dataset", "conceptual_captions", "--input", tsv, "--out", out, "--workers", "1", *NET]
        run(cluster, [sys.executable, "-m", "pipeline.cli", *args], RAY_TMPDIR=str(temp))
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert downloaded_ids(out) == expected_ids(tsv, 2)
    assert not {s["node_id"] for s in shard_stats(out)} & set(cluster.ids().values())


def test_the_recipe_downloads_on_the_download_node_extracts_on_both_and_resumes_a_killed_driver(
    cluster, slow_server, weights, tmp_path
):
    tsv = url_list(tmp_path / "recipe.tsv", slow_server, 8)
    out = tmp_path / "out"
    recipe = ["bash", RECIPE_SCRIPT, tsv, out]
    env = dict(
        RAY_ADDRESS=cluster.address,
        WEIGHTS=str(weights),
        SHARD_SIZE="2",
        DOWNLOAD_FLAGS=" ".join(NET),
        EXTRACT_FLAGS="--detector tiny --boxes 5 --actors 2 --actor-cpus 1 --batch-size 2",
    )
    driver = start(cluster, recipe, **env)
    wait_for(lambda: shard_stats(out / "images") or driver.poll() is not None, "a first downloaded shard", cluster)
    os.killpg(driver.pid, signal.SIGKILL)  # the script and its `vlprep download` driver
    driver.wait(timeout=30)
    assert 1 <= len(shard_stats(out / "images")) < 4
    run(cluster, recipe, **env)  # resume: the same command again; its last step, `vlprep verify`, passed
    ids = cluster.ids()
    downloads = shard_stats(out / "images")
    assert len(downloads) == 4 and {s["node_id"] for s in downloads} == {ids["w1"]}  # --download-resource download
    assert {s["hostname"] for s in downloads} == {socket.gethostname()}
    assert downloaded_ids(out / "images") == expected_ids(tsv, 8)
    extracts = shard_stats(out / "features" / "extract")
    assert len(extracts) == 4 and {s["node_id"] for s in extracts} == {ids["w1"], ids["w2"]}  # an actor per node
    assert sorted(FeatureStore.open(out / "features").ids()) == expected_ids(tsv, 8)
    assert Path(json.loads((out / "images" / "summary.json").read_text())["out"]).is_absolute()


def test_a_node_killed_mid_download_leaves_its_shards_to_the_other(cluster, slow_server, tmp_path):
    tsv = url_list(tmp_path / "nodekill.tsv", slow_server, 12)
    out = tmp_path / "images"
    driver = start(
        cluster,
        vlprep(
            cluster,
            "download",
            "--dataset",
            "conceptual_captions",
            "--input",
            tsv,
            "--out",
            out,
            "--shard-size",
            "2",
            *NET,
        ),
    )
    ids = cluster.ids()
    # w2 finished a shard and is working on its next: kill the node (raylet, workers, all)
    wait_for(
        lambda: any(s["node_id"] == ids["w2"] for s in shard_stats(out)) or driver.poll() is not None,
        "a shard done on w2",
        cluster,
    )
    cluster.nodes["w2"].kill()
    killed = time.time()
    stdout, stderr = finish(driver, cluster)
    assert "\x1b" not in stdout + stderr and "(raylet)" not in stdout + stderr  # Ray's coloured messages
    assert downloaded_ids(out) == expected_ids(tsv, 12)
    after = [s for s in shard_stats(out) if s["finished"] > killed]
    assert after and {s["node_id"] for s in after} == {ids["w1"]}
    cluster.add_nodes({"w2b": W2})  # the next tests need two worker nodes again


def test_a_run_whose_only_download_node_is_lost_stops_named_and_resumes_on_a_new_one(cluster, slow_server, tmp_path):
    tsv = url_list(tmp_path / "capacity.tsv", slow_server, 12)
    out = tmp_path / "images"
    cmd = vlprep(
        cluster,
        "download",
        "--dataset",
        "conceptual_captions",
        "--input",
        tsv,
        "--out",
        out,
        "--shard-size",
        "2",
        "--download-resource",
        "download",
        "--capacity-timeout",
        "2",
        *NET,
    )
    driver = start(cluster, cmd)
    wait_for(lambda: shard_stats(out) or driver.poll() is not None, "a first shard", cluster)
    cluster.nodes["w1"].kill()  # the only node offering `download`; w2b (no `download`) lives on
    _, stderr = finish(driver, cluster, code=75)
    assert "no capacity left" in stderr and "'download': 1" in stderr and "rerun the same command" in stderr
    assert 1 <= len(shard_stats(out)) < 6
    (w1c,) = cluster.add_nodes({"w1c": W1})
    run(cluster, cmd)
    assert downloaded_ids(out) == expected_ids(tsv, 12)
    assert w1c.node_id in {s["node_id"] for s in shard_stats(out)}


def test_the_node_holding_the_detector_actor_is_killed_and_the_actor_restarts_on_the_other(
    cluster, slow_server, weights, tmp_path
):
    """The cluster has Ray's default health checks: its GCS declares the node dead only after
    ~15 s, and until then each call to the lost actor fails (ActorUnavailableError) in a few
    seconds. That is no failed attempt of the shards: the run waits for the restarted actor
    and ends well, and it says so in one plain line per lost node: no ANSI colours (none
    despite NO_COLOR and no terminal, before) and no ``(raylet)`` messages or multi-line
    dumps of Ray's (24 lines for one lost node, before)."""
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(16):
        (folder / f"im{i:02d}.jpg").write_bytes(slow_server.corpus["big.jpg" if i % 2 else "rgb.jpg"][0])
    out = tmp_path / "feats"
    args = extract_args(out, images=folder, weights=weights, boxes=5, shard_size=2, actors=1)
    driver = start(cluster, vlprep(cluster, *args))
    wait_for(lambda: shard_stats(out / "extract") or driver.poll() is not None, "a first extracted shard", cluster)
    first = shard_stats(out / "extract")[0]["node_id"]
    cluster.node_of(first).kill()
    killed = time.time()
    stdout, stderr = finish(driver, cluster)
    survivor = next(n for n in cluster.ids().values() if n != cluster.nodes["head"].node_id)
    stats = shard_stats(out / "extract")
    output = stdout + stderr
    assert {s["node_id"] for s in stats} == {first, survivor}
    # nothing from the lost node after the kill (a result back just before it may be committed just after)
    assert max(s["finished"] for s in stats if s["node_id"] == first) < killed + 2, (killed, stats)
    assert sorted(FeatureStore.open(out).ids()) == [f"im{i:02d}" for i in range(16)]
    assert verify_store(out).ok
    assert "\x1b" not in output and "(raylet)" not in output
    assert not [line for line in output.splitlines() if line[:1].isspace()], output  # no dump's continued lines
    assert output.count(f"lost Ray node {first[:12]}") == 1, output
    assert output.count("WARNING") <= 3 and "ERROR" not in output, output
