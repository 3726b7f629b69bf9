"""One model family's part of the demo, and the families side by side: pretraining on its
mixture, the zero-shot evaluation of the pretrained and the untrained model, fine-tuning on each
transfer task from the pretraining run and from scratch (`finetune`); `run_families` runs the
families one after the other or each in a process of its own."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from vl_models.config import TrainConfig
from vl_models.demo.config import (
    MIXTURES,
    MODELS,
    RETRIEVAL_CAPTIONS,
    RETRIEVAL_IMAGES,
    TRANSFER_BATCH,
    TRANSFER_EVALS,
    TRANSFER_FILES,
    TRANSFER_LR,
    TRANSFER_RETRIEVAL_IMAGES,
    TRANSFER_STEPS,
    DemoConfig,
)
from vl_models.demo.report import transfer_line


def _train_config(cfg: DemoConfig, kind: str, out: Path, vocab: Path, steps: int) -> TrainConfig:
    """The family's pretraining settings: its small model from scratch on its mixture, into ``out/runs/<kind>``."""
    from vl_models import families as model_families

    pair = model_families.get(kind).pair_task  # the task whose head scores retrieval: weighted up
    return TrainConfig.of(
        model=MODELS[kind],
        stores=(str(out / "features"),),
        mixture=str(out / MIXTURES[kind]),
        out=str(out / "runs" / kind),
        vocab=str(vocab),
        steps=steps,
        batch_size=32,
        lr=1e-3,
        warmup=max(1, steps // 20),
        checkpoint_every=max(1, steps // 2),
        eval_every=steps,
        log_every=max(1, steps // 60),
        max_text=24,
        max_regions=20,
        seed=cfg.seed,
        resume="yes",
        weights={pair: 3.0},
    )


def _pretrain(cfg: DemoConfig, kind: str, out: Path, vocab: Path, say: Callable[[str], None]) -> dict:
    """`vltrain pretrain` of the family (resumed where a run is), its losses five times through
    `say`; its budget, seconds and last training losses."""
    from vl_models.train import run_folder
    from vl_models.train.trainer import run

    steps = cfg.preset("steps")
    started = time.perf_counter()
    tcfg = _train_config(cfg, kind, out, vocab, steps)
    run(
        tcfg,
        on_step=lambda step, m, total: (
            step % max(1, steps // 5) == 0
            and say(
                f"      {kind} step {step}/{steps}: "
                + ", ".join(f"{k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("loss_"))
            )
        ),
    )
    # the last training row, of this call or (a run resumed at its end) an earlier one
    log_file = Path(tcfg.out) / run_folder.METRICS
    rows = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    last = [r for r in rows if "lr" in r][-1]
    return {
        "model": MODELS[kind],
        "steps": steps,
        "seconds": round(time.perf_counter() - started, 1),
        "final": {k: v for k, v in last.items() if k.startswith("loss_")},
    }


def _evaluate(cfg: DemoConfig, kind: str, out: Path, vocab: Path) -> dict:
    """The same evaluation for the trained model and a fresh one built with the same seed."""
    import torch

    from pipeline.mixture import Mixture
    from vl_models import families as model_families
    from vl_models.eval.evaluate import evaluate
    from vl_models.train import checkpoint
    from vl_models.train.trainer import build_model, split_data

    tcfg = _train_config(cfg, kind, out, vocab, cfg.preset("steps"))
    mixture = Mixture.open(out / MIXTURES[kind])
    answers = mixture.answers
    family = model_families.get(kind)
    val = split_data(tcfg, mixture, family, "val")  # as the run validated
    result = {}
    for name in ("untrained", "pretrained"):
        torch.manual_seed(cfg.seed)
        _, _, model = build_model(tcfg, len(answers))
        if name == "pretrained":
            model.load_state_dict(checkpoint.load_latest(out / "runs" / kind)["model"])
        scores = evaluate(family, model, val, retrieval_images=RETRIEVAL_IMAGES, captions_per_image=RETRIEVAL_CAPTIONS)
        result["retrieval_images"] = scores.pop("eval_retrieval_images", 0)  # 0: under two images to rank
        result[name] = {
            k[5:]: round(v, 4)
            for k, v in scores.items()
            if k.startswith("eval_retrieval")
            or k in ("eval_qa_score", "eval_alignment_acc", "eval_matching_acc", "eval_mlm_acc")
        }
    return result


def finetune(
    cfg: DemoConfig,
    kind: str,
    task_name: str,
    init: str,
    seed: int,
    out: Path,
    vocab: Path,
    steps: int = TRANSFER_STEPS,
) -> float:
    """One fine-tuning run of family `kind` on `task_name` from `init` ("pretrained": the
    family's pretraining run; "scratch": a fresh model of the same config) with `seed`, into
    ``out/transfer/<kind>/<task>-<init>-seed<S>``; returns its best validation score (the
    trainer's best checkpoint). Another budget than the demo's (`bench/demo_transfer_budget.py`)
    runs into a folder of its own."""
    from vl_models import transfer
    from vl_models.config import FinetuneConfig
    from vl_models.train import checkpoint
    from vl_models.transfer.finetune import run_finetune

    pairwise = getattr(transfer.get(task_name), "pairwise", False)
    run = out / "transfer" / kind / f"{task_name}-{init}-seed{seed}"
    if steps != TRANSFER_STEPS:
        run = run.with_name(f"{run.name}-steps{steps}")
    pretrained = init == "pretrained"
    run_finetune(
        FinetuneConfig.of(
            tasks=(task_name,),
            task_data=(str(out / "tasks" / task_name),),
            stores=(str(out / "features"),),
            out=str(run),
            init=str(out / "runs" / kind) if pretrained else None,
            model=None if pretrained else MODELS[kind],
            vocab=str(vocab),
            epochs=None,
            steps=steps,
            batch_size=TRANSFER_BATCH,
            lr=TRANSFER_LR,
            warmup=0.1,
            max_text=24,
            max_regions=20,
            seed=seed,
            eval_every=steps // TRANSFER_EVALS,
            keep_last=1,
            checkpoint_every=steps,
            log_every=steps,
            resume="yes",
            eval_items=TRANSFER_RETRIEVAL_IMAGES if pairwise else 0,
        )
    )  # max_text 24: every text of the world fits
    return round(checkpoint.load(checkpoint.pointed(run, checkpoint.BEST))["best"]["value"], 2)


def _family(cfg: DemoConfig, kind: str, out: Path, vocab: Path, say: Optional[Callable[[str], None]] = None) -> dict:
    """One model family's part of the demo: pretraining, the zero-shot evaluation, and with
    `cfg.transfer` fine-tuning on every task from scratch and from the pretraining run, with
    the same budget and seeds (the best validation score of each run, the task's official
    metric); the seconds each took."""
    say = say or _child_queue.put
    seconds = {}

    def timed(part: str, work: Callable[[], object]):
        started = time.perf_counter()
        value = work()
        seconds[part] = round(time.perf_counter() - started, 1)
        return value

    result = {
        "pretrain": timed("pretrain", lambda: _pretrain(cfg, kind, out, vocab, say)),
        "evaluation": timed("evaluate", lambda: _evaluate(cfg, kind, out, vocab)),
    }
    if cfg.transfer:
        scores = timed(
            "transfer",
            lambda: {
                name: {
                    init: [finetune(cfg, kind, name, init, seed, out, vocab) for seed in cfg.fine_tuning_seeds()]
                    for init in ("scratch", "pretrained")
                }
                for name in TRANSFER_FILES
            },
        )
        say(transfer_line(kind, scores))
        result["transfer"] = scores
    return {**result, "seconds": seconds}


def run_families(cfg: DemoConfig, out: Path, vocab: Path, jobs: int, say: Callable[[str], None]) -> dict:
    """`_family` of each model family: one after the other in this process, or with `jobs`
    > 1 side by side in processes of their own (spawned, each with its share of this
    process's torch threads), whose messages and log records come back here."""
    if jobs <= 1:
        return {kind: _family(cfg, kind, out, vocab, say) for kind in cfg.models}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    relay = threading.Thread(target=_relay, args=(queue, say), daemon=True)
    relay.start()
    threads = max(1, torch.get_num_threads() // jobs)
    level = logging.getLogger().getEffectiveLevel()
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_child, initargs=(queue, threads, level))
        with pool:
            futures = {kind: pool.submit(_family, cfg, kind, out, vocab) for kind in cfg.models}
            return {kind: future.result() for kind, future in futures.items()}
    finally:
        queue.put(None)
        relay.join()


_child_queue = None  # in a family's process: where its messages and log records go


def _child(queue, threads: int, level: int) -> None:
    """Set up a family's process: torch threads, messages and log records to the parent."""
    import logging.handlers

    import torch

    global _child_queue
    _child_queue = queue
    torch.set_num_threads(threads)
    handler = logging.handlers.QueueHandler(queue)
    handler.setFormatter(logging.Formatter("%(message)s"))  # the parent's handlers add the rest
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _relay(queue, say: Callable[[str], None]) -> None:
    """In the parent: the families' messages to `say`, their log records to this process's logging."""
    for item in iter(queue.get, None):
        if isinstance(item, logging.LogRecord):
            logging.getLogger(item.name).handle(item)
        else:
            say(item)
