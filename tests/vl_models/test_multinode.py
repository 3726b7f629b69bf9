"""torchrun across nodes, on one host: two agents of
workflows/cluster/torchrun-node.sh (2 "nodes" x 2 processes, c10d rendezvous, gloo) train as
one process with the same global batch and write the run once; a worker SIGKILLed mid-run
makes torchrun (--max-restarts 1) restart the group on both nodes, which continues from the
last checkpoint by itself (--resume auto) to the weights of an uninterrupted run, bit for
bit, with dynamic padding and with --group-by-length; every rank evaluates its share of the
val split, so the scores are one process's and a collective timeout shorter than one
process's evaluation passes.

Four ranks, not two: the gradient all-reduce adds two ranks' values as a + b whatever the
order, while from three on the order (set by DDP's gradient buckets) shows in the rounding.

Every launch has a hard time limit; what is left running is killed by pid, the agent and
every process under it (torchrun starts its workers in sessions of their own)."""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
import yaml
from helpers import REPO, free_port, make_record, process_tree, run_vltrain
from interpreter import running_env
from train_helpers import VOCAB, config, no_dropout_config

from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.store import write_records
from vl_models.train import checkpoint

LAUNCHER = REPO / "workflows" / "cluster" / "torchrun-node.sh"
LIMIT = 240  # seconds a launch may take before it is killed
STEPS, EVERY = 8, 2  # the kill lands after the first checkpoint (step 2) and before step 8
NODES, PROCS = 2, 2  # 4 ranks of batch 1: one process's batch of 4


@contextlib.contextmanager
def nodes(tmp_path, name: str, args: list, count: int, procs: int, restarts: int = 0):
    """`count` agents of the launcher (as `count` nodes, `procs` workers each) running
    ``vltrain ARGS``; their output in tmp_path/NAME-<node>.log. Yields the agents; on the
    way out every process of theirs still running is SIGKILLed by pid."""
    env = {
        **running_env(),  # the launcher's python: this environment's
        "NNODES": str(count),
        "NPROC_PER_NODE": str(procs),
        "RDZV_ID": name,
        "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
        "MAX_RESTARTS": str(restarts),
        "RDZV_TIMEOUT": "60",
        "OMP_NUM_THREADS": "1",
    }
    agents = []
    try:
        for node in range(count):
            with open(tmp_path / f"{name}-{node}.log", "w") as log:
                agents.append(
                    subprocess.Popen(
                        ["bash", str(LAUNCHER), *map(str, args)],
                        cwd=REPO,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**env, "NODE_RANK": str(node)},
                    )
                )
        yield agents
    finally:
        doomed = [pid for agent in agents if agent.poll() is None for pid in process_tree(agent.pid)]
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for agent in agents:
            agent.wait(timeout=30)


def logs(tmp_path, name: str, tail: Optional[int] = 3000) -> str:
    """The agents' logs of launch NAME (the last `tail` characters of each)."""
    return "\n".join(p.read_text()[-tail if tail else 0 :] for p in sorted(tmp_path.glob(f"{name}-*.log")))


def finish(agents, tmp_path, name: str) -> None:
    deadline = time.monotonic() + LIMIT
    for agent in agents:
        agent.wait(timeout=max(1.0, deadline - time.monotonic()))  # TimeoutExpired: `nodes` kills them
    assert [a.returncode for a in agents] == [0] * len(agents), logs(tmp_path, name)


def pretrain_args(data, tmp_path, out, batch_size: int, *extra) -> list:
    """The existing 2-ranks-as-1 comparison's settings (SGD, dropout off, 2 micro-steps)."""
    return [
        "pretrain",
        "--model",
        no_dropout_config(tmp_path),
        "--stores",
        data / "feats",
        "--mixture",
        data / "mix",
        "--vocab",
        VOCAB,
        "--steps",
        STEPS,
        "--checkpoint-every",
        EVERY,
        "--keep-last",
        0,
        "--log-every",
        1,
        "--lr",
        "1e-2",
        "--warmup",
        1,
        "--optimizer",
        "sgd",
        "--grad-accum",
        2,
        "--batch-size",
        batch_size,
        "--max-regions",
        10,
        "--max-text",
        12,
        "--out",
        out,
        *extra,
    ]


def weights(out, step: int = STEPS) -> dict:
    return checkpoint.load(Path(out) / "checkpoints" / checkpoint.file_name(step))["model"]


def rows(out) -> list[dict]:
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """The same run on two nodes (2 processes each, batch 1) and in one process (batch 4),
    both with dynamic padding (the default) and --group-by-length: each step's 8 items are
    drawn grouped by length (runs of 4, one per rank or one batch of the single process)."""
    root = tmp_path_factory.mktemp("multinode")
    args = pretrain_args(data, root, root / "nodes", 1, "--resume", "auto", "--group-by-length")
    with nodes(root, "two-nodes", args, NODES, PROCS) as agents:
        finish(agents, root, "two-nodes")
    one = run_vltrain(*pretrain_args(data, root, root / "one", 4, "--group-by-length"))
    assert one.returncode == 0, one.stderr[-3000:]
    return root


def test_two_nodes_train_as_one_process_and_write_the_run_once(runs):
    a, b = weights(runs / "nodes"), weights(runs / "one")
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst < 1e-5, worst  # SGD: differences are the gradients' float noise
    assert json.loads((runs / "nodes" / "config.json").read_text())["world_size"] == NODES * PROCS
    every = list(range(EVERY, STEPS + 1, EVERY))
    assert checkpoint.steps_in(runs / "nodes" / "checkpoints") == every
    assert sorted(p.name for p in (runs / "nodes" / "checkpoints").iterdir()) == sorted(
        ["latest", *(checkpoint.file_name(s) for s in every), *(checkpoint.file_name(s) + ".sha256" for s in every)]
    )
    logged = rows(runs / "nodes")
    assert [r["step"] for r in logged if "lr" in r] == list(range(1, STEPS + 1))  # each row once
    assert [r["step"] for r in logged if "eval_mlm_acc" in r] == [STEPS]


def test_a_killed_worker_restarts_the_group_which_resumes_by_itself(runs, data, tmp_path):
    """2 nodes x 2 processes, --max-restarts 1: rank 0 (the writer) is SIGKILLed once a
    checkpoint exists; torchrun restarts the workers of both nodes, --resume auto continues
    from the last checkpoint, and the run ends with the uninterrupted run's weights, bit for
    bit (dynamic padding and --group-by-length, as there)."""
    out = tmp_path / "elastic"
    args = pretrain_args(data, tmp_path, out, 1, "--resume", "auto", "--group-by-length")
    with nodes(tmp_path, "elastic", args, NODES, PROCS, restarts=1) as agents:
        deadline = time.monotonic() + LIMIT
        while not (out / "checkpoints" / "latest").exists():
            assert all(a.poll() is None for a in agents) and time.monotonic() < deadline, logs(tmp_path, "elastic")
            time.sleep(0.02)
        workers = [pid for pid in process_tree(agents[0].pid)[1:] if rank_of(pid) == 0]
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        killed_after = checkpoint.step_of((out / "checkpoints" / "latest").read_text())
        finish(agents, tmp_path, "elastic")
    log = logs(tmp_path, "elastic", tail=None)
    assert killed_after < STEPS and "failed (exitcode: -9) local_rank: 0" in log, log[-3000:]
    # the restarted workers of both nodes, by themselves
    assert log.count(f"resumed {out} at step {killed_after}") == NODES * PROCS, log[-3000:]
    a, b = weights(out), weights(runs / "nodes")
    assert all(torch.equal(a[k], b[k]) for k in a), max((a[k] - b[k]).abs().max().item() for k in a)
    assert [r["step"] for r in rows(out) if "lr" in r] == list(range(1, STEPS + 1))


@pytest.fixture(scope="module")
def wide(data, tmp_path_factory):
    """The `data` fixture's mixture with 150 more images held out: a val split whose
    evaluation takes seconds (300 items; retrieval over 50 images)."""
    root = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(1)
    stems = {i: f"COCO_train2014_{i:012d}" for i in range(1000, 1150)}
    write_records(
        root / "feats",
        [make_record(rng, s, num_boxes=8, feature_dim=16, cls_dim=11, attr_dim=7) for s in stems.values()],
        feature_dim=16,
        dtype="float32",
    )
    captions = json.loads((data / "captions_train2014.json").read_text())
    captions["images"] += [{"id": i, "file_name": f"{s}.jpg"} for i, s in stems.items()]
    captions["annotations"] += [{"image_id": i, "caption": f"picture {i} with a blue thing"} for i in stems]
    questions = json.loads((data / "v2_OpenEnded_mscoco_train2014_questions.json").read_text())
    questions["questions"] += [{"image_id": i, "question": "what color is it?", "question_id": i} for i in stems]
    answers = json.loads((data / "v2_mscoco_train2014_annotations.json").read_text())
    answers["annotations"] += [{"question_id": i, "answers": [{"answer": "blue"}] * 10} for i in stems]
    for name, obj in (
        ("captions_train2014.json", captions),
        ("v2_mscoco_train2014_annotations.json", answers),
        ("v2_OpenEnded_mscoco_train2014_questions.json", questions),
    ):
        (root / name).write_text(json.dumps(obj))
    (root / "heldout.txt").write_text("".join(f"{s}\n" for s in stems.values()))
    (root / "spec.yaml").write_text((data / "spec.yaml").read_text())
    build_mixture(MixtureSpec.load(root / "spec.yaml"), root / "mix", stores=(data / "feats", root / "feats"))
    return root


def test_every_rank_evaluates_its_share_and_none_waits_for_the_whole(data, wide, tmp_path):
    """2 ranks validating after step 1 (and at the end, step 2) with a collective timeout of
    60 % of one process's evaluation (at least 1.5 s), above one rank's half: the run
    passes, and its scores are one process's, exactly. (Evaluating on rank 0 alone, as before, left rank 1 waiting
    in step 2's all-reduce for the whole evaluation: "Timed out waiting ... for recv".)
    --lr 0: the weights evaluated are the initial ones, built here as the run builds them."""
    from pipeline.mixture import Mixture
    from vl_models.eval.evaluate import evaluate
    from vl_models.train.trainer import build_model, split_data

    cfg = config(
        data,
        tmp_path,
        no_dropout_config(tmp_path),
        stores=(str(data / "feats"), str(wide / "feats")),
        mixture=str(wide / "mix"),
        steps=2,
        batch_size=2,
        lr=0.0,
        optimizer="sgd",
    )
    mixture = Mixture.open(cfg.mixture)
    torch.manual_seed(cfg.run.seed)
    family, _, model = build_model(cfg, len(mixture.answers))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: OMP_NUM_THREADS=1
    try:
        started = time.perf_counter()
        alone = evaluate(family, model, split_data(cfg, mixture, family, "val"), batch_size=2)
        took = time.perf_counter() - started
    finally:
        torch.set_num_threads(threads)
    args = [
        "pretrain",
        "--model",
        cfg.model,
        "--stores",
        data / "feats",
        "--stores",
        wide / "feats",
        "--mixture",
        cfg.mixture,
        "--vocab",
        cfg.vocab,
        "--out",
        cfg.out,
        "--steps",
        2,
        "--eval-every",
        1,
        "--batch-size",
        2,
        "--lr",
        0,
        "--optimizer",
        "sgd",
        "--warmup",
        cfg.optim.warmup,
        "--max-regions",
        cfg.data.max_regions,
        "--max-text",
        cfg.data.max_text,
        "--dist-timeout",
        f"{max(0.6 * took, 1.5):.2f}",
    ]
    with nodes(tmp_path, "evaluation", args, 1, 2) as agents:
        finish(agents, tmp_path, "evaluation")
    shared = [r for r in rows(cfg.out) if "eval_mlm_acc" in r]
    assert [r.pop("step") for r in shared] == [1, 2] and shared == [alone, alone], (shared, alone, took)
    assert alone["eval_retrieval_queries"] == 50 and "eval_qa_score" in alone


def test_the_cluster_recipes_start_the_launcher_with_resume_auto():
    """The SLURM and Kubernetes recipes run the launcher the tests above run, with flags
    `vltrain pretrain` has and --resume auto (what a requeued or resubmitted job needs)."""
    import typer

    from vl_models.cli import app

    folder = LAUNCHER.parent
    for script in (LAUNCHER, folder / "slurm-pretrain.sbatch"):
        assert subprocess.run(["bash", "-n", script], timeout=30).returncode == 0, script
    sbatch = (folder / "slurm-pretrain.sbatch").read_text()
    assert "exec workflows/cluster/torchrun-node.sh" in sbatch and "pretrain --resume auto" in sbatch
    assert "#SBATCH --requeue" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    service, job = yaml.safe_load_all((folder / "k8s-pretrain.yaml").read_text())
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["command"] == ["workflows/cluster/torchrun-node.sh"]
    assert container["args"][:3] == ["pretrain", "--resume", "auto"]
    assert env["NNODES"] == str(job["spec"]["completions"]) and "NODE_RANK" in env
    assert env["RDZV_ENDPOINT"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}:29500"
    flags = {opt for p in typer.main.get_command(app).commands["pretrain"].params for opt in p.opts}
    assert {a for a in container["args"] if a.startswith("--")} <= flags


def rank_of(pid: int):
    """The torchrun RANK of a worker process (None for any other process)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [int(v[len(b"RANK=") :]) for v in env if v.startswith(b"RANK=")]
    return found[0] if found else None
