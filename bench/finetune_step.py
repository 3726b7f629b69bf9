"""VQA fine-tuning step speed: our `TransferModel` (LXMERT backbone + VQA answer head, built by
`build_transfer_model` as `vltrain finetune` builds it) vs `transformers.LxmertForQuestionAnswering`,
in one run, with the same weights, the same batch and the same optimizer.

One step, for both: forward, BCE on the soft VQA targets summed over the answers and averaged
over the batch (ours: `AnswerHead.loss`; HF: the same formula on ``question_answering_score``),
backward, then our trainer's AdamW (`make_optimizer`: fused kernel, no decay on bias/LayerNorm).
Steps of the two implementations are interleaved (A B A B ...) after warm-up steps, so that
drift of a shared machine affects both alike; medians are reported.

    python bench/finetune_step.py                          # LXMERT-base, 3,129 answers, batch 8, CPU
    python bench/finetune_step.py --quick                  # tiny smoke run (seconds)
    python bench/finetune_step.py --amp bf16 --steps 10    # both under bf16 autocast
    python bench/finetune_step.py --device cuda --batch 64 --steps 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F
import transformers

from vl_models import families, transfer
from vl_models.train.optim import make_optimizer
from vl_models.transfer.heads import TransferModel, build_transfer_model

VQA_ANSWERS = 3129  # the VQA v2 answer table of the reference setups


def hf_qa_state_dict(model: TransferModel, task: str) -> dict:
    """Our LXMERT transfer model's backbone and `task`'s answer head in the key layout of
    `transformers.LxmertForQuestionAnswering` (``lxmert.*``, ``answer_head.logit_fc.*``); the
    pretraining heads the backbone also holds have no counterpart there and are left out."""
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith("backbone.lxmert."):
            state[key[len("backbone.") :]] = value
        elif key.startswith(f"heads.{task}.logit_fc."):
            state["answer_head." + key[len(f"heads.{task}.") :]] = value
    return state


def build_pair(mcfg, answers: int, device: str) -> tuple[TransferModel, transformers.LxmertForQuestionAnswering]:
    """Our VQA transfer model (random init) and HF's QA model holding the same weights."""
    ours = build_transfer_model(
        families.get("lxmert"),
        mcfg,
        [transfer.get("vqa")],
        [SimpleNamespace(answers=[f"answer {i}" for i in range(answers)])],
    )
    hf = transformers.LxmertForQuestionAnswering(
        transformers.LxmertConfig(**{**mcfg.hf_config(), "num_qa_labels": answers})
    )
    hf.load_state_dict(hf_qa_state_dict(ours, "vqa"), strict=True)
    return ours.to(device), hf.to(device)


def vqa_batch(b: int, words: int, regions: int, answers: int, mcfg, device: str, seed: int = 0) -> dict:
    """A fine-tuning batch with its candidate axis (B, 1, ...): padded questions, 4-d
    normalized boxes, a few soft targets per question."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(words // 2, words + 1, (b,), generator=g)
    mask = (torch.arange(words) < lengths[:, None]).long()
    ids = torch.randint(1000, mcfg.vocab_size, (b, words), generator=g) * mask
    xy = torch.rand(b, regions, 2, generator=g) * 0.5
    target = torch.zeros(b, answers)
    target.scatter_(1, torch.randint(0, answers, (b, 3), generator=g), torch.tensor([1.0, 0.6, 0.3]).expand(b, 3))
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "visual_feats": torch.rand(b, regions, mcfg.visual_feat_dim, generator=g) * 4,
        "visual_pos": torch.cat([xy, xy + torch.rand(b, regions, 2, generator=g) * 0.5], -1),
        "visual_mask": torch.ones(b, regions, dtype=torch.long),
    }
    return {**{k: v[:, None].to(device) for k, v in batch.items()}, "target": target.to(device)}


def ours_loss(model: TransferModel, batch: dict) -> torch.Tensor:
    return model.heads["vqa"].loss(model("vqa", batch), batch)[0]


def hf_qa_scores(model, batch: dict) -> torch.Tensor:
    """`transformers.LxmertForQuestionAnswering`'s answer logits on a fine-tuning batch (its
    one candidate per question)."""
    return model(
        input_ids=batch["input_ids"][:, 0],
        attention_mask=batch["attention_mask"][:, 0],
        visual_feats=batch["visual_feats"][:, 0],
        visual_pos=batch["visual_pos"][:, 0],
        visual_attention_mask=batch["visual_mask"][:, 0],
    ).question_answering_score


def hf_loss(model, batch: dict) -> torch.Tensor:
    scores = hf_qa_scores(model, batch).float()
    return F.binary_cross_entropy_with_logits(scores, batch["target"], reduction="sum") / scores.shape[0]


def time_steps(runs: list, batch: dict, steps: int, warmup: int, device: str, amp: str) -> list[dict]:
    """Per run (model, loss_fn): median seconds of forward, backward and the optimizer step
    over `steps` interleaved steps after `warmup` ones."""
    ctx = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=amp == "bf16")
    optimizers = [make_optimizer(model, "adamw", lr=1e-5, weight_decay=0.01) for model, _ in runs]
    times: list[dict] = [{"forward": [], "backward": [], "optimizer": [], "step": []} for _ in runs]

    def now() -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    for i in range(warmup + steps):
        for (model, loss_fn), opt, t in zip(runs, optimizers, times):
            model.train()
            start = now()
            with ctx:
                loss = loss_fn(model, batch)
            forward = now()
            loss.backward()
            backward = now()
            opt.step()
            opt.zero_grad(set_to_none=True)
            end = now()
            if i >= warmup:
                for name, value in (
                    ("forward", forward - start),
                    ("backward", backward - forward),
                    ("optimizer", end - backward),
                    ("step", end - start),
                ):
                    t[name].append(value)
    return [{k: statistics.median(v) for k, v in t.items()} for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lxmert-base", help="our model config (lxmert-base: 9/5/5 layers, 768)")
    parser.add_argument("--answers", type=int, default=VQA_ANSWERS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--words", type=int, default=20)
    parser.add_argument("--regions", type=int, default=36)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="none", choices=["none", "bf16"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="smoke run: lxmert-tiny, 16 answers, 2 steps")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="also time ours with the backbone compiled as `vltrain finetune --compile` does",
    )
    args = parser.parse_args()
    if args.quick:
        args.model, args.answers, args.steps, args.warmup = "lxmert-tiny", 16, 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    mcfg = families.load_config(args.model)
    ours, hf = build_pair(mcfg, args.answers, args.device)
    batch = vqa_batch(args.batch, args.words, args.regions, args.answers, mcfg, args.device)
    ours.eval()
    hf.eval()
    with torch.no_grad():
        diff = (ours_loss(ours, batch) - hf_loss(hf, batch)).abs().item()
    runs, names = [(hf, hf_loss), (ours, ours_loss)], ["transformers", "ours"]
    if args.compile:  # a second copy of ours, its backbone compiled in place (the trainer's compile target)
        compiled, _ = build_pair(mcfg, args.answers, args.device)
        compiled.load_state_dict(ours.state_dict())
        compiled.family.backbone(compiled.backbone).compile()
        runs.append((compiled, ours_loss))
        names.append("ours, compiled")
    timed = time_steps(runs, batch, args.steps, args.warmup, args.device, args.amp)

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"device: {name}; torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}; amp={args.amp}\n{args.model} ({mcfg.l_layers}/{mcfg.r_layers}/{mcfg.x_layers} "
        f"layers, {mcfg.hidden_size} wide), {args.answers} answers, batch {args.batch} x {args.words} tokens x "
        f"{args.regions} regions x {mcfg.visual_feat_dim}; median of {args.steps} interleaved steps after "
        f"{args.warmup} warm-up; eval-mode loss difference {diff:.2e}\n"
    )
    print(
        f"{'implementation':<16} {'forward s':>10} {'backward s':>11} {'AdamW s':>8} {'step s':>8} {'steps/s':>8} "
        f"{'samples/s':>10}"
    )
    for impl, t in zip(names, timed):
        print(
            f"{impl:<16} {t['forward']:10.3f} {t['backward']:11.3f} {t['optimizer']:8.3f} {t['step']:8.3f} "
            f"{1 / t['step']:8.3f} {args.batch / t['step']:10.1f}"
        )
    hf_t = timed[0]
    for impl, our_t in zip(names[1:], timed[1:]):
        print(
            f"\nratio {impl} / transformers (steps/s): {hf_t['step'] / our_t['step']:.2f}x (target >= 1.2x); "
            f"forward {hf_t['forward'] / our_t['forward']:.2f}x, backward {hf_t['backward'] / our_t['backward']:.2f}x"
        )


if __name__ == "__main__":
    main()
