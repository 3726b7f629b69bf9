"""Training end to end against its own model step and against transformers', in one process on
the same data.

The data are `bench/train_step.py`'s: a float16 store of VG-like records (36 regions x 2048),
COCO captions and VQA questions over them with realistic lengths (`bench/dynamic_padding.py`'s
distributions: captions 10.3 words on average, questions 6.2), a pretraining mixture of both
and a VQA task dataset. For each of `vltrain finetune --task vqa` and `vltrain pretrain`
(LXMERT, ``--group-by-length``, ``--padding batch``):

1. **end to end**: the real command's function (`run_finetune`, `run`) with each ``--workers``
   asked for, examples/s from its metrics.jsonl after the warm-up steps: reading the store,
   tokenizing, masking, collating, the copy to the device, the step, logging;
2. **its model step alone**: the same model (built as the command builds it, the same seed),
   the same optimizer, clipping and loss, on the same batches (the command's own loader,
   drawn into memory before timing): forward, loss, backward, clipping, optimizer step;
3. **transformers' step**: `LxmertForQuestionAnswering` / `LxmertForPreTraining` holding the
   same weights, on the same items padded to 20 tokens (as their users run them), with the
   same optimizer: the anchor.

(2) and (3) are timed step by step in turn, before and after the end-to-end runs (the mean of
both passes: a loaded machine drifts). Then **where the time goes**: one end-to-end run under
cProfile, the loop's seconds split into the data (the loader's next batch), the copy to the
device, forward and loss, backward, clipping, the optimizer, the step's one host wait, logging
and the rest; and **the input pipeline alone**: examples/s of the command's loader with no
model, per worker count (what it could feed an accelerator).

    python bench/end_to_end.py                       # CPU, lxmert-base, batch 32
    python bench/end_to_end.py --quick               # lxmert-small, a smoke run (about a minute)
    python bench/end_to_end.py --device cuda --batch 64 --steps 40 --workers 0,4,8 --loader-workers 0,2,4,8,15
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers
from dynamic_padding import CAPTION_WORDS, QUESTION_WORDS, hf_pretrain_inputs, word_counts
from finetune_step import hf_loss, hf_qa_state_dict
from train_step import build_data, hf_lxmert_step

from pipeline.mixture import Mixture
from pipeline.task_data import TaskData
from vl_models import families, transfer
from vl_models.config import FinetuneConfig, TaskConfig, TrainConfig
from vl_models.data.dataset import PretrainDataset
from vl_models.data.loader import Consumed, loader_batches, to_device
from vl_models.data.sampler import ResumableSampler, TaskBatchSampler
from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.tasks.pretrain import pretrain_losses
from vl_models.train.optim import make_optimizer
from vl_models.train.trainer import clip_gradients, run
from vl_models.transfer.build import build_task
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.finetune import run_finetune
from vl_models.transfer.heads import build_transfer_model

HF_TEXT = 20  # transformers' users pad LXMERT's text to its 20 tokens


def ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


# -- the two commands' data, as they read it ----------------------------------------------------


def finetune_cfg(args, root: Path, out: Path, **kw) -> FinetuneConfig:
    return FinetuneConfig.of(
        tasks=("vqa",),
        task_data=(str(root / "vqa"),),
        stores=(str(root / "feats"),),
        out=str(out),
        model=args.model,
        vocab=str(args.vocab),
        epochs=None,
        steps=args.warmup + args.steps,
        batch_size=args.batch,
        log_every=1,
        checkpoint_every=10**9,
        group_by_length=True,
        device=args.device,
        **kw,
    )


def pretrain_cfg(args, root: Path, out: Path, **kw) -> TrainConfig:
    return TrainConfig.of(
        model=args.model,
        stores=(str(root / "feats"),),
        mixture=str(root / "mix"),
        out=str(out),
        vocab=str(args.vocab),
        steps=args.warmup + args.steps,
        batch_size=args.batch,
        log_every=1,
        warmup=1,
        checkpoint_every=10**9,
        group_by_length=True,
        device=args.device,
        **kw,
    )


def finetune_loader(cfg: FinetuneConfig, root: Path, family, device: str):
    """The fine-tuning command's batches (its dataset, sampler and loader) and its dataset."""
    data = TaskData.open(root / "vqa", task="vqa")
    view = TaskDataset(
        data, transfer.get("vqa"), [root / "feats"], Path(cfg.vocab), family, cfg.data, "train", cfg.run.seed, True, 0
    )
    sampler = TaskBatchSampler([len(view)], [cfg.optim.batch_size], 0, 1, cfg.run.seed, lengths=[view.text_lengths()])
    consumed = Consumed(0, 0)
    return loader_batches(view, sampler, cfg, consumed, device, batched=True), data


def pretrain_loader(cfg: TrainConfig, root: Path, family, device: str):
    """The pretraining command's batches (its dataset, sampler and loader) and its mixture."""
    mixture = Mixture.open(root / "mix")
    data = PretrainDataset(mixture, [root / "feats"], Path(cfg.vocab), cfg.data, family, "train", seed=cfg.run.seed)
    sampler = ResumableSampler(
        len(data), 0, 1, cfg.run.seed, lengths=data.text_lengths, batch_size=cfg.optim.batch_size
    )
    return loader_batches(data, sampler, cfg, Consumed(0, 0), device), mixture


def drawn_batches(batches, n: int) -> list[dict]:
    return [next(batches) for _ in range(n)]


# -- the model steps ------------------------------------------------------------------------------


class Interleaved:
    """Each step of a command's run, then one step of each anchor, in turn (A B C A B C ...),
    so that all see the same load: the command calls `on_step` after each of its steps; the
    command's step is the time from the end of one call to the start of the next (its loader,
    the copy, the step, logging), each anchor's step is timed inside the call (forward and loss,
    backward, clipping as the trainer clips, the trainer's fused AdamW, zero_grad)."""

    def __init__(self, variants: dict, args):
        self.variants, self.args = variants, args
        self.optimizers = {n: make_optimizer(m, "adamw", lr=1e-5, weight_decay=0.01) for n, (m, *_) in variants.items()}
        self.times: dict = {"end to end": [], **{name: [] for name in variants}}
        self.mark = None

    def now(self) -> float:
        if self.args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_step(self, step: int, metrics: dict, total: int) -> None:
        timed = step > self.args.warmup
        if self.mark is not None and timed:
            self.times["end to end"].append(self.now() - self.mark)
        for name, (model, loss_fn, batches, clip) in self.variants.items():
            model.train()
            batch = to_device(batches[step - 1], self.args.device)
            start = self.now()
            loss_fn(model, batch).backward()
            if clip:
                clip_gradients(model, clip, self.args.device)
            self.optimizers[name].step()
            self.optimizers[name].zero_grad(set_to_none=True)
            if timed:
                self.times[name].append(self.now() - start)
        self.mark = self.now()

    def rates(self) -> dict:
        """Examples/s of each, over the timed steps."""
        return {name: self.args.batch * len(t) / sum(t) for name, t in self.times.items()}


def finetune_models(args, cfg: FinetuneConfig, data):
    family = families.get("lxmert")
    mcfg = families.load_config(args.model)
    torch.manual_seed(cfg.run.seed)
    ours = build_transfer_model(family, mcfg, [transfer.get("vqa")], [data]).to(args.device)
    hf = transformers.LxmertForQuestionAnswering(
        transformers.LxmertConfig(**{**mcfg.hf_config(), "num_qa_labels": len(data.answers)})
    )
    hf.load_state_dict(hf_qa_state_dict(ours, "vqa"), strict=True)
    return ours, hf.to(args.device)


def pretrain_models(args, cfg: TrainConfig, mixture):
    from vl_models.train.trainer import model_config

    family, mcfg = model_config(cfg, len(mixture.answers))
    torch.manual_seed(cfg.run.seed)
    ours = family.build(mcfg).to(args.device)
    hf = transformers.LxmertForPreTraining(transformers.LxmertConfig(**mcfg.hf_config()))
    hf.load_state_dict(ours.state_dict(), strict=True)
    return family, ours, hf.to(args.device)


# -- where the time goes ----------------------------------------------------------------------------

PARTS = (  # (label, (file suffix, function)): cumulative seconds of these calls in the loop
    ("data: the loader's next batch", ("vl_models/data/loader.py", "loader_batches")),
    ("copy to the device", ("vl_models/data/loader.py", "to_device")),
    ("backward", ("torch/_tensor.py", "backward")),
    ("clipping", ("vl_models/train/trainer.py", "clip_gradients")),
    ("optimizer step", ("torch/optim/optimizer.py", "wrapper")),
    ("zero_grad", ("torch/optim/optimizer.py", "zero_grad")),
    ("the step's one host wait (losses, finiteness)", ("vl_models/train/trainer.py", "_step_values")),
    ("logging (metrics.jsonl)", ("vl_models/train/runlog.py", "write")),
    ("checkpoint", ("vl_models/train/checkpoint.py", "save")),
)


def profile(fn) -> tuple[dict, float]:
    """(seconds per part of `PARTS`, the loop's seconds) of `fn()` under cProfile."""
    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    found = {label: 0.0 for label, _ in PARTS}
    loop = 0.0
    for (file, _, name), (_, _, _, cumulative, _) in stats.items():
        if file.endswith("vl_models/train/trainer.py") and name == "train_loop":
            loop = cumulative
        for label, (suffix, function) in PARTS:
            if file.endswith(suffix) and name == function:
                found[label] = max(found[label], cumulative)
    return found, loop


def show_profile(title: str, found: dict, loop: float, steps: int) -> None:
    """The loop's time per step by part; the checkpoint (written once, after the last step, and
    outside the logged examples/s) apart."""
    saved = found.pop("checkpoint")
    loop -= saved
    print(f"\n{title}: where a step's time goes (cProfile, {steps} steps, {loop / steps:.3f} s/step in the loop)")
    rest = loop - sum(found.values())
    for label, seconds in [*found.items(), ("forward and loss (the rest)", rest)]:
        print(f"  {label:<48} {seconds / steps * 1000:9.1f} ms {seconds / loop:7.1%}")
    print(f"  (and the final checkpoint, once: {saved:.2f} s)")


# -- the input pipeline alone ---------------------------------------------------------------------


def loader_rate(make, workers: int, batches: int) -> float:
    """Examples/s of a fresh loader of `make(workers)` over `batches` batches after its first."""
    it = make(workers)
    first = next(it)
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += len(next(it)["input_ids"])
    rate = n / (time.perf_counter() - start)
    it.close()
    del first
    return rate


# -- the two measures -------------------------------------------------------------------------------


def measure(args, root: Path, kind: str) -> None:
    family = families.get("lxmert")
    if kind == "finetune":
        cfg = finetune_cfg(args, root, root / "probe", workers=0)
        ours_batches, data = finetune_loader(cfg, root, family, "cpu")
        hf_batches, _ = finetune_loader(cfg.with_(padding="max", max_text=HF_TEXT), root, family, "cpu")
        ours, hf = finetune_models(args, cfg, data)

        def ours_loss(model, batch):
            return model.heads["vqa"].loss(model("vqa", batch), batch)[0]

        def anchor_loss(model, batch):
            return hf_loss(model, batch)

        make = lambda w: finetune_loader(finetune_cfg(args, root, root / "probe", workers=w), root, family, "cpu")[0]  # noqa: E731
        command = lambda out, w, on_step=None: run_finetune(finetune_cfg(args, root, out, workers=w), on_step)  # noqa: E731
        title = f"vltrain finetune --task vqa --model {args.model} --group-by-length"
    else:
        cfg = pretrain_cfg(args, root, root / "probe", workers=0)
        ours_batches, mixture = pretrain_loader(cfg, root, family, "cpu")
        hf_batches, _ = pretrain_loader(cfg.with_(padding="max", max_text=HF_TEXT), root, family, "cpu")
        family, ours, hf = pretrain_models(args, cfg, mixture)

        def ours_loss(model, batch):
            return pretrain_losses(family, model, batch, TaskConfig(), epoch=0)[0]

        def anchor_loss(model, batch):
            x = hf_pretrain_inputs(batch)
            x["answer"] = x["answer"].masked_fill(x["answer"] < 0, -100)  # no answer: transformers' ignore index
            x["attr"] = x["attr"] % model.config.num_attr_labels  # (a small model's few attribute labels)
            return hf_lxmert_step(model, x)

        make = lambda w: pretrain_loader(pretrain_cfg(args, root, root / "probe", workers=w), root, family, "cpu")[0]  # noqa: E731
        command = lambda out, w, on_step=None: run(pretrain_cfg(args, root, out, workers=w), on_step)  # noqa: E731
        title = f"vltrain pretrain --model {args.model} --group-by-length"
    n = args.warmup + args.steps
    ours_in, hf_in = drawn_batches(ours_batches, n), drawn_batches(hf_batches, n)
    masks = [b["attention_mask"].reshape(-1, b["attention_mask"].shape[-1]) for b in ours_in]
    tokens = float(np.mean([float(m.sum(-1).float().mean()) for m in masks]))
    anchors = {
        "transformers": (hf, anchor_loss, hf_in, cfg.optim.clip),
        "model step": (ours, ours_loss, ours_in, cfg.optim.clip),
    }
    print(f"\n{title}, batch {args.batch}, {tokens:.1f} tokens per text on average, 36 regions, {args.device}")
    print("  (each run's steps interleaved with a step of transformers' model and one of the same model alone)")
    for w in args.workers:
        clock = Interleaved(anchors, args)
        command(root / f"{kind}-w{w}", w, clock.on_step)
        rates = clock.rates()
        hf_rate, step_rate, end = rates["transformers"], rates["model step"], rates["end to end"]
        print(
            f"  --workers {w}: end to end {end:7.2f} examples/s = {end / step_rate:6.1%} of its model step alone "
            f"({step_rate:.2f}); {end / hf_rate:.2f}x transformers padded to 20 ({hf_rate:.2f}; the model step "
            f"alone {step_rate / hf_rate:.2f}x)",
            flush=True,
        )
    found, loop = profile(lambda: command(root / f"{kind}-profiled", 0))
    show_profile(title, found, loop, n)
    rates = {w: loader_rate(make, w, args.loader_batches) for w in args.loader_workers}
    print(f"\n{title}: the input pipeline alone (examples/s, no model)")
    for w, rate in rates.items():
        print(f"  --workers {w:<3} {rate:9.1f} examples/s   {rate / step_rate:7.1f}x the model step's rate above")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="lxmert-base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="timed steps (after the warm-up ones)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--workers", type=ints, default=[0, 1], help="end-to-end runs with these --workers")
    parser.add_argument("--loader-workers", type=ints, default=[0, 1, 2])
    parser.add_argument("--loader-batches", type=int, default=20)
    parser.add_argument("--only", choices=("finetune", "pretrain"), action="append")
    parser.add_argument("--quick", action="store_true", help="lxmert-small, 2 timed steps: a smoke run")
    args = parser.parse_args()
    args.vocab = bundled_bert_vocab()
    if args.quick:
        args.steps, args.warmup, args.images, args.loader_batches = 2, 1, 128, 4
    torch.set_grad_enabled(True)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"device: {where}; torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}; load average {os.getloadavg()[0]:.2f}; {args.steps} timed steps after "
        f"{args.warmup}; {sys.argv[1:]}",
        flush=True,
    )
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.quick:  # lxmert-small with the store's 400 attribute labels (VG's; its own config has 6)
            small = json.loads(
                (Path(families.__file__).parent.parent / "models" / "model_configs" / "lxmert-small.json").read_text()
            )
            (root / "small.json").write_text(json.dumps({**small, "num_attr_labels": 400, "name": "lxmert-small-vg"}))
            args.model = str(root / "small.json")
        captions = word_counts(rng, 5 * args.images, *CAPTION_WORDS)
        questions = word_counts(rng, args.images, *QUESTION_WORDS)
        build_data(root, args.images, args.vocab, captions, questions)
        build_task(
            transfer.get("vqa"),
            [root / "v2_OpenEnded_mscoco_train2014_questions.json", root / "v2_mscoco_train2014_annotations.json"],
            root / "vqa",
            min_count=1,
        )
        for kind in args.only or ("finetune", "pretrain"):
            measure(args, root, kind)
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
