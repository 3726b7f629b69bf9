"""Prediction latency: `vltrain predict`'s Python API (`vl_models.predict.Predictor.ask`) in ms
per query, detector and model together, for the tiny shapes detector (``shapes-tiny``, its
packaged weights) and the full VG ResNet-101 C4 detector (``vg-r101``, random weights in the
published shapes: speed does not depend on their values), each at batch 1 (one query) and
batch 16 (16 questions about 16 distinct images in one `ask` call).

Each detector's feature store is made for real: `run_extract` (Ray, `vlprep extract
--images`) on a few images (shapes-world JPEGs, 256x256; photo-like 640x480 JPEGs for the R101),
so `StoreDetector.of(store)` rebuilds its detector from the store's provenance as `vltrain
predict` does (random weights from the recorded seed). The model is built directly, not
fine-tuned (random weights): `model_of` fits the model config to the store's feature width, a
`TransferModel` with the VQA answer head (3,129 answers), and a `Predictor` over it with the
bundled BERT vocab, 20 tokens per question and 36 regions per image.

Per configuration: one warm-up `ask` (not for vg-r101 at batch 16: a whole extraction; the
model is warm from batch 1), then repetitions. "total" is an `ask` with the
predictor's image cache cleared (every image read, decoded and extracted); "images" is the
part of it in the detector's `load` + `extract` (timed inside that same call); "model" is an
`ask` on the same queries with the images cached (tokenization, the task dataset view,
collate, forward, readout: all of `ask` but the detector). Beside the model part, on the very
batch `ask` builds (same tokens, same regions), the bare forward of our model and of
`transformers.LxmertForQuestionAnswering` holding the same weights (the anchor; there is no
runnable anchor for the detector: the HF FRCNN port is a research example, not a package).

The model runs with `--threads` torch threads (2). The detector: the region detectors' fast CPU
path (`pipeline.detect.cpu`, the default) gives the same bits at any thread count, so
`StoreDetector` runs it on every core and its features are still bitwise the store's.

Side by side (``--paths``, batch 1, per detector): today's detector path — the model's modules
(``kernels="torch"``) at the store's actor threads (``--actor-cpus`` of its extract run, 1 by
default), as `vltrain predict` ran it before the fast path, to keep features bitwise the store's
— against the fast one on every core, each `ask` with the image cache cleared, in alternating
order round after round (``--path-rounds``), with the records' agreement.

    python bench/predict.py                 # shapes-tiny (lxmert-small, lxmert-base) and vg-r101 (lxmert-base)
    python bench/predict.py --quick         # shapes-tiny with lxmert-small only: a few seconds
    python bench/predict.py --device cuda
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import ray
import torch
import transformers
from common import make_jpegs
from finetune_step import hf_qa_scores, hf_qa_state_dict

from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
from pipeline.detect.config import BoxCount, ExtractConfig, SelectionConfig
from pipeline.detect.like_store import StoreDetector
from pipeline.detect.run import run_extract
from pipeline.store import FeatureStore
from pipeline.synthetic import write_world
from vl_models import transfer
from vl_models.config import DataSettings
from vl_models.data.tokenize import WordPiece, bundled_bert_vocab
from vl_models.predict import Predictor, TaskHead
from vl_models.transfer.heads import build_transfer_model
from vl_models.transfer.runs import model_of

VQA_ANSWERS = 3129
QUESTIONS = (
    "what color is the object on the left?",
    "how many shapes are in the picture?",
    "is there a red circle next to the square?",
    "what shape is at the top of the image?",
)


def now(device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def make_store(root: Path, detector: str, images: list[Path], args) -> Path:
    """A feature store of `images` extracted by `vlprep extract --images` with `detector`."""
    folder = root / f"{detector}-store-images"
    folder.mkdir()
    for p in images:
        (folder / p.name).write_bytes(p.read_bytes())
    out = root / f"{detector}-store"
    weights = {"weights": shapes_tiny_weights()} if detector == "shapes-tiny" else {"random_weights": True, "seed": 0}
    # shapes-tiny: the demo's 10-20 boxes; vg-r101: LXMERT's fixed 36 (random weights would give BUTD's minimum, 10)
    boxes = "10-20" if detector == "shapes-tiny" else "36"
    selection = SelectionConfig("butd", BoxCount.parse(boxes))
    run_extract(
        ExtractConfig(
            out=out,
            images=folder,
            detector=detector,
            selection=selection,
            device=args.device,
            batch_size=args.extract_batch,
            actor_cpus=args.actor_cpus,
            **weights,
        )
    )
    return out


def build_predictor(store: Path, model: str, device: str) -> tuple[Predictor, object]:
    """(a VQA predictor over `store`'s detector: `model` fitted to the store, random weights; its model config)."""
    answers = [f"answer {i}" for i in range(VQA_ANSWERS)]
    torch.manual_seed(0)
    family, mcfg = model_of(model, None, str(store), len(answers))
    vqa = transfer.get("vqa")
    net = build_transfer_model(family, mcfg, [vqa], [SimpleNamespace(answers=answers)])
    head = TaskHead(task=vqa, answers=answers, settings=DataSettings(max_text=20, max_regions=36))
    predictor = Predictor(
        model=net,
        heads={"vqa": head},
        tokenizer=WordPiece(bundled_bert_vocab()),
        store=FeatureStore.open(store, dtype="float32"),
        detector_of=lambda: StoreDetector.of(store, device=device),
        device=device,
        batch_size=16,
        source="bench",
    )
    return predictor, mcfg


class DetectorClock:
    """Seconds spent in the predictor's detector (`load`: read + decode, `extract`), by wrapping it."""

    def __init__(self, detector: StoreDetector, device: str):
        self.seconds, self.detector = 0.0, detector
        for name in ("load", "extract"):
            inner = getattr(detector, name)

            def timed(*a, _inner=inner, **kw):
                start = now(device)
                try:
                    return _inner(*a, **kw)
                finally:
                    self.seconds += now(device) - start

            setattr(detector, name, timed)

    def stop(self) -> None:
        for name in ("load", "extract"):
            del self.detector.__dict__[name]


def the_batch(predictor: Predictor, queries: list[dict]) -> dict:
    """The batch `ask` forwards for `queries` (their images cached): the same view and loader."""
    view = predictor.view("vqa", queries)
    loader = torch.utils.data.DataLoader(view, batch_sampler=[list(range(len(queries)))])
    return {k: v.to(predictor.device) if torch.is_tensor(v) else v for k, v in next(iter(loader)).items()}


def measure(predictor: Predictor, queries: list[dict], reps: int, model_reps: int, hf, warm: bool) -> dict:
    device, b = predictor.device, len(queries)
    if warm:
        predictor.cache.clear()
        predictor.ask(queries)
    total, images = [], []
    for _ in range(reps):
        predictor.cache.clear()
        clock = DetectorClock(predictor.cache.detector, device)
        start = now(device)
        out = predictor.ask(queries)
        total.append(now(device) - start)
        images.append(clock.seconds)
        clock.stop()
        assert all("answer" in r for r in out), out[:1]
    model = []
    for _ in range(model_reps):
        start = now(device)
        predictor.ask(queries)
        model.append(now(device) - start)
    batch = the_batch(predictor, queries)
    ours_fw, hf_fw = [], []
    with torch.no_grad():
        diff = (predictor.model("vqa", batch).float() - hf_qa_scores(hf, batch).float()).abs().max().item()
        for _ in range(model_reps):  # interleaved
            start = now(device)
            predictor.model("vqa", batch)
            ours_fw.append(now(device) - start)
            start = now(device)
            hf_qa_scores(hf, batch)
            hf_fw.append(now(device) - start)
    ms = {
        "total": statistics.median(total),
        "images": statistics.median(images),
        "model": statistics.median(model),
        "ours forward": statistics.median(ours_fw),
        "hf forward": statistics.median(hf_fw),
    }
    regions = int(batch["visual_mask"].sum(-1).float().mean().item())
    return {
        **{k: v * 1000 / b for k, v in ms.items()},
        "diff": diff,
        "regions": regions,
        "feat": int(batch["visual_feats"].shape[-1]),
    }


def anchor(predictor: Predictor, mcfg, device: str):
    """`transformers.LxmertForQuestionAnswering` holding our predictor's weights."""
    hf = transformers.LxmertForQuestionAnswering(
        transformers.LxmertConfig(**{**mcfg.hf_config(), "num_qa_labels": VQA_ANSWERS})
    )
    hf.load_state_dict(hf_qa_state_dict(predictor.model, "vqa"), strict=True)
    return hf.to(device).eval()


def today_detector(store: Path, device: str, actor_cpus: int) -> StoreDetector:
    """`store`'s detector as `vltrain predict` ran it before the fast CPU path: the model's modules
    at the store's actor threads."""
    detector = StoreDetector.of(store, device=device)
    if detector.extractor.device.type == "cpu":
        detector.extractor.kernels = "torch"  # no longer thread-invariant: StoreDetector sets the threads
        detector.threads = actor_cpus
    return detector


def paths_side_by_side(predictor: Predictor, store: Path, queries: list[dict], rounds: int, args) -> dict:
    """ms per query of `ask` (image cache cleared) with today's detector path and the fast one,
    alternating, `rounds` rounds; and the agreement of their records on the queries' images."""
    detectors = {"today": today_detector(store, args.device, args.actor_cpus), "fast": predictor.cache.detector_of()}
    seconds: dict = {name: [] for name in detectors}
    predictor.cache.detector = detectors["today"]  # its warm-up (the fast one is warm from `measure`)
    predictor.cache.clear()
    predictor.ask(queries)
    for r in range(rounds):
        for name in list(detectors) if r % 2 == 0 else list(detectors)[::-1]:
            predictor.cache.detector = detectors[name]
            predictor.cache.clear()
            start = now(args.device)
            predictor.ask(queries)
            seconds[name].append(now(args.device) - start)
    images = [detectors["fast"].load(q["image"]) for q in queries]
    records = {name: det.extract(images) for name, det in detectors.items()}
    # the records come back as the store gives them (features rounded to its float16): count the
    # float16 steps between the two paths' values
    steps = max(
        float((np.abs(a.features - b.features) / np.spacing(np.abs(a.features).astype(np.float16))).max())
        for a, b in zip(records["today"], records["fast"])
    )
    same = all(np.array_equal(a.boxes, b.boxes) for a, b in zip(records["today"], records["fast"]))
    predictor.cache.detector = detectors["fast"]
    return {
        "ms": {name: [1000 * t / len(queries) for t in times] for name, times in seconds.items()},
        "threads": {"today": args.actor_cpus, "fast": detectors["fast"].threads},
        "boxes equal": same,
        "features steps": steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the model (the detector: the store's)")
    parser.add_argument("--detectors", default="shapes-tiny,vg-r101")
    parser.add_argument("--shapes-models", default="lxmert-small,lxmert-base")
    parser.add_argument("--r101-models", default="lxmert-base")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--reps", type=int, default=3, help="cleared-cache asks per shapes-tiny configuration")
    parser.add_argument("--r101-reps", type=int, default=1, help="cleared-cache asks per vg-r101 configuration")
    parser.add_argument("--model-reps", type=int, default=10, help="cached-image asks and forwards per configuration")
    parser.add_argument("--extract-batch", type=int, default=1, help="the stores' --batch-size (the detector's)")
    parser.add_argument("--actor-cpus", type=int, default=1, help="the stores' --actor-cpus (the detector's threads)")
    parser.add_argument("--quick", action="store_true", help="smoke run: shapes-tiny with lxmert-small only")
    parser.add_argument(
        "--paths", action=argparse.BooleanOptionalAction, default=True, help="today's detector path vs the fast one"
    )
    parser.add_argument("--path-rounds", type=int, default=4, help="alternating rounds of the two paths (batch 1)")
    args = parser.parse_args()
    if args.quick:
        args.detectors, args.shapes_models, args.reps, args.model_reps = "shapes-tiny", "lxmert-small", 2, 3
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    batches = [int(b) for b in args.batches.split(",")]
    detectors = args.detectors.split(",")
    rows, paths = [], {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        images: dict[str, list[Path]] = {}
        if "shapes-tiny" in detectors:
            write_world(root / "world", max(batches) + 4, 0)
            images["shapes-tiny"] = sorted((root / "world" / "images").glob("*.jpg"))
        if "vg-r101" in detectors:
            (root / "photos").mkdir()
            for i, data in enumerate(make_jpegs(max(batches) + 2)):
                (root / "photos" / f"photo_{i:03d}.jpg").write_bytes(data)
            images["vg-r101"] = sorted((root / "photos").glob("*.jpg"))
        stores = {}
        for det in detectors:
            start = time.perf_counter()
            stores[det] = make_store(root, det, images[det][:2], args)
            print(f"{det}: store of 2 images extracted in {time.perf_counter() - start:.1f} s", flush=True)
        if ray.is_initialized():
            ray.shutdown()  # nothing of Ray's beside the timings
        torch.set_num_threads(args.threads)
        for det in detectors:
            models = (args.shapes_models if det == "shapes-tiny" else args.r101_models).split(",")
            reps = args.reps if det == "shapes-tiny" else args.r101_reps
            queries = [{"image": str(p), "question": QUESTIONS[i % len(QUESTIONS)]} for i, p in enumerate(images[det])]
            queries = queries[-max(batches) :]  # images the store does not hold
            for name in models:
                predictor, mcfg = build_predictor(stores[det], name, args.device)
                hf = anchor(predictor, mcfg, args.device)
                start = now(args.device)
                predictor.cache.detector = predictor.cache.detector_of()
                load_s = now(args.device) - start
                for i, b in enumerate(batches):
                    # vg-r101: the warm-up is a whole extraction per image; batch 16 runs cold (its
                    # model part is a small share of it) and its model rows are timed warm anyway
                    warm = det == "shapes-tiny" or i == 0
                    r = measure(predictor, queries[:b], reps, args.model_reps, hf, warm)
                    rows.append((det, name, b, load_s, r))
                    print(
                        f"  {det} + {name}, batch {b}: total {r['total']:.1f} ms/query, images {r['images']:.1f}, "
                        f"model {r['model']:.1f}",
                        flush=True,
                    )
                if args.paths and det not in paths and args.device == "cpu":
                    paths[det] = paths_side_by_side(predictor, stores[det], queries[:1], args.path_rounds, args)
                    paths[det]["model"] = name
                    print(f"  {det}: detector paths side by side {paths[det]['ms']}", flush=True)
                del predictor, hf

    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(
        f"\ndevice: {where}; torch {torch.__version__} (model: {args.threads} threads; detector: the store's "
        f"{args.actor_cpus}), transformers {transformers.__version__}; float32; {VQA_ANSWERS} answers, 20 tokens, "
        f"up to 36 regions; median of the repetitions; ms per query\n"
    )
    print(
        f"{'detector':<12} {'model':<13} {'batch':>5} {'regions':>7} {'total':>9} {'images':>9} {'model':>8} "
        f"{'fwd ours':>9} {'fwd HF':>8} {'fwd ours/HF':>11} {'model/HF':>8} {'|diff|':>8} {'det load s':>10}"
    )
    for det, name, b, load_s, r in rows:
        print(
            f"{det:<12} {name:<13} {b:5d} {r['regions']:7d} {r['total']:9.1f} {r['images']:9.1f} {r['model']:8.2f} "
            f"{r['ours forward']:9.2f} {r['hf forward']:8.2f} {r['ours forward'] / r['hf forward']:10.2f}x "
            f"{r['model'] / r['hf forward']:7.2f}x "
            f"{r['diff']:8.1e} {load_s:10.2f}"
        )
    print(
        "\ntotal: ask with the image cache cleared; images: its detector part (read, decode, extract); "
        "model: ask on cached images; fwd: the bare forward on ask's batch (ours, and transformers' with the same "
        "weights); |diff|: the largest difference of their answer logits; det load s: StoreDetector.of"
    )
    if paths:
        print(
            f"\ndetector paths side by side, batch 1 (ask with the image cache cleared, ms per query; alternating "
            f"order, {args.path_rounds} rounds; load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} "
            "at the end): today = the model's modules at the store's actor threads, fast = `pipeline.detect.cpu` "
            "on every core"
        )
        for det, r in paths.items():
            today, fast = r["ms"]["today"], r["ms"]["fast"]
            print(
                f"  {det} + {r['model']}: today ({r['threads']['today']} thread) {statistics.median(today):.1f} "
                f"(by round {', '.join(f'{t:.0f}' for t in today)}), fast ({r['threads']['fast']} threads) "
                f"{statistics.median(fast):.1f} (by round {', '.join(f'{t:.0f}' for t in fast)}); "
                f"today / fast {statistics.median(today) / statistics.median(fast):.2f}x "
                f"(best rounds {min(today) / min(fast):.2f}x); boxes {'equal' if r['boxes equal'] else 'DIFFER'}, "
                f"features (as the store returns them) at most {r['features steps']:.0f} float16 step apart"
            )


if __name__ == "__main__":
    main()
