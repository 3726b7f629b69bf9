"""Pretraining step speed: ours vs `transformers.LxmertForPreTraining`, plus ViLBERT and the
data loader, in one run.

Forward + backward + optimizer step of LXMERT-base with all pretraining heads and losses,
the same config, weights and inputs (batch 32, 20 tokens, 36 regions) for both
implementations; then ViLBERT-base alone (36 tokens, 36 regions + IMG).

    python bench/train_step.py                 # CPU
    python bench/train_step.py --device cuda --amp bf16 --steps 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import transformers

from vl_models.models.configuration import load_config
from vl_models.models.modeling_lxmert import LxmertForPreTraining
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
from vl_models.tasks.losses import LxmertVisualTargets, lxmert_visual, masked_lm, pair_classification, qa, region_kl


def lxmert_inputs(b: int, words: int, regions: int, cfg, device: str, g: torch.Generator) -> dict:
    ids = torch.randint(1, cfg.vocab_size, (b, words), generator=g)
    labels = torch.where(torch.rand(b, words, generator=g) < 0.15, ids, torch.full_like(ids, -1))
    xy = torch.rand(b, regions, 2, generator=g) * 0.5
    return {k: v.to(device) for k, v in {
        "ids": ids, "mask": torch.ones(b, words, dtype=torch.long), "labels": labels,
        "feats": torch.rand(b, regions, cfg.visual_feat_dim, generator=g),
        "pos": torch.cat([xy, xy + 0.4], -1), "vmask": torch.ones(b, regions, dtype=torch.long),
        "obj": torch.randint(0, cfg.num_object_labels, (b, regions), generator=g),
        "attr": torch.randint(0, cfg.num_attr_labels, (b, regions), generator=g),
        "conf": torch.rand(b, regions, generator=g), "selected": torch.rand(b, regions, generator=g) < 0.15,
        "matched": torch.randint(0, 2, (b,), generator=g), "answer": torch.randint(0, cfg.num_qa_labels, (b,), generator=g),
    }.items()}


def ours_lxmert_step(model, x):
    out = model(x["ids"], x["feats"], x["pos"], x["mask"], x["vmask"])
    t = LxmertVisualTargets(x["obj"], x["conf"], x["attr"], x["conf"], x["feats"], x["selected"], x["vmask"].bool())
    visual, _ = lxmert_visual(out.obj_logits, out.attr_logits, out.feat_pred, t)
    losses = [masked_lm(out.lm_logits, x["labels"])[0], pair_classification(out.matched_logits, x["matched"], "m")[0],
              qa(out.answer_logits, x["answer"])[0], *visual.values()]
    return sum(losses)


def hf_lxmert_step(model, x):
    labels = x["labels"].masked_fill(x["labels"] == -1, -100)
    out = model(input_ids=x["ids"], visual_feats=x["feats"], visual_pos=x["pos"], attention_mask=x["mask"],
                visual_attention_mask=x["vmask"], labels=labels,
                obj_labels={"obj": (x["obj"], x["conf"]), "attr": (x["attr"], x["conf"]),
                            "feat": (x["feats"], x["selected"].float())},
                matched_label=x["matched"], ans=x["answer"])
    return out.loss


def time_steps(model, step_fn, x, steps: int, device: str, amp: str) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()
    ctx = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=amp == "bf16")
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        with ctx:
            loss = step_fn(model, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if i:  # the first step warms up
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="none", choices=["none", "bf16"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    device = args.device
    g = torch.Generator().manual_seed(0)

    cfg = load_config("lxmert-base")
    hf_cfg = transformers.LxmertConfig()
    torch.manual_seed(0)
    hf = transformers.LxmertForPreTraining(hf_cfg).to(device)
    ours = LxmertForPreTraining(cfg)
    ours.load_state_dict({k: v for k, v in hf.state_dict().items()}, strict=True)
    ours.to(device)
    x = lxmert_inputs(args.batch, 20, 36, cfg, device, g)
    t_hf = time_steps(hf, hf_lxmert_step, x, args.steps, device, args.amp)
    t_ours = time_steps(ours, ours_lxmert_step, x, args.steps, device, args.amp)
    del hf, ours

    vcfg = load_config("vilbert-base")
    vil = ViLBERTForPreTraining(vcfg).to(device)
    ids = torch.randint(1, vcfg.vocab_size, (args.batch, 36), generator=g)
    vx = {"ids": ids.to(device), "labels": torch.where(torch.rand(args.batch, 36, generator=g) < 0.15, ids, -1).to(device),
          "feats": torch.rand(args.batch, 37, 2048, generator=g).to(device), "loc": torch.rand(args.batch, 37, 5, generator=g).to(device),
          "prob": torch.softmax(torch.randn(args.batch, 37, 1601, generator=g), -1).to(device),
          "sel": (torch.rand(args.batch, 37, generator=g) < 0.15).to(device), "aligned": torch.randint(0, 2, (args.batch,), generator=g).to(device)}

    def vil_step(model, v):
        out = model(v["ids"], v["feats"], v["loc"])
        return (masked_lm(out.lm_logits, v["labels"])[0] + region_kl(out.region_logits, v["prob"], v["sel"])[0]
                + pair_classification(out.alignment_logits, v["aligned"], "a")[0])

    t_vil = time_steps(vil, vil_step, vx, args.steps, device, args.amp)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; amp={args.amp}; "
          f"batch {args.batch}; median of {args.steps} steps after one warm-up\n")
    print(f"LXMERT-base pretraining step  transformers: {t_hf:7.2f} s  ({args.batch / t_hf:6.1f} samples/s)")
    print(f"LXMERT-base pretraining step  ours:         {t_ours:7.2f} s  ({args.batch / t_ours:6.1f} samples/s)"
          f"   ratio {t_hf / t_ours:.2f}x (target >= 1.3x)")
    print(f"ViLBERT-base pretraining step ours:         {t_vil:7.2f} s  ({args.batch / t_vil:6.1f} samples/s)")


if __name__ == "__main__":
    main()
