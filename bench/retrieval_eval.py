"""Retrieval evaluation throughput: `vl_models.transfer.evaluate.score_pairs` (every caption of
a split against every image: each caption's and each image's single-modality states once, the
layers where the streams meet per pair) in pairs/s, for both model families at a small and at
the base width, and how it scales with the caption batch size and with the number of images N
(pairs/s flat or rising in N = time linear in the N x 5N pairs), each point with the
captions and images padded to the maximum with every state of LXMERT's last cross-modality
layer computed ("whole": the scoring before dynamic padding), padded to the maximum (``--padding
max``: 30 tokens, 36 regions; LXMERT's last layer for the [CLS] state alone) and cut to what
each batch uses (``batch``, the default: `vl_models.data.padding`), side by side with the ratio
to the first.

Each point is measured twice, side by side: the cached path (`score_pairs`) and the uncached full
forward per pair ("uncached": the same caption batches, padding and head, but every pair runs
the whole model, its caption's single-modality layers and its image's included: scoring as if
nothing were reused), with the ratio cached / uncached. Beside them, the share of a full
pair's FLOPs that does not depend on the pair (LXMERT's 9 language and 5 object-relationship
layers; ViLBERT's text layers before its first co-attention block and its image embedding:
computed once per caption and once per image by the cached path), counted with
`torch.utils.flop_counter` on a caption batch of the split's median length, and the projected
time of the Flickr30k 1K test split (1,000 images x 5,000 captions = 5 M pairs) at the measured
rate.

The split is synthetic but goes through the real path: a Karpathy-format
``dataset_flickr30k.json`` (N test images x 5 captions) built into a task dataset by
`build_task`, a feature store of N VG-like records (36 regions x 2048, float16) written by
`write_records`, a `TaskDataset` view per family, and the family's pretraining model as a
`TransferModel` with the retrieval head (random weights: speed does not depend on them).
Scaling with N uses `score_pairs`' ``limit`` (the first N images of the split and their
captions). Times include the captions' tokenization and the images' store reads, as a real
evaluation's do; each model runs one small warm-up call first.

    python bench/retrieval_eval.py                      # small + base, both families, CPU
    python bench/retrieval_eval.py --quick              # small width only, a few seconds each
    python bench/retrieval_eval.py --device cuda --base-n 32,64 --base-batches 64,320
    python bench/retrieval_eval.py --small-n 32 --small-batches 20 --base-n 4 --base-batches 20 --padding batch
                                                        # the cached / uncached comparison alone
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import vg_like_record
from dynamic_padding import CAPTION_WORDS, word_counts

from pipeline.store import write_records
from pipeline.task_data import TaskData
from vl_models import transfer
from vl_models.config import DataSettings
from vl_models.data.padding import padded
from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.transfer.build import build_task
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import score_pairs
from vl_models.transfer.heads import RetrievalHead, build_transfer_model
from vl_models.transfer.runs import model_of

CAPTIONS = 5  # per image, as Flickr30k and COCO
FLICKR30K_PAIRS = 1000 * 5000  # the Karpathy test split: 1k images x 5k captions
WORDS = "a man woman dog cat red blue small large table street sitting standing next to on the with".split()


def write_split(root: Path, images: int) -> tuple[Path, Path]:
    """(task dataset, feature store) of `images` test images x 5 captions, of lengths drawn as
    `dynamic_padding.word_counts` draws Conceptual Captions' (mean 10.3 words; Flickr30k's and
    COCO's captions are of about that length too)."""
    rng = torch.Generator().manual_seed(0)
    lengths = iter(word_counts(np.random.default_rng(0), images * CAPTIONS, *CAPTION_WORDS).tolist())

    def caption() -> str:
        n = next(lengths)
        return " ".join(WORDS[int(j)] for j in torch.randint(0, len(WORDS), (n,), generator=rng))

    records = [vg_like_record(i) for i in range(images)]
    write_records(root / "feats", records, feature_dim=2048, dtype="float16")
    karpathy = {
        "dataset": "flickr30k",
        "images": [
            {
                "filename": f"{r.image_id}.jpg",
                "imgid": i,
                "split": "test",
                "sentids": list(range(5 * i, 5 * i + 5)),
                "sentences": [
                    {"raw": caption(), "tokens": [], "imgid": i, "sentid": 5 * i + k} for k in range(CAPTIONS)
                ],
            }
            for i, r in enumerate(records)
        ],
    }
    (root / "dataset_flickr30k.json").write_text(json.dumps(karpathy))
    build_task(transfer.get("flickr30k"), [root / "dataset_flickr30k.json"], root / "task")
    return root / "task", root / "feats"


def the_split(view, images: int) -> tuple[list[int], list[str]]:
    """(caption rows, image keys) of the split's first `images` images, as `score_pairs` picks them."""
    keys = list(dict.fromkeys(view.value("images", i)[0] for i in range(len(view.rows))))[:images]
    chosen = set(keys)
    return [i for i in range(len(view.rows)) if view.value("images", i)[0] in chosen], keys


def caption_batches(view, captions: list[int], batch: int, device: str) -> list[tuple[np.ndarray, dict]]:
    """The caption batches `pair_scores` makes: sorted by length, each padded as the view pads."""
    texts = [view.text(view.value("text", i)) for i in captions]
    order = np.argsort([int(t["attention_mask"].sum()) for t in texts], kind="stable")
    out = []
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        text = padded(torch.utils.data.default_collate([texts[c] for c in chunk]), view.cfg.padding)
        out.append((chunk, {k: v.to(device) if torch.is_tensor(v) else v for k, v in text.items()}))
    return out


def image_batch(view, key: str, device: str) -> dict:
    region = padded(torch.utils.data.default_collate([view.image(key)]), view.cfg.padding)
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in region.items()}


def full_pairs(model, text: dict, region: dict) -> torch.Tensor:
    """(n,) scores of a caption batch against one image by the whole model per pair: the
    backbone's full forward (both streams from their embeddings, then where they meet; the pair
    head's pooled-only keywords as the cached path has them), then the task's head."""
    family, task = model.family, next(iter(model.heads))
    base, head = family.backbone(model.backbone), model.heads[task]
    n = text["input_ids"].shape[0]
    feats, pos, vmask = (
        region[k].expand(n, *region[k].shape[1:]) for k in ("visual_feats", "visual_pos", "visual_mask")
    )
    extra = {}  # no token types: the cached path's `encode_text` takes none either
    token = model.task_tokens.get(task)
    if token is not None:
        extra["task_ids"] = torch.full((n,), token, dtype=torch.long, device=feats.device)
    out = base(text["input_ids"], feats, pos, text["attention_mask"], vmask, **extra, **family.pooled_only)
    if isinstance(head, RetrievalHead):
        return family._margin(family.pair_head(model.backbone)(out.pooled_output))
    return head.score(out.pooled_output).float()


@torch.no_grad()
def uncached_scores(model, view, device: str, batch: int, images: int) -> np.ndarray:
    """(captions, images) scores of the split's first `images` images and their captions, every
    pair through the whole model (`full_pairs`), in `pair_scores`' caption batches."""
    captions, keys = the_split(view, images)
    batches = caption_batches(view, captions, batch, device)
    out = np.zeros((len(captions), len(keys)), np.float32)
    for j, key in enumerate(keys):
        region = image_batch(view, key, device)
        for chunk, text in batches:
            out[chunk, j] = full_pairs(model, text, region).cpu().numpy()
    return out


def measure(model, view, device: str, batch: int, images: int, repeats: int = 1, cached: bool = True):
    """(pairs, median seconds of `repeats` calls, the scores) of `score_pairs` (or, not `cached`,
    `uncached_scores`) over the split's first `images` images."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        if cached:
            scores = score_pairs(model, view, device, batch, limit=images).values["scores"]
        else:
            scores = uncached_scores(model, view, device, batch, images)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return scores.size, statistics.median(seconds), scores


def measure_both(model, view, device: str, batch: int, images: int, repeats: int):
    """(pairs, median seconds cached, median seconds uncached, largest score difference): the two
    paths call by call in alternating order, so that both see the same load."""
    times: dict = {True: [], False: []}
    scores = {}
    for r in range(repeats):
        for cached in (True, False) if r % 2 == 0 else (False, True):
            pairs, seconds, scores[cached] = measure(model, view, device, batch, images, 1, cached)
            times[cached].append(seconds)
    agree = float(np.abs(scores[True] - scores[False]).max())
    return pairs, statistics.median(times[True]), statistics.median(times[False]), agree


@torch.no_grad()
def flop_shares(model, view, device: str, batch: int) -> dict:
    """GFLOP of one pair's full forward and its parts, on the caption batch of `batch` captions of
    the split's median length against one image: the caption's single-modality layers (once per
    caption when cached), the image's (once per image), and where the streams meet with the head
    (per pair); and the share of the full pair that does not depend on the pair."""
    from torch.utils.flop_counter import FlopCounterMode

    family = model.family
    base = family.backbone(model.backbone)
    captions, keys = the_split(view, 1_000_000)
    batches = caption_batches(view, captions, batch, device)
    chunk, text = batches[len(batches) // 2]
    region = image_batch(view, keys[0], device)
    n = len(chunk)
    task = next(iter(model.heads))
    token = model.task_tokens.get(task)
    ids = {} if token is None else {"task_ids": torch.full((n,), token, dtype=torch.long, device=device)}

    def flops(fn) -> float:
        with FlopCounterMode(display=False) as counter:
            fn()
        return float(counter.get_total_flops())

    full = flops(lambda: full_pairs(model, text, region)) / n
    caption = flops(lambda: base.encode_text(text["input_ids"], text["attention_mask"], **ids)) / n
    image = flops(lambda: base.encode_vision(region["visual_feats"], region["visual_pos"], region["visual_mask"]))
    tokens = float(text["attention_mask"].sum(-1).float().mean())
    return {
        "full": full / 1e9,
        "caption": caption / 1e9,
        "image": image / 1e9,
        "pair": (full - caption - image) / 1e9,
        "share": (caption + image) / full,
        "tokens": tokens,
        "padded": int(text["input_ids"].shape[1]),
    }


@contextlib.contextmanager
def whole_layers(family, whole: bool):
    """With `whole`, the family's backbone computes every state of its last layer (no
    `pooled_only` keywords) while inside."""
    if not whole:
        yield
        return
    family.pooled_only = {}  # an instance attribute over the class's
    try:
        yield
    finally:
        del family.pooled_only


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="lxmert,vilbert")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--small-n", default="8,16,32", help="images N at the small width (caption batch: --batch)")
    parser.add_argument("--small-batches", default="8,32,128", help="caption batch sizes at the largest small N")
    parser.add_argument("--base-n", default="2,4", help="images N at the base width (caption batch: --batch)")
    parser.add_argument("--base-batches", default="5,20", help="caption batch sizes at the largest base N")
    parser.add_argument("--batch", type=int, default=20, help="caption batch size of the N sweeps")
    parser.add_argument("--repeats", type=int, default=3, help="calls per measurement (the median is kept)")
    parser.add_argument("--no-base", action="store_true", help="small width only")
    parser.add_argument(
        "--padding",
        default="whole,max,batch",
        help="variants to compare: whole (padded to the maximum, every state of LXMERT's last cross-modality layer "
        "computed: the scoring before dynamic padding), max, batch (DataSettings.padding)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: small width, N 4,8, batches 8,40, once")
    args = parser.parse_args()
    if args.quick:
        args.small_n, args.small_batches, args.no_base, args.repeats = "4,8", "8,40", True, 1
    widths = {"small": (ints(args.small_n), ints(args.small_batches))}
    if not args.no_base:
        widths["base"] = (ints(args.base_n), ints(args.base_batches))
    largest = max(n for ns, _ in widths.values() for n in ns)
    vocab = bundled_bert_vocab()
    rows, flops = [], {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        task_dir, store = write_split(Path(tmp), largest)
        data = TaskData.open(task_dir, task="flickr30k")
        task = transfer.get("flickr30k")
        for name in args.families.split(","):
            for width, (ns, batches) in widths.items():
                torch.manual_seed(0)
                family, mcfg = model_of(f"{name}-{width}", None, str(store), 1)
                model = build_transfer_model(family, mcfg, [task], [data], retrieval_head="pretraining")
                model = model.to(args.device).eval()
                views = {
                    variant: TaskDataset(
                        data,
                        task,
                        [store],
                        vocab,
                        family,
                        DataSettings(padding="max" if variant == "whole" else variant),
                        "test",
                        train=False,
                    )
                    for variant in args.padding.split(",")
                }
                for variant, view in views.items():
                    with whole_layers(family, variant == "whole"):
                        for cached in (True, False):  # warm-up: 5 captions x 1 image, at the batch size and at 8
                            measure(model, view, args.device, args.batch, 1, cached=cached)
                            measure(model, view, args.device, 8, 1, cached=cached)
                    flops[(name, width, variant)] = flop_shares(model, view, args.device, args.batch)
                sweeps = [(n, args.batch) for n in ns] + [(max(ns), b) for b in batches if b != args.batch]
                for n, b in sweeps:
                    for variant, view in views.items():
                        with whole_layers(family, variant == "whole"):
                            # the two paths in turn, on the same batches, so that both see the same load
                            pairs, seconds, full_s, agree = measure_both(model, view, args.device, b, n, args.repeats)
                        rows.append((name, width, n, min(b, CAPTIONS * n), variant, pairs, seconds, full_s, agree))
                        print(
                            f"  {name}-{width} ({variant}): N {n}, batch {b}: {pairs} pairs in {seconds:.2f} s cached, "
                            f"{full_s:.2f} s uncached (scores within {agree:.1e})",
                            flush=True,
                        )
                del model

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"\ndevice: {where}; torch {torch.__version__} ({torch.get_num_threads()} threads), float32; "
        f"up to {task.max_text} tokens per caption, 36 regions x 2048 per image; median of {args.repeats} calls; "
        f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end\n"
    )
    print(
        f"{'family':<8} {'width':<6} {'N images':>8} {'captions':>8} {'batch':>6} {'padding':>8} {'pairs':>8} "
        f"{'seconds':>8} {'pairs/s':>9} {'vs first':>8} {'uncached/s':>10} {'cached/unc.':>11} "
        f"{'|diff|':>8} {'Flickr30k 1k x 5k':>18}"
    )
    first: dict = {}
    for name, width, n, b, padding, pairs, seconds, full_s, agree in rows:
        rate, full_rate = pairs / seconds, pairs / full_s
        base = first.setdefault((name, width, n, b), rate)
        print(
            f"{name:<8} {width:<6} {n:8d} {CAPTIONS * n:8d} {b:6d} {padding:>8} {pairs:8d} {seconds:8.2f} "
            f"{rate:9.1f} {rate / base:7.2f}x {full_rate:10.1f} {rate / full_rate:10.2f}x {agree:8.1e} "
            f"{FLICKR30K_PAIRS / rate / 3600:16.1f} h"
        )
    print(
        "\nGFLOP per pair (a caption batch of the median length against one image): the full forward; its parts "
        "computed once per caption and once per image when cached; where the streams meet (per pair); the share "
        "of the full pair that does not depend on the pair (the cached path's ceiling: 1 / (1 - share))"
    )
    for (name, width, padding), f in flops.items():
        print(
            f"  {name}-{width} ({padding}: {f['tokens']:.1f} tokens padded to {f['padded']}): full {f['full']:.3f}, "
            f"caption {f['caption']:.3f}, image {f['image']:.3f}, per pair {f['pair']:.3f}; "
            f"independent of the pair {f['share']:.0%} (ceiling {1 / (1 - f['share']):.2f}x)"
        )


if __name__ == "__main__":
    main()
