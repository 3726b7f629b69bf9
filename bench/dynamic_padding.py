"""Compute on what is real: training steps on batches cut to what they use (dynamic padding,
`vl_models.data.padding`) and grouped by length (`--group-by-length`), side by side with the
anchors as their users run them (every batch padded to the maximum), in one run.

Lengths are drawn from distributions written here with their sources:

* captions (Conceptual Captions): words ~ log-normal, mean 10.3 (Sharma et al. 2018, ACL, Table 1:
  10.3 tokens per caption on average); its spread (sd 4.0) is our assumption, clipped to 3-40 words;
* questions (VQA): words ~ log-normal, mean 6.2 (Antol et al. 2015, ICCV, section 3: 6.2 words
  on average); spread (sd 2.0) assumed, clipped to 3-22 words;
* region counts (BUTD's adaptive 10-100 boxes, capped at 36 as ViLBERT's 36-slot setups):
  uniform over 10-36 (no published histogram); LXMERT's features are a fixed 36.

A text's token count is its words + [CLS] and [SEP] (+ the "?" of a question), cut at the
model's text length (LXMERT 20, ViLBERT 36). Each measure runs the same batches through every
variant, its steps interleaved (A B C A B C ...) after a warm-up, and reports examples/s over
the whole set (mean step time: lengths vary from batch to batch) and the ratio to the anchor:

1. LXMERT-base pretraining step (captions; 36 regions): `transformers.LxmertForPreTraining` on
   batches padded to 20 tokens vs ours, the same weights, batches drawn at random and cut
   ("batch"), and batches grouped by length and cut ("batch, grouped"). Forward, all five
   losses, backward and AdamW (our trainer's fused one for every variant).
2. VQA fine-tuning step (questions; 36 regions): `transformers.LxmertForQuestionAnswering`
   padded to 20 vs our `TransferModel` (as `vltrain finetune` builds it), the same weights.
3. ViLBERT-base pretraining step (captions; 10-36 regions + IMG): ours padded to 36 tokens
   and 37 slots (vilbert-multi-task's reference model is not installable here) vs ours cut.
4. End to end: real `vltrain pretrain` runs of LXMERT on a COCO captions + VQA mixture of those
   lengths and `vltrain finetune --task vqa` runs on its questions (data loading, masking and
   the trainer's loop included), padded to the maximum, cut, and cut and grouped by length
   (examples/s after the warm-up steps).

Each measure also checks, in eval mode on one batch, that the cut batch gives the anchor's
outputs per example (pair / answer logits and the loss) within 1e-5.

    python bench/dynamic_padding.py                     # CPU, batch 32, 6 timed steps per variant
    python bench/dynamic_padding.py --quick             # tiny models: a smoke run (seconds)
    python bench/dynamic_padding.py --device cuda --batch 64 --steps 20    # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import transformers
from finetune_step import build_pair, hf_loss, hf_qa_scores, ours_loss
from train_step import hf_lxmert_step

from vl_models import families
from vl_models.data.padding import trim_padding
from vl_models.data.sampler import group_by_length
from vl_models.models.modeling_lxmert import LxmertForPreTraining
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
from vl_models.tasks.pretrain import pretrain_losses
from vl_models.train.optim import make_optimizer

CAPTION_WORDS = (10.3, 4.0, 3, 40)  # mean, sd, min, max (see the module's docstring)
QUESTION_WORDS = (6.2, 2.0, 3, 22)
REGIONS = (10, 36)  # ViLBERT's region counts: uniform over this range


def word_counts(rng: np.random.Generator, n: int, mean: float, sd: float, low: int, high: int) -> np.ndarray:
    """`n` lengths from a log-normal of the given mean and sd, rounded and clipped."""
    sigma2 = np.log(1 + (sd / mean) ** 2)
    drawn = rng.lognormal(np.log(mean) - sigma2 / 2, np.sqrt(sigma2), n)
    return np.clip(np.round(drawn), low, high).astype(np.int64)


def batches_of(lengths: np.ndarray, batch: int, steps: int, grouped: bool, rng: np.random.Generator) -> list:
    """`steps` batches of item indices, evenly spaced over an epoch of the items: in a random
    order, or grouped by length as the trainer's sampler groups them (one rank)."""
    order = rng.permutation(len(lengths))
    if grouped:
        order = group_by_length(order, lengths, batch, rng)
    runs = [order[i : i + batch] for i in range(0, len(order) - batch + 1, batch)]
    return [runs[int(k)] for k in np.linspace(0, len(runs) - 1, steps).round()]


def text_part(tokens: np.ndarray, width: int, vocab: int, g: torch.Generator, mlm: bool) -> dict:
    """Padded token ids and mask (and masked-LM labels on 15 % of the real tokens)."""
    b = len(tokens)
    mask = (torch.arange(width) < torch.as_tensor(tokens)[:, None]).long()
    ids = torch.randint(1000, vocab, (b, width), generator=g) * mask
    out = {"input_ids": ids, "attention_mask": mask}
    if mlm:
        pick = (torch.rand(b, width, generator=g) < 0.15) & mask.bool()
        pick[:, 1] |= ~pick.any(1)  # at least one prediction per caption
        out["lm_labels"] = torch.where(pick, ids, torch.full_like(ids, -1))
    return out


def region_part(counts: np.ndarray, slots: int, dim: int, loc: int, g: torch.Generator) -> dict:
    b = len(counts)
    vmask = (torch.arange(slots) < torch.as_tensor(counts)[:, None]).long()
    xy = torch.rand(b, slots, 2, generator=g) * 0.5
    pos = torch.cat([xy, xy + torch.rand(b, slots, 2, generator=g) * 0.5], -1)
    if loc == 5:
        pos = torch.cat([pos, (pos[..., 2:3] - pos[..., :1]) * (pos[..., 3:4] - pos[..., 1:2])], -1)
    feats = torch.rand(b, slots, dim, generator=g) * vmask[..., None]
    return {"visual_feats": feats, "visual_pos": pos * vmask[..., None], "visual_mask": vmask}


def lxmert_pretrain_batch(tokens: np.ndarray, cfg, g: torch.Generator) -> dict:
    b, n = len(tokens), 36
    regions = region_part(np.full(b, n), n, cfg.visual_feat_dim, 4, g)
    batch = {**text_part(tokens, 20, cfg.vocab_size, g, mlm=True), **regions}
    conf = torch.rand(b, n, generator=g)  # one confidence for objects and attributes, as hf_lxmert_step passes
    batch.update(
        region_selected=torch.rand(b, n, generator=g) < 0.15,
        obj_ids=torch.randint(0, cfg.num_object_labels, (b, n), generator=g),
        obj_conf=conf,
        attr_ids=torch.randint(0, cfg.num_attr_labels, (b, n), generator=g),
        attr_conf=conf,
        original_feats=batch["visual_feats"].clone(),
        matched=torch.randint(0, 2, (b,), generator=g),
        qa_label=torch.randint(0, cfg.num_qa_labels, (b,), generator=g),
    )
    return batch


def vilbert_pretrain_batch(tokens: np.ndarray, counts: np.ndarray, cfg, g: torch.Generator) -> dict:
    b, slots = len(tokens), REGIONS[1] + 1
    regions = region_part(counts + 1, slots, cfg.v_feature_size, 5, g)
    batch = {**text_part(tokens, 36, cfg.vocab_size, g, mlm=True), **regions}
    selected = (torch.rand(b, slots, generator=g) < 0.15) & batch["visual_mask"].bool()
    selected[:, 0] = False  # never the IMG token
    batch.update(
        region_selected=selected,
        region_prob=torch.softmax(torch.randn(b, slots, cfg.v_target_size, generator=g), -1),
        matched=torch.randint(0, 2, (b,), generator=g),
    )
    return batch


def vqa_finetune_batch(tokens: np.ndarray, answers: int, mcfg, g: torch.Generator) -> dict:
    b = len(tokens)
    regions = region_part(np.full(b, 36), 36, mcfg.visual_feat_dim, 4, g)
    batch = {**text_part(tokens, 20, mcfg.vocab_size, g, mlm=False), **regions}
    target = torch.zeros(b, answers)
    target.scatter_(1, torch.randint(0, answers, (b, 3), generator=g), torch.tensor([1.0, 0.6, 0.3]).expand(b, 3))
    return {**{k: v[:, None] for k, v in batch.items()}, "target": target}


def hf_pretrain_inputs(batch: dict) -> dict:
    """Our batch in `train_step.hf_lxmert_step`'s names."""
    return {
        "ids": batch["input_ids"],
        "mask": batch["attention_mask"],
        "labels": batch["lm_labels"],
        "feats": batch["visual_feats"],
        "pos": batch["visual_pos"],
        "vmask": batch["visual_mask"],
        "obj": batch["obj_ids"],
        "attr": batch["attr_ids"],
        "conf": batch["obj_conf"],
        "selected": batch["region_selected"],
        "matched": batch["matched"],
        "answer": batch["qa_label"],
    }


def pretraining_loss(family):
    """The trainer's pretraining loss of `family`'s model on a batch (all tasks, weight 1)."""
    from vl_models.config import TaskConfig

    return lambda model, batch: pretrain_losses(family, model, batch, TaskConfig(), epoch=0)[0]


def time_variants(variants: list, steps: int, warmup: int, device: str) -> list[float]:
    """Mean step seconds (forward, loss, backward, and our trainer's AdamW, `make_optimizer`: the
    same fused kernel for every variant) of each (model, loss_fn, batches), their steps
    interleaved; the first `warmup` batches of each only warm up."""
    optimizers = [make_optimizer(model, "adamw", lr=1e-5, weight_decay=0.01) for model, _, _ in variants]
    spent = [0.0] * len(variants)

    def now() -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    for i in range(warmup + steps):
        for v, ((model, loss_fn, batches), opt) in enumerate(zip(variants, optimizers)):
            model.train()
            batch = {k: t.to(device) for k, t in batches[i].items()}
            start = now()
            loss_fn(model, batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i >= warmup:
                spent[v] += now() - start
    return [s / steps for s in spent]


def drawn(lengths: np.ndarray, make: Callable, args, rng: np.random.Generator) -> tuple[list, list]:
    """`make(indices)`'s batches for every timed and warm-up step, drawn at random and grouped
    by length (`batches_of`)."""
    n = args.warmup + args.steps
    plain = [make(b) for b in batches_of(lengths, args.batch, n, False, rng)]
    return plain, [make(b) for b in batches_of(lengths, args.batch, n, True, rng)]


def three_ways(args, anchor, anchor_loss, ours, ours_loss, plain: list, grouped: list) -> list[float]:
    """`time_variants` of the anchor on the padded batches and of ours on the same batches cut,
    and on the grouped ones cut."""
    cut = [trim_padding(x) for x in plain]
    variants = [
        (anchor, anchor_loss, plain),
        (ours, ours_loss, cut),
        (ours, ours_loss, [trim_padding(x) for x in grouped]),
    ]
    return time_variants(variants, args.steps, args.warmup, args.device)


def report(title: str, names: list[str], seconds: list[float], batch: int, goal: float, check: str) -> None:
    print(f"\n{title}")
    for name, s in zip(names, seconds):
        print(f"  {name:<34} {s:7.3f} s/step {batch / s:8.1f} examples/s  {seconds[0] / s:5.2f}x")
    print(f"  best / anchor: {seconds[0] / min(seconds[1:]):.2f}x (goal >= {goal}x); {check}")


def max_gap(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    return max(float((a.float() - b.float()).abs().max()) for a, b in pairs)


def lxmert_pretraining(args, rng, g) -> None:
    cfg = families.load_config(args.lxmert)
    hf = transformers.LxmertForPreTraining(transformers.LxmertConfig(**cfg.hf_config())).to(args.device)
    ours = LxmertForPreTraining(cfg)
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.to(args.device)
    family = families.get("lxmert")
    tokens = np.minimum(word_counts(rng, args.pool, *CAPTION_WORDS) + 2, 20)
    plain, grouped = drawn(tokens, lambda index: lxmert_pretrain_batch(tokens[index], cfg, g), args, rng)

    ours_step = pretraining_loss(family)

    def hf_step(model, batch):
        return hf_lxmert_step(model, hf_pretrain_inputs(batch))

    with torch.no_grad():
        hf.eval(), ours.eval()
        x = {k: v.to(args.device) for k, v in plain[0].items()}
        cut = trim_padding(x)
        a = hf(
            input_ids=x["input_ids"],
            visual_feats=x["visual_feats"],
            visual_pos=x["visual_pos"],
            attention_mask=x["attention_mask"],
            visual_attention_mask=x["visual_mask"],
        )
        b = family.forward(ours, cut, decode=False)
        gap = max_gap([(a.cross_relationship_score, b.matched_logits), (a.question_answering_score, b.answer_logits)])
        loss_gap = abs(float(hf_step(hf, x)) - float(ours_step(ours, cut)))
    seconds = three_ways(args, hf, hf_step, ours, ours_step, plain, grouped)
    mean_plain = np.mean([int(x["attention_mask"].sum(1).max()) for x in plain])
    mean_grouped = np.mean([int(x["attention_mask"].sum(1).max()) for x in grouped])
    report(
        f"LXMERT ({args.lxmert}) pretraining step, captions (mean {tokens.mean():.1f} tokens; batch longest: "
        f"{mean_plain:.1f} drawn at random, {mean_grouped:.1f} grouped), 36 regions, batch {args.batch}",
        ["transformers, padded to 20", "ours, cut (batch)", "ours, cut, grouped by length"],
        seconds,
        args.batch,
        1.3,
        f"pair/answer logits max |diff| {gap:.1e}, loss |diff| {loss_gap:.1e} (eval mode)",
    )


def vqa_finetuning(args, rng, g) -> None:
    mcfg = families.load_config(args.lxmert)
    ours, hf = build_pair(mcfg, args.answers, args.device)
    tokens = np.minimum(word_counts(rng, args.pool, *QUESTION_WORDS) + 3, 20)
    plain, grouped = drawn(tokens, lambda index: vqa_finetune_batch(tokens[index], args.answers, mcfg, g), args, rng)
    with torch.no_grad():
        hf.eval(), ours.eval()
        x = {k: v.to(args.device) for k, v in plain[0].items()}
        cut = trim_padding(x)
        gap = max_gap([(hf_qa_scores(hf, x), ours("vqa", cut))])
        loss_gap = abs(float(hf_loss(hf, x)) - float(ours_loss(ours, cut)))
    seconds = three_ways(args, hf, hf_loss, ours, ours_loss, plain, grouped)
    report(
        f"VQA fine-tuning step ({args.lxmert}, {args.answers} answers), questions (mean {tokens.mean():.1f} tokens), "
        f"36 regions, batch {args.batch}",
        ["transformers QA, padded to 20", "ours, cut (batch)", "ours, cut, grouped by length"],
        seconds,
        args.batch,
        1.3,
        f"answer logits max |diff| {gap:.1e}, loss |diff| {loss_gap:.1e} (eval mode)",
    )


def vilbert_pretraining(args, rng, g) -> None:
    cfg = families.load_config(args.vilbert)
    torch.manual_seed(0)
    model = ViLBERTForPreTraining(cfg).to(args.device)
    family = families.get("vilbert")
    vilbert_loss = pretraining_loss(family)
    tokens = np.minimum(word_counts(rng, args.pool, *CAPTION_WORDS) + 2, 36)
    counts = rng.integers(REGIONS[0], REGIONS[1] + 1, args.pool)
    plain, grouped = drawn(
        tokens, lambda index: vilbert_pretrain_batch(tokens[index], counts[index], cfg, g), args, rng
    )
    with torch.no_grad():
        model.eval()
        x = {k: v.to(args.device) for k, v in plain[0].items()}
        cut = trim_padding(x)
        full, trimmed = family.forward(model, x, decode=False), family.forward(model, cut, decode=False)
        gap = max_gap([(full.alignment_logits, trimmed.alignment_logits)])
        loss_gap = abs(float(vilbert_loss(model, x)) - float(vilbert_loss(model, cut)))
    seconds = three_ways(args, model, vilbert_loss, model, vilbert_loss, plain, grouped)
    report(
        f"ViLBERT ({args.vilbert}) pretraining step, captions (mean {tokens.mean():.1f} tokens), "
        f"{REGIONS[0]}-{REGIONS[1]} regions + IMG, batch {args.batch}",
        ["ours, padded to 36 tokens, 37 slots", "ours, cut (batch)", "ours, cut, grouped by length"],
        seconds,
        args.batch,
        1.5,
        f"alignment logits max |diff| {gap:.1e}, loss |diff| {loss_gap:.1e} (eval mode)",
    )


def end_to_end(args, rng, g) -> None:
    """Real `vltrain pretrain` runs (LXMERT; data loading, masking, the trainer's loop) on a
    COCO-captions + VQA mixture of the distributions' lengths over a float16 store of 36 x
    2048 regions per image, and real `vltrain finetune --task vqa` runs on those questions:
    padded to the maximum, cut, and cut and grouped by length."""
    from train_step import build_data

    from vl_models import transfer
    from vl_models.config import FinetuneConfig, TrainConfig
    from vl_models.data.tokenize import bundled_bert_vocab
    from vl_models.train.trainer import run
    from vl_models.transfer.build import build_task
    from vl_models.transfer.finetune import run_finetune

    images, vocab = 256, bundled_bert_vocab()
    captions = word_counts(rng, 5 * images, *CAPTION_WORDS)
    questions = word_counts(rng, images, *QUESTION_WORDS)
    variants = [("padded to the maximum", "max", False), ("cut", "batch", False), ("cut, grouped", "batch", True)]
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_data(root, images, vocab, captions, questions)
        for name, padding, grouped in variants:
            run(
                TrainConfig.of(
                    model=args.lxmert,
                    stores=(str(root / "feats"),),
                    mixture=str(root / "mix"),
                    out=str(root / f"run-{padding}-{grouped}"),
                    vocab=str(vocab),
                    steps=args.warmup + args.steps,
                    batch_size=args.batch,
                    log_every=1,
                    warmup=1,
                    checkpoint_every=10**9,
                    padding=padding,
                    group_by_length=grouped,
                )
            )
            rates.append(logged_rate(root / f"run-{padding}-{grouped}", args))
        show("pretrain", variants, rates, args)
        build_task(
            transfer.get("vqa"),
            [root / "v2_OpenEnded_mscoco_train2014_questions.json", root / "v2_mscoco_train2014_annotations.json"],
            root / "vqa",
            min_count=1,
        )
        tuned = []
        for name, padding, grouped in variants:
            out = root / f"vqa-{padding}-{grouped}"
            run_finetune(
                FinetuneConfig.of(
                    tasks=("vqa",),
                    task_data=(str(root / "vqa"),),
                    stores=(str(root / "feats"),),
                    out=str(out),
                    model=args.lxmert,
                    vocab=str(vocab),
                    epochs=None,
                    steps=args.warmup + args.steps,
                    batch_size=args.batch,
                    log_every=1,
                    checkpoint_every=10**9,
                    padding=padding,
                    group_by_length=grouped,
                )
            )
            tuned.append(logged_rate(out, args))
    show("finetune --task vqa", variants, tuned, args)


def show(title: str, variants: list, rates: list[float], args) -> None:
    print(f"\nvltrain {title} {args.lxmert}, end to end, batch {args.batch}", flush=True)
    for (name, _, _), rate in zip(variants, rates):
        print(f"  {name:<34} {rate:8.1f} examples/s  {rate / rates[0]:5.2f}x", flush=True)


def logged_rate(out: Path, args) -> float:
    """Examples/s of a run's optimizer steps after the warm-up ones, from the cumulative rates in
    its metrics.jsonl (one row per step)."""
    steps = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if "samples_per_s" in r]
    first, last = steps[args.warmup - 1], steps[-1]
    spent = args.batch * (last["step"] / last["samples_per_s"] - first["step"] / first["samples_per_s"])
    return (last["step"] - first["step"]) * args.batch / spent


MEASURES: dict[str, Callable] = {
    "lxmert": lxmert_pretraining,
    "vqa": vqa_finetuning,
    "vilbert": vilbert_pretraining,
    "end-to-end": end_to_end,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per variant (each on its own batch)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--pool", type=int, default=32 * 50 * 4, help="items drawn (grouping sorts 50 batches)")
    parser.add_argument("--answers", type=int, default=3129)
    parser.add_argument("--only", choices=sorted(MEASURES), action="append", help="run only these measures")
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 steps: a smoke run")
    args = parser.parse_args()
    args.lxmert, args.vilbert = ("lxmert-tiny", "vilbert-tiny") if args.quick else ("lxmert-base", "vilbert-base")
    if args.quick:
        args.steps, args.answers = 2, 50
    torch.set_grad_enabled(True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; load average "
        f"{os.getloadavg()[0]:.2f}; mean of {args.steps} interleaved steps per variant after {args.warmup} warm-up"
    )
    for measure in args.only or MEASURES:
        if args.quick and measure == "end-to-end":
            print("\n(end to end: not in --quick; its store has VG's 1,600 object labels, lxmert-tiny 12)")
            continue
        rng, g = np.random.default_rng(0), torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        MEASURES[measure](args, rng, g)


if __name__ == "__main__":
    main()
