"""The trainer's input pipeline (`vl_models.data.loader`): the batches, and so the runs, are
the same with any number of DataLoader workers and read-ahead; a resume with workers on is bit
exact; the loop's position is what it consumed, not what the workers prefetched; a killed
run's workers never keep its folder locked."""

import json
import os
import signal
import subprocess
import sys
import time

import torch
from helpers import REPO
from train_helpers import config, finetune_config

from pipeline.io import exclusive_lock
from vl_models.config import TrainConfig
from vl_models.data.loader import Consumed, EpochBatches, default_workers, loader_batches
from vl_models.data.sampler import ResumableSampler, TaskBatchSampler
from vl_models.train.trainer import run
from vl_models.transfer.finetune import run_finetune


def _weights(out) -> dict:
    latest = (out / "checkpoints" / "latest").read_text().strip()
    return torch.load(out / "checkpoints" / latest, weights_only=True)["model"]


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _sampler_at(out, step: int) -> dict:
    return torch.load(out / "checkpoints" / f"step_{step:07d}.pt", weights_only=True)["sampler"]


def _losses(out) -> list[dict]:
    rows = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith("loss_") or k in ("step", "epoch")} for r in rows if "lr" in r]


def test_pretraining_is_the_same_with_any_number_of_workers_across_epochs(data, tmp_path):
    # 7 steps of 4 over a train split of a few batches: several epoch turns, each a reshuffle
    runs = {}
    for workers, prefetch in ((0, 2), (2, 3)):
        out = tmp_path / f"w{workers}"
        run(config(data, out, "lxmert-tiny", steps=7, checkpoint_every=7, workers=workers, prefetch=prefetch))
        runs[workers] = out / "run"
    assert _losses(runs[0]) == _losses(runs[2]) and _losses(runs[0])[-1]["epoch"] >= 2
    _same(_weights(runs[0]), _weights(runs[2]))


def test_a_resume_with_workers_on_is_bit_exact(data, tmp_path):
    straight = tmp_path / "straight"
    run(config(data, straight, "vilbert-tiny", steps=7, checkpoint_every=3, workers=0))
    split = tmp_path / "split"
    run(config(data, split, "vilbert-tiny", steps=7, checkpoint_every=3, stop_at=3, workers=2))
    # the checkpoint holds where the loop was, not where the workers had read to
    assert _sampler_at(split / "run", 3) == _sampler_at(straight / "run", 3)
    run(config(data, split, "vilbert-tiny", steps=7, checkpoint_every=3, resume="yes", workers=1, prefetch=4))
    assert _losses(straight / "run") == _losses(split / "run")
    _same(_weights(straight / "run"), _weights(split / "run"))


def test_finetuning_is_the_same_with_any_number_of_workers(world, tmp_path):
    outs = []
    for workers in (0, 2):
        out = tmp_path / f"w{workers}"
        run_finetune(finetune_config(world, out, steps=6, checkpoint_every=6, workers=workers))
        outs.append(out)
    assert _losses(outs[0]) == _losses(outs[1])
    _same(_weights(outs[0]), _weights(outs[1]))


def test_the_loop_position_is_what_it_consumed_not_what_was_prefetched():
    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, key):
            epoch, index = key
            return {"input_ids": torch.tensor([epoch, index]), "attention_mask": torch.ones(2, dtype=torch.long)}

    sampler = ResumableSampler(10, 0, 1, seed=3)
    cfg = TrainConfig.of(
        model="lxmert-tiny",
        stores=("s",),
        mixture="m",
        out="o",
        vocab="v",
        batch_size=4,
        workers=2,
        prefetch=2,
        padding="max",
    )
    consumed = Consumed(sampler.epoch, sampler.position)
    batches = loader_batches(Items(), sampler, cfg, consumed)
    seen = []
    for n in range(1, 6):
        batch = next(batches)["input_ids"]
        seen.append(batch)
        # two full batches per epoch of 10 (the last 2 items dropped, as drop_last)
        assert (consumed.epoch, consumed.position) == ((n - 1) // 2, 4 * ((n - 1) % 2 + 1))
        assert (batch[:, 0] == consumed.epoch).all()
    assert sampler.epoch > consumed.epoch or sampler.position > consumed.position  # the workers read ahead
    batches.close()
    # the same order as the sampler gives its epochs, a batch's items of one epoch
    plain = ResumableSampler(10, 0, 1, seed=3)
    expected = []
    for epoch in range(3):
        plain.set_epoch(epoch)
        order = [int(i) for i in plain]
        expected += [order[:4], order[4:8]]
    assert [b[:, 1].tolist() for b in seen] == expected[:5]


def test_epoch_batches_of_a_batch_sampler_keep_its_positions():
    sampler = TaskBatchSampler([6, 4], [2, 2], 0, 1, seed=0)
    stream = EpochBatches(sampler)
    got = []
    for batch in stream:
        got.append(batch)
        if len(got) == 7:
            break
    per_epoch = len(sampler.order(0))
    assert per_epoch == 5 and [b[0][0] for b in got] == [0] * 5 + [1] * 2
    assert [p for _, p in list(stream.drawn)[:5]] == [2, 4, 6, 8, 10]


def test_default_workers_by_device():
    assert default_workers("cpu") == min(4, len(os.sched_getaffinity(0)) // 8)
    cuda = default_workers("cuda:0")
    assert 1 <= cuda <= 8 and cuda == max(1, min(8, len(os.sched_getaffinity(0)) - 1))
    assert default_workers("cuda:0", ranks_here=64) == 1


def test_a_killed_runs_forked_children_do_not_keep_its_lock(tmp_path):
    """The run folder's lock goes with the process that took it: a forked child (a DataLoader
    worker) closes its copy at once, so a restart right after a SIGKILL finds the folder free
    while the orphaned child still lives."""
    code = (
        "import os, signal, sys, time\nfrom pipeline.io import exclusive_lock\n"
        f"with exclusive_lock({str(tmp_path)!r}, 'training run'):\n"
        "    child = os.fork()\n"
        "    if child == 0:  # off the pipes the test reads, so that they close with the parent\n"
        "        null = os.open(os.devnull, os.O_RDWR)\n"
        "        os.dup2(null, 1), os.dup2(null, 2)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "    print(child, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr[-2000:]
    child = int(proc.stdout.split()[0])
    try:
        os.kill(child, 0)  # still alive
        with exclusive_lock(tmp_path, "training run"):
            pass
    finally:
        os.kill(child, signal.SIGKILL)
        time.sleep(0.1)
