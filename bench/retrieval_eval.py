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
from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.transfer.build import build_task
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import score_pairs
from vl_models.transfer.heads import build_transfer_model
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


def measure(model, view, device: str, batch: int, images: int, repeats: int = 1) -> tuple[int, float]:
    """(pairs, median seconds of `repeats` calls) of `score_pairs` over the split's first `images` images."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = score_pairs(model, view, device, batch, limit=images)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return out.values["scores"].size, statistics.median(seconds)


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
    rows = []
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
                        measure(model, view, args.device, 8, 1)  # warm-up: 5 captions x 1 image
                sweeps = [(n, args.batch) for n in ns] + [(max(ns), b) for b in batches if b != args.batch]
                for n, b in sweeps:
                    for variant, view in views.items():
                        with whole_layers(family, variant == "whole"):
                            pairs, seconds = measure(model, view, args.device, b, n, args.repeats)
                        rows.append((name, width, n, min(b, CAPTIONS * n), variant, pairs, seconds))  # batch as run
                        print(f"  {name}-{width} ({variant}): N {n}, batch {b}: {pairs} pairs in {seconds:.2f} s")
                del model

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"\ndevice: {where}; torch {torch.__version__} ({torch.get_num_threads()} threads), float32; "
        f"up to {task.max_text} tokens per caption, 36 regions x 2048 per image; median of {args.repeats} calls; "
        f"load average {os.getloadavg()[0]:.2f}\n"
    )
    print(
        f"{'family':<8} {'width':<6} {'N images':>8} {'captions':>8} {'batch':>6} {'padding':>8} {'pairs':>8} "
        f"{'seconds':>8} {'pairs/s':>9} {'vs first':>8} {'Flickr30k 1k x 5k':>18}"
    )
    first: dict = {}
    for name, width, n, b, padding, pairs, seconds in rows:
        rate = pairs / seconds
        base = first.setdefault((name, width, n, b), rate)
        print(
            f"{name:<8} {width:<6} {n:8d} {CAPTIONS * n:8d} {b:6d} {padding:>8} {pairs:8d} {seconds:8.2f} "
            f"{rate:9.1f} {rate / base:7.2f}x {FLICKR30K_PAIRS / rate / 3600:16.1f} h"
        )


if __name__ == "__main__":
    main()
