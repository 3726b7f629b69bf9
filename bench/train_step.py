"""Pretraining step speed: ours vs `transformers.LxmertForPreTraining`, plus ViLBERT and the
data loader, in one run.

1. LXMERT-base with all pretraining heads and losses, the same config, weights and inputs
   (batch 32, 20 tokens, 36 regions) for both implementations: forward + backward (the
   issue's measure), and the whole step with the same fused AdamW for both.
2. ViLBERT-base alone (36 tokens, 36 regions + IMG).
3. The data side: a synthetic feature store (36 x 2048-d regions per image) and a COCO
   captions + VQA mixture built with our tools; `PretrainDataset` + DataLoader samples/s
   with 0 and 1 workers against the model's consumption, then a real `vltrain pretrain`
   run of LXMERT-base whose metrics give the measured data-wait fraction.

    python bench/train_step.py                       # CPU, float32
    python bench/train_step.py --amp bf16            # CPU, both under bf16 autocast
    python bench/train_step.py --device cuda --amp bf16 --steps 20      # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
import yaml
from common import vg_like_record

from pipeline.mixture.build import MixtureSpec, build_mixture
from pipeline.store import write_records
from vl_models import families
from vl_models.config import DataSettings, TrainConfig
from vl_models.data.dataset import PretrainDataset
from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.models.modeling_lxmert import LxmertForPreTraining
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
from vl_models.tasks.losses import LxmertVisualTargets, lxmert_visual, masked_lm, pair_classification, qa, region_kl
from vl_models.train.trainer import run


def lxmert_inputs(b: int, words: int, regions: int, cfg, device: str, g: torch.Generator) -> dict:
    ids = torch.randint(1, cfg.vocab_size, (b, words), generator=g)
    labels = torch.where(torch.rand(b, words, generator=g) < 0.15, ids, torch.full_like(ids, -1))
    xy = torch.rand(b, regions, 2, generator=g) * 0.5
    return {
        k: v.to(device)
        for k, v in {
            "ids": ids,
            "mask": torch.ones(b, words, dtype=torch.long),
            "labels": labels,
            "feats": torch.rand(b, regions, cfg.visual_feat_dim, generator=g),
            "pos": torch.cat([xy, xy + 0.4], -1),
            "vmask": torch.ones(b, regions, dtype=torch.long),
            "obj": torch.randint(0, cfg.num_object_labels, (b, regions), generator=g),
            "attr": torch.randint(0, cfg.num_attr_labels, (b, regions), generator=g),
            "conf": torch.rand(b, regions, generator=g),
            "selected": torch.rand(b, regions, generator=g) < 0.15,
            "matched": torch.randint(0, 2, (b,), generator=g),
            "answer": torch.randint(0, cfg.num_qa_labels, (b,), generator=g),
        }.items()
    }


def ours_lxmert_step(model, x):
    lm_at = x["labels"] != -1
    out = model(x["ids"], x["feats"], x["pos"], x["mask"], x["vmask"], lm_positions=lm_at, feat_positions=x["selected"])
    t = LxmertVisualTargets(x["obj"], x["conf"], x["attr"], x["conf"], x["feats"], x["selected"], x["vmask"].bool())
    visual, _ = lxmert_visual(out.obj_logits, out.attr_logits, out.feat_pred, t)
    losses = [
        masked_lm(out.lm_logits, x["labels"][lm_at])[0],
        pair_classification(out.matched_logits, x["matched"], "m")[0],
        qa(out.answer_logits, x["answer"])[0],
        *visual.values(),
    ]
    return sum(losses)


def hf_lxmert_step(model, x):
    labels = x["labels"].masked_fill(x["labels"] == -1, -100)
    out = model(
        input_ids=x["ids"],
        visual_feats=x["feats"],
        visual_pos=x["pos"],
        attention_mask=x["mask"],
        visual_attention_mask=x["vmask"],
        labels=labels,
        obj_labels={
            "obj": (x["obj"], x["conf"]),
            "attr": (x["attr"], x["conf"]),
            "feat": (x["feats"], x["selected"].float()),
        },
        matched_label=x["matched"],
        ans=x["answer"],
    )
    return out.loss


def time_steps(runs: list, x, steps: int, device: str, amp: str) -> list[tuple[float, float]]:
    """Median (forward + backward, whole step incl. fused AdamW) seconds of each
    (model, step_fn) after one warm-up step; the runs' steps are interleaved (A B A B ...)
    so that drift of a shared machine affects them alike."""
    ctx = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=amp == "bf16")
    optimizers = [torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True) for model, _ in runs]
    times = [([], []) for _ in runs]

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for i in range(steps + 1):
        for (model, step_fn), opt, (fb, whole) in zip(runs, optimizers, times):
            model.train()
            start = time.perf_counter()
            with ctx:
                loss = step_fn(model, x)
            loss.backward()
            sync()
            middle = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
            if i:  # the first step warms up (and compiles)
                fb.append(middle - start)
                whole.append(time.perf_counter() - start)
    return [(statistics.median(fb), statistics.median(whole)) for fb, whole in times]


def build_data(root: Path, images: int, vocab: Path, caption_words=None, question_words=None) -> None:
    """A store of `images` VG-like records and a COCO captions + VQA mixture over them (5
    captions and one question per image); `caption_words` / `question_words`: their lengths
    in words, in order (default: 12 and 8 each)."""
    write_records(root / "feats", (vg_like_record(i) for i in range(images)), feature_dim=2048, dtype="float16")
    words = "a man woman dog cat red blue small large table street sitting standing next to on the with".split()
    g = torch.Generator().manual_seed(0)
    captions = iter(caption_words if caption_words is not None else [12] * (5 * images))
    questions = iter(question_words if question_words is not None else [8] * images)

    def sentence(n):
        return " ".join(words[int(j)] for j in torch.randint(0, len(words), (int(n),), generator=g))

    (root / "captions_train2014.json").write_text(
        json.dumps(
            {
                "images": [{"id": i, "file_name": f"COCO_train2014_{i:012d}.jpg"} for i in range(images)],
                "annotations": [
                    {"image_id": i, "caption": sentence(next(captions))} for i in range(images) for _ in range(5)
                ],
            }
        )
    )
    (root / "v2_OpenEnded_mscoco_train2014_questions.json").write_text(
        json.dumps(
            {
                "questions": [
                    {"image_id": i, "question": sentence(next(questions)) + "?", "question_id": i}
                    for i in range(images)
                ]
            }
        )
    )
    (root / "v2_mscoco_train2014_annotations.json").write_text(
        json.dumps(
            {
                "annotations": [
                    {
                        "question_id": i,
                        "answers": [{"answer": words[i % len(words)]}] * 10,
                        "multiple_choice_answer": words[i % len(words)],
                    }
                    for i in range(images)
                ]
            }
        )
    )
    (root / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "bench",
                "answers": {"top_k": 100},
                "sources": [
                    {"name": "mscoco", "kind": "coco_captions", "files": ["captions_train2014.json"]},
                    {
                        "name": "vqa",
                        "kind": "vqa",
                        "files": [
                            "v2_OpenEnded_mscoco_train2014_questions.json",
                            "v2_mscoco_train2014_annotations.json",
                        ],
                    },
                ],
            }
        )
    )
    build_mixture(MixtureSpec.load(root / "spec.yaml"), root / "mix", stores=(root / "feats",))


def loader_rate(root: Path, vocab: Path, batch: int, workers: int, batches: int) -> float:
    data = PretrainDataset(
        root / "mix", [root / "feats"], vocab, DataSettings(max_text=20, max_regions=36), families.get("lxmert")
    )
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True)
    it = iter(loader)
    next(it)  # workers started, first batch out
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches * batch / (time.perf_counter() - start)


def measured_data_wait(root: Path, vocab: Path, batch: int, steps: int) -> dict:
    """A real `vltrain pretrain` run of LXMERT-base; its last metrics row."""
    run(
        TrainConfig.of(
            model="lxmert-base",
            stores=(str(root / "feats"),),
            mixture=str(root / "mix"),
            out=str(root / "run"),
            vocab=str(vocab),
            steps=steps,
            batch_size=batch,
            workers=1,
            log_every=1,
            warmup=1,
            checkpoint_every=10**9,
        )
    )
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "data_wait_fraction" in r][-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="none", choices=["none", "bf16"])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compile", action="store_true", help="also time ours with the backbone torch.compiled")
    parser.add_argument("--skip-loader", action="store_true")
    args = parser.parse_args()
    device = args.device
    g = torch.Generator().manual_seed(0)

    cfg = families.load_config("lxmert-base")
    torch.manual_seed(0)
    hf = transformers.LxmertForPreTraining(transformers.LxmertConfig()).to(device)
    ours = LxmertForPreTraining(cfg)
    ours.load_state_dict(hf.state_dict(), strict=True)
    ours.to(device)
    x = lxmert_inputs(args.batch, 20, 36, cfg, device, g)
    runs = [("transformers", hf, hf_lxmert_step), ("ours", ours, ours_lxmert_step)]
    if args.compile:
        compiled = LxmertForPreTraining(cfg)
        compiled.load_state_dict(hf.state_dict(), strict=True)
        compiled.lxmert.embeddings.word_embeddings.sparse = False  # as the trainer does under compile
        compiled.to(device).lxmert.compile()
        runs.append(("ours, compiled", compiled, ours_lxmert_step))
    timed = time_steps([(m, fn) for _, m, fn in runs], x, args.steps, device, args.amp)
    rows = [("LXMERT-base", impl, *t) for (impl, _, _), t in zip(runs, timed)]
    del hf, ours, runs

    vcfg = families.load_config("vilbert-base")
    vil = ViLBERTForPreTraining(vcfg).to(device)
    ids = torch.randint(1, vcfg.vocab_size, (args.batch, 36), generator=g)
    vx = {
        "ids": ids.to(device),
        "labels": torch.where(torch.rand(args.batch, 36, generator=g) < 0.15, ids, -1).to(device),
        "feats": torch.rand(args.batch, 37, 2048, generator=g).to(device),
        "loc": torch.rand(args.batch, 37, 5, generator=g).to(device),
        "prob": torch.softmax(torch.randn(args.batch, 37, 1601, generator=g), -1).to(device),
        "sel": (torch.rand(args.batch, 37, generator=g) < 0.15).to(device),
        "aligned": torch.randint(0, 2, (args.batch,), generator=g).to(device),
    }

    def vil_step(model, v):
        lm_at = v["labels"] != -1
        out = model(v["ids"], v["feats"], v["loc"], lm_positions=lm_at, region_positions=v["sel"])
        return (
            masked_lm(out.lm_logits, v["labels"][lm_at])[0]
            + region_kl(out.region_logits, v["prob"][v["sel"]])[0]
            + pair_classification(out.alignment_logits, v["aligned"], "a")[0]
        )

    rows.append(("ViLBERT-base", "ours", *time_steps([(vil, vil_step)], vx, args.steps, device, args.amp)[0]))
    del vil

    name = torch.cuda.get_device_name() if device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; amp={args.amp}; "
        f"batch {args.batch}; median of {args.steps} interleaved steps after one warm-up\n"
    )
    print(f"{'model':<13} {'implementation':<16} {'fwd+bwd s':>10} {'samples/s':>10} {'step s':>8} {'samples/s':>10}")
    for model, impl, fb, whole in rows:
        print(f"{model:<13} {impl:<16} {fb:10.3f} {args.batch / fb:10.1f} {whole:8.3f} {args.batch / whole:10.1f}")
    hf_fb, hf_step = rows[0][2:]
    for _, impl, fb, whole in rows[1:-1]:
        print(
            f"ratio {impl} / transformers: forward+backward {hf_fb / fb:.2f}x (target >= 1.3x), "
            f"whole step {hf_step / whole:.2f}x"
        )
    if args.skip_loader:
        return

    vocab = bundled_bert_vocab()  # bert-base-uncased's (dev extra)
    consumed = args.batch / rows[1][3]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_data(root, 512, vocab)
        print(f"\nloader (LXMERT items from a float16 store of 512 images x 36 x 2048, batch {args.batch}):")
        for workers in (0, 1):
            rate = loader_rate(root, vocab, args.batch, workers, batches=10)
            print(
                f"  {workers} workers: {rate:8.1f} samples/s = {rate / consumed:6.1f}x the model's consumption "
                f"({consumed:.1f} samples/s)"
            )
        if device == "cpu":
            last = measured_data_wait(root, vocab, args.batch, steps=4)
            print(
                f"  vltrain pretrain lxmert-base, 1 worker, 4 steps: {last['samples_per_s']:.1f} samples/s, "
                f"data-wait {100 * last['data_wait_fraction']:.2f} % (target < 2 %)"
            )


if __name__ == "__main__":
    main()
