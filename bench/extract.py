"""Region-feature extraction speed: the full VG ResNet-101 config.

Measured in one run (`--parts`; all by default):
  in_process  the extractor in this process (JPEG decode + BUTD preprocessing + detector +
              BUTD per-class NMS selection + attributes), batch 1 and batched;
  end_to_end  `vlprep extract --images FOLDER` (Ray actor, store writing), as users run it;
  hf          side by side with the HF research port of the same model (transformers'
              examples/research_projects/lxmert: modeling_frcnn.GeneralizedRCNN,
              processing_image.Preprocess, utils.Config — not in the pip package; point
              `--hf-frcnn-dir` or VLPREP_HF_FRCNN_DIR at that folder of a transformers
              checkout). The same random weights in both: our `random_detector` (seed 0) written by
              `save_detector_hf` as the port's pytorch_model.bin, loaded by their
              `from_pretrained` and by our `load_detector`. Like for like: their setting,
              36 boxes by max-class NMS (our ``maxnms`` policy at 36; their MIN/MAX_DETECTIONS
              36 with our NMS threshold ladder), batch 1 (their output helper `norm_box`
              assumes one image), decoded RGB arrays in (their input: the BGR tensor their
              FORMAT "BGR" means). Their Preprocess resizes the float image bilinearly at
              detectron2's sizes; our ``caffe`` preprocessing does the same at these 640x480
              inputs (600x800 both ways). Outputs are compared (boxes, features, labels), then
              both are timed in alternating order, round after round;
  batching    the backbone batched over images: COCO-like mixed sizes (`MIXED_SIZES`) at
              batch 1 / 4 / 8, identical resized sizes stacked (exact; the default), and with
              `--pad-tolerance` (similar aspect ratios padded to one size): images/s, backbone
              runs, and how much padding changes the padded images' regions;
  cpu         the VG R101 on a CPU, today's path (the model's modules: ``kernels="torch"``) and
              the fast one (``kernels="fast"``, the default on a CPU: `pipeline.detect.cpu`, res5 in
              oneDNN over units of ten proposals on worker threads, the same bits at any thread
              count) side by side, batch 1, BUTD's default selection, in alternating order round
              after round: each at one thread (what `vltrain predict` and `vlprep extract`'s actors
              ran with: one CPU per actor) and at every core. With the FLOPs per image (counted on
              today's path: the same multiply-adds), the time by stage (backbone, RPN, ROI head,
              the rest: predictor, selection, attributes), the agreement of the two paths'
              records, and the machine's float32 matmul peak at each thread count (MKL's sgemm,
              torch.mm, and oneDNN's, a 1x1 convolution: a large GEMM), so that the distance to
              the limit is on the page;
  backends    the extraction backends side by side on the same 640x480 JPEGs (600x800 after
              each backend's resize) in this process, batch 1, alternating order round after
              round: `vg-r101` (BUTD, its default selection), `vinvl-x152c4` (its default: per-class
              NMS, proposal boxes), `grid-x152` (the whole C5 map) and `grid-x152` pooled
              (`--grid-pool`, 8x8), plus `--backends-extra` configs (grid-r50, grid-x101).
              Images/s, s/image, regions per image and GFLOP per image (FlopCounterMode over the
              warm-up image), and the ratios grid-x152 / vinvl-x152c4 (grid vs region features
              at the same ResNeXt-152 32x8d) and vinvl-x152c4 / vg-r101 (VinVL vs BUTD per image).
Images are photo-like JPEGs; weights are random in the full published shapes (the public
weights cannot be fetched here — speed does not depend on the values; box counts use the
BUTD fallback to MIN).

No runnable anchor besides the HF port exists on this machine (detectron2 cannot be
installed; the Caffe code needs its own build), so other reference points are quoted from
users' reports: py-bottom-up-attention ~2.7 s per 8 images on a T4 (~3 images/s), Caffe < 1 s
per image. Target on an H200: >= 30 images/s end to end.

    python bench/extract.py                       # CPU
    python bench/extract.py --parts hf,batching --hf-frcnn-dir ~/transformers/examples/research_projects/lxmert
    python bench/extract.py --device cuda --fp16 --n 256 --batch-sizes 1,8 --parts in_process,end_to_end
    python bench/extract.py --parts backends      # CPU: 2 images x 2 rounds, ~3 min on 2 cores
    python bench/extract.py --parts cpu           # today's CPU path vs the fast one: 2 images x 2 rounds, ~8 min
    python bench/extract.py --parts backends --device cuda --fp16 --backends-n 32 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from common import MIXED_SIZES, make_jpegs
from torch.utils.flop_counter import FlopCounterMode

from pipeline.detect.backends import build_extractor, load_model, open_extractor
from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.extractor import backbone_groups
from pipeline.detect.backends.butd_c4.model import VGDetector
from pipeline.detect.backends.butd_c4.selection import select_maxnms
from pipeline.detect.backends.butd_c4.weights import save_detector_hf
from pipeline.detect.config import BoxCount, GridPool, SelectionConfig
from pipeline.detect.preprocess import prepare_image
from pipeline.detect.resnet import Bottleneck
from pipeline.images import load_rgb

PARTS = ("in_process", "end_to_end", "hf", "batching", "backends", "cpu")
HF_DIR_ENV = "VLPREP_HF_FRCNN_DIR"


def in_process(device: str, fp16: bool, n: int, batch: int, boxes: str) -> float:
    selection = SelectionConfig("butd", BoxCount.parse(boxes))
    ex = open_extractor("vg-r101", seed=0, selection=selection, device=device, fp16=fp16)
    jpegs = make_jpegs(min(n, 32))
    ex([load_rgb(jpegs[0])], ["warmup"])  # first call: allocator and kernels
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(0, n, batch):
        chunk = [jpegs[j % len(jpegs)] for j in range(i, min(n, i + batch))]
        ex([load_rgb(b) for b in chunk], [f"im{j}" for j in range(len(chunk))])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def end_to_end(device: str, fp16: bool, n: int, batch: int, boxes: str, workers: int) -> tuple[float, float]:
    root = Path(tempfile.mkdtemp(prefix="bench_extract_"))
    try:
        folder = root / "images"
        folder.mkdir()
        for i, data in enumerate(make_jpegs(min(n, 64))):
            (folder / f"{i:05d}.jpg").write_bytes(data)
        for i in range(64, n):
            shutil.copy(folder / f"{i % 64:05d}.jpg", folder / f"{i:05d}.jpg")
        cmd = [
            sys.executable,
            "-m",
            "pipeline.cli",
            "-q",
            "extract",
            "--images",
            str(folder),
            "--random-weights",
            "--boxes",
            boxes,
            "--batch-size",
            str(batch),
            "--device",
            device,
            "--out",
            str(root / "store"),
            "--workers",
            str(workers),
            "--shard-size",
            str(max(batch, 32)),
        ] + (["--fp16"] if fp16 else [])
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"vlprep extract failed:\n{proc.stderr[-3000:]}")
        return n / wall, wall
    finally:
        shutil.rmtree(root, ignore_errors=True)


def random_detector(cfg: DetectorConfig, seed: int = 0) -> VGDetector:
    """A random VGDetector with O(1) region features. The default initialization tames a
    deep random tower by shrinking every projection shortcut, which leaves ~1e-4 features on
    which all classes score alike — box order would then hang on float rounding. Shortcut
    norms at 1 give decisive random predictions, so outputs of two implementations compare."""
    torch.manual_seed(seed)
    model = VGDetector(cfg)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Bottleneck) and module.shortcut is not None:
                module.shortcut.norm.weight.fill_(1.0)
    return model


# -- the HF research port, side by side -------------------------------------------


def import_hf_port(folder: Path):
    """(GeneralizedRCNN, Config, Preprocess, placeholders) from the port's folder. Its
    utils.py imports cv2 and wget at module level, for reading image files and URLs, which
    this bench never asks of it: where they are not installed, empty placeholder modules
    stand in (named in `placeholders`)."""
    for name in ("modeling_frcnn.py", "processing_image.py", "utils.py"):
        if not (folder / name).is_file():
            sys.exit(
                f"--hf-frcnn-dir {folder}: no {name}; point it at a transformers checkout's "
                "examples/research_projects/lxmert"
            )
    placeholders = [m for m in ("cv2", "wget") if importlib.util.find_spec(m) is None]
    for name in placeholders:
        sys.modules[name] = types.ModuleType(name)
    if "utils" in sys.modules:
        sys.exit("a module named 'utils' is already imported; the HF port's own utils.py could not load")
    sys.path.insert(0, str(folder))
    modeling, processing, utils = (importlib.import_module(m) for m in ("modeling_frcnn", "processing_image", "utils"))
    return modeling.GeneralizedRCNN, utils.Config, processing.Preprocess, placeholders


def hf_config(cfg: DetectorConfig, boxes: int, device: str = "cpu") -> dict:
    """The port's config (the keys of the hub's frcnn config.yaml that its code reads) with
    the values of our `cfg`, selecting `boxes` regions with our max-class NMS ladder."""
    depth = {(3, 4, 6, 3): 50, (3, 4, 23, 3): 101, (3, 8, 36, 3): 152}[tuple(cfg.blocks)]
    ladder = list(inspect.signature(select_maxnms).parameters["thresholds"].default)
    return {
        "MODEL": {
            "DEVICE": device,
            "MAX_POOL": cfg.caffe_maxpool,
            "PIXEL_MEAN": list(cfg.pixel_mean_bgr),
            "PIXEL_STD": [1.0, 1.0, 1.0],
        },
        "INPUT": {"FORMAT": "BGR", "MIN_SIZE_TEST": cfg.min_size, "MAX_SIZE_TEST": cfg.max_size},
        "SIZE_DIVISIBILITY": 0,
        "PAD_VALUE": 0.0,
        "MIN_DETECTIONS": boxes,
        "MAX_DETECTIONS": boxes,
        "BACKBONE": {"FREEZE_AT": 2},
        "RESNETS": {
            "DEPTH": depth,
            "NORM": "BN",
            "NUM_GROUPS": 1,
            "WIDTH_PER_GROUP": cfg.bottleneck_channels,
            "OUT_FEATURES": ["res4"],
            "RES2_OUT_CHANNELS": cfg.res2_out_channels,
            "RES5_DILATION": 1,
            "STEM_OUT_CHANNELS": cfg.stem_channels,
            "STRIDE_IN_1X1": cfg.stride_in_1x1,
        },
        "ANCHOR_GENERATOR": {
            "SIZES": [list(cfg.anchor_sizes)],
            "ASPECT_RATIOS": [list(cfg.anchor_ratios)],
            "OFFSET": 0.0,
        },
        "PROPOSAL_GENERATOR": {"HIDDEN_CHANNELS": cfg.rpn_channels, "MIN_SIZE": cfg.rpn_min_size},
        "RPN": {
            "IN_FEATURES": ["res4"],
            "NMS_THRESH": cfg.rpn_nms,
            "PRE_NMS_TOPK_TEST": cfg.rpn_pre_nms_topk,
            "POST_NMS_TOPK_TEST": cfg.rpn_post_nms_topk,
            "PRE_NMS_TOPK_TRAIN": 12000,
            "POST_NMS_TOPK_TRAIN": 2000,
            "BATCH_SIZE_PER_IMAGE": 256,
            "POSITIVE_FRACTION": 0.5,
            "SMOOTH_L1_BETA": 0.0,
            "LOSS_WEIGHT": 1.0,
            "BOUNDARY_THRESH": -1,
            "BBOX_REG_WEIGHTS": [1.0, 1.0, 1.0, 1.0],
            "IOU_THRESHOLDS": [0.3, 0.7],
            "IOU_LABELS": [0, -1, 1],
        },
        "ROI_HEADS": {
            "IN_FEATURES": ["res4"],
            "NUM_CLASSES": cfg.num_classes,
            "NMS_THRESH_TEST": ladder,
            "SCORE_THRESH_TEST": 0.2,
            "POSITIVE_FRACTION": 0.25,
            "PROPOSAL_APPEND_GT": True,
            "IOU_THRESHOLDS": [0.5],
            "IOU_LABELS": [0, 1],
        },
        "ROI_BOX_HEAD": {
            "ATTR": cfg.num_attributes > 0,
            "NUM_ATTRS": cfg.num_attributes,
            "BBOX_REG_WEIGHTS": list(cfg.bbox_reg_weights),
            "CLS_AGNOSTIC_BBOX_REG": False,
            "POOLER_RESOLUTION": cfg.pooler_resolution,
            "POOLER_SAMPLING_RATIO": 0,
            "RES5HALVE": cfg.res5_dilation == 1,
            "SMOOTH_L1_BETA": 0.0,
        },
    }


def timed_rounds(sides: dict, inputs: list, rounds: int, per_round: Optional[dict] = None) -> tuple[dict, dict]:
    """(seconds per side, first round's outputs per side): each side runs every input, in
    alternating side order round after round so that all see the same machine load. Each
    round's seconds are appended to ``per_round[side]`` when a dict is given."""
    names = list(sides)
    seconds = dict.fromkeys(names, 0.0)
    outputs: dict = {}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            results = [out for x in inputs for out in sides[name](x)]
            elapsed = time.perf_counter() - start
            seconds[name] += elapsed
            if per_round is not None:
                per_round.setdefault(name, []).append(elapsed)
            outputs.setdefault(name, results)
    return seconds, outputs


def side_by_side(folder: Path, n: int, rounds: int, device: str = "cpu", boxes: int = 36) -> None:
    GeneralizedRCNN, Config, Preprocess, placeholders = import_hf_port(folder)
    cfg = DetectorConfig.load("vg-r101")
    root = Path(tempfile.mkdtemp(prefix="bench_hf_frcnn_"))
    try:
        save_detector_hf(random_detector(cfg), root / "pytorch_model.bin")
        ours_model, _ = load_model("vg-r101", root / "pytorch_model.bin")
        hf_cfg = Config(hf_config(cfg, boxes, device))
        with contextlib.redirect_stdout(io.StringIO()):  # its loader prints; it loads strictly
            theirs = GeneralizedRCNN.from_pretrained(str(root), config=hf_cfg)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours = build_extractor(
        "vg-r101", ours_model, selection=SelectionConfig("maxnms", BoxCount(boxes, boxes)), device=device
    )
    preprocess = Preprocess(hf_cfg)

    def run_theirs(rgb):
        images, sizes, scales_yx = preprocess(torch.from_numpy(np.ascontiguousarray(rgb[:, :, ::-1])))
        return [
            theirs(
                images, sizes, scales_yx=scales_yx, padding="max_detections", max_detections=boxes, return_tensors="pt"
            )
        ]

    rgbs = [load_rgb(b) for b in make_jpegs(n)]
    sides = {"ours": lambda rgb: ours([rgb], ["x"]), "HF port": run_theirs}
    for run in sides.values():
        run(rgbs[0])  # warm-up: allocator and kernels
    seconds, outputs = timed_rounds(sides, rgbs, rounds)

    print(
        f"\nside by side with the HF research port ({folder}), batch 1, {boxes} boxes (max-class NMS), "
        f"same random weights, {n} photo-like 640x480 JPEGs x {rounds} rounds, alternating order"
        + (f"; placeholder modules for its unused imports: {', '.join(placeholders)}" if placeholders else "")
    )
    for mine, hf in zip(outputs["ours"], outputs["HF port"]):
        hf = {k: v.cpu() for k, v in hf.items()}
        hf_boxes, hf_feat = hf["boxes"][0].numpy(), hf["roi_features"][0].numpy()
        if mine.boxes.shape != hf_boxes.shape:
            print(f"  outputs differ in shape: ours {mine.boxes.shape}, HF {hf_boxes.shape}")
            continue
        print(
            f"  agreement: max |box diff| {np.abs(mine.boxes - hf_boxes).max():.2e} px, max |feature diff| "
            f"{np.abs(mine.features - hf_feat).max():.1e} (features up to {np.abs(hf_feat).max():.2f}), "
            f"objects {np.mean(mine.objects_id == hf['obj_ids'][0].numpy()):.0%} equal "
            f"(max |conf diff| {np.abs(mine.objects_conf - hf['obj_probs'][0].numpy()).max():.1e}), "
            f"attributes {np.mean(mine.attrs_id == hf['attr_ids'][0].numpy()):.0%} equal"
        )
    rates = {name: rounds * n / sec for name, sec in seconds.items()}
    for name, rate in rates.items():
        print(f"  {name:8s}: {rate:6.3f} images/s ({1 / rate:.2f} s/image)")
    print(f"  ratio ours / HF port: {rates['ours'] / rates['HF port']:.3f}x")


# -- the backbone batched over images -----------------------------------------------


def batching(
    n: int, batch_sizes: list[int], tolerance: float, rounds: int, boxes: str, device: str = "cpu", fp16: bool = False
) -> None:
    cfg = DetectorConfig.load("vg-r101")
    model = random_detector(cfg)
    selection = SelectionConfig("butd", BoxCount.parse(boxes))
    extractors = {
        tol: build_extractor("vg-r101", model, selection=selection, device=device, fp16=fp16, pad_tolerance=tol)
        for tol in (0.0, tolerance)
    }
    rgbs = [load_rgb(b) for b in make_jpegs(n, MIXED_SIZES)]
    sizes = [(r.new_height, r.new_width) for r in (prepare_image(rgb, cfg)[1] for rgb in rgbs)]
    modes = [(0.0, b) for b in batch_sizes] + [(tolerance, b) for b in batch_sizes if b > 1 and tolerance > 0]

    def chunks(b):
        return [list(range(i, min(n, i + b))) for i in range(0, n, b)]

    def extract_all(mode):
        tol, b = mode
        return lambda _: [
            rec for chunk in chunks(b) for rec in extractors[tol]([rgbs[i] for i in chunk], [f"im{i}" for i in chunk])
        ]

    extractors[0.0](rgbs[:1], ["warmup"])
    seconds, outputs = timed_rounds({mode: extract_all(mode) for mode in modes}, [None], rounds)

    print(
        f"\nbackbone batching: {n} photo-like JPEGs of mixed sizes "
        f"({', '.join(f'{h}x{w}' for h, w in sizes)} after the BUTD resize), BUTD boxes {boxes}, "
        f"{rounds} rounds, alternating order"
    )
    base = rounds * n / seconds[(0.0, 1)] if (0.0, 1) in seconds else None
    for tol, b in modes:
        runs = sum(len(backbone_groups([sizes[i] for i in chunk], tol)) for chunk in chunks(b))
        rate = rounds * n / seconds[(tol, b)]
        label = "exact (same size)" if tol == 0 else f"padded (tolerance {tol:g})"
        print(
            f"  {label:26s} batch {b}: {rate:6.3f} images/s, {runs} backbone runs for {n} images"
            + (f", {rate / base:.3f}x batch 1" if base else "")
        )
    reference = outputs.get((0.0, 1))
    if reference is None:
        return
    for tol, b in modes:
        if b == 1:
            continue
        padded = {
            chunk[k]
            for chunk in chunks(b)
            for group in backbone_groups([sizes[i] for i in chunk], tol)
            for k in group
            if sizes[chunk[k]] != (max(sizes[chunk[j]][0] for j in group), max(sizes[chunk[j]][1] for j in group))
        }
        for title, images in (("unpadded", sorted(set(range(n)) - padded)), ("padded", sorted(padded))):
            if images:
                kept, total, rel = region_changes(
                    [reference[i] for i in images], [outputs[(tol, b)][i] for i in images]
                )
                print(
                    f"  {'exact' if tol == 0 else 'padded groups'} batch {b} vs batch 1, {len(images)} {title} "
                    f"images: {kept} of {total} boxes identical, their features within {rel:.1e} (max relative)"
                )


def region_changes(reference: list, records: list) -> tuple[int, int, float]:
    """(boxes of `reference` found identically in `records`, all boxes, the largest relative
    feature difference over the boxes found), image by image."""
    kept, total, rel = 0, 0, 0.0
    for ref, rec in zip(reference, records):
        total += len(ref.boxes)
        for j, row in enumerate(ref.boxes):
            match = np.flatnonzero((rec.boxes == row).all(axis=1))
            if len(match):
                kept += 1
                diff = np.abs(ref.features[j] - rec.features[match[0]]).max()
                rel = max(rel, float(diff / max(np.abs(ref.features[j]).max(), 1e-12)))
    return kept, total, rel


# -- the extraction backends side by side -----------------------------------------

GRID_VS_REGION = ("grid-x152", "vinvl-x152c4")  # the same ResNeXt-152 32x8d backbone
VINVL_VS_BUTD = ("vinvl-x152c4", "vg-r101")


def backend_sides(grid_pool: GridPool, extra: list[str]) -> dict[str, tuple[str, dict]]:
    """label -> (detector config, the backend's options), each backend at its default selection."""
    sides = {
        "vg-r101": ("vg-r101", {}),
        "vinvl-x152c4": ("vinvl-x152c4", {}),
        "grid-x152": ("grid-x152", {}),
        f"grid-x152 pool {grid_pool}": ("grid-x152", {"grid_pool": grid_pool}),
    }
    sides.update({name: (name, {}) for name in extra})
    return sides


def count_flops(run, rgb) -> tuple[list, float, dict[str, float]]:
    """(`run(rgb)`'s output, its FLOPs (2 per multiply-add; convolutions and matrix products,
    as FlopCounterMode counts them: not NMS or ROIAlign), FLOPs per top-level module called)."""
    with FlopCounterMode(display=False, depth=1) as counter:
        out = run(rgb)
    per_module = {name: float(sum(ops.values())) for name, ops in counter.get_flop_counts().items() if "." not in name}
    per_module.pop("Global", None)
    return out, float(counter.get_total_flops()), per_module


def module_paths(model: torch.nn.Module, called: list[str]) -> dict[str, str]:
    """FlopCounterMode's top-level names (the class names of the modules an extractor called
    directly) -> where those modules sit in `model`: the common dotted prefix of the modules of
    that class that are not inside another called module (``Sequential`` -> ``roi_heads.res5``,
    not the backbone's stages); the class name when none is found."""
    named = [(path, type(m).__name__) for path, m in model.named_modules()]
    outer = [path for path, cls in named if cls in called]
    out = {}
    for name in called:
        paths = [
            path
            for path, cls in named
            if cls == name and path and not any(path.startswith(o + ".") for o in outer if o and o != path)
        ]
        if not paths:
            out[name] = name
            continue
        prefix = paths[0].split(".")
        for path in paths[1:]:
            parts = path.split(".")
            k = 0
            while k < min(len(prefix), len(parts)) and prefix[k] == parts[k]:
                k += 1
            prefix = prefix[:k]
        out[name] = ".".join(prefix) or name
    return out


def backends(n: int, rounds: int, grid_pool: GridPool, extra: list[str], device: str = "cpu", fp16: bool = False):
    cuda = device.startswith("cuda")
    rgbs = [load_rgb(b) for b in make_jpegs(n)]
    extractors, sides, flops, modules, params = {}, {}, {}, {}, {}
    for label, (detector, options) in backend_sides(grid_pool, extra).items():
        ex = open_extractor(detector, seed=0, device=device, fp16=fp16, **options)
        extractors[label] = ex
        params[label] = sum(p.numel() for p in ex.model.parameters())

        def run(rgb, ex=ex):
            out = ex([rgb], ["x"])
            if cuda:
                torch.cuda.synchronize()
            return out

        sides[label] = run
        _, flops[label], modules[label] = count_flops(run, rgbs[0])  # the warm-up image, counted
    per_round: dict[str, list[float]] = {}
    seconds, outputs = timed_rounds(sides, rgbs, rounds, per_round)

    print(
        f"\nextraction backends side by side: {n} photo-like 640x480 JPEGs (600x800 after the resize) x "
        f"{rounds} rounds, batch 1, alternating order, {torch.get_num_threads()} torch threads, random weights "
        "(seed 0), each warmed up on one image (FLOPs counted there)"
    )
    print(
        f"  {'backend':26s} {'images/s':>9s} {'s/image':>8s} {'by round':>14s} {'regions':>8s} {'GFLOP/image':>12s} "
        f"{'params':>8s}"
    )
    rates = {}
    for label in sides:
        rates[label] = rounds * n / seconds[label]
        counts = [len(rec.boxes) for rec in outputs[label]]
        regions = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
        by_round = ", ".join(f"{sec / n:.2f}" for sec in per_round[label])
        print(
            f"  {label:26s} {rates[label]:9.3f} {1 / rates[label]:8.2f} {by_round:>14s} {regions:>8s} "
            f"{flops[label] / 1e9:12.1f} {params[label] / 1e6:7.1f}M"
        )
    for label in sides:
        where = module_paths(extractors[label].model, list(modules[label]))
        parts = ", ".join(f"{where[name]} {value / 1e9:.1f}" for name, value in modules[label].items())
        print(f"  GFLOP by module called, {label}: {parts}")
    for (a, b), title in (
        (GRID_VS_REGION, "grid vs region features at the same backbone (ResNeXt-152 32x8d)"),
        (VINVL_VS_BUTD, "VinVL vs BUTD per image"),
    ):
        best = min(per_round[b]) / min(per_round[a])
        print(
            f"  {title}: {a} / {b} = {rates[a] / rates[b]:.3f}x images/s (best rounds: {best:.3f}x); "
            f"FLOPs per image {a} / {b} = {flops[a] / flops[b]:.3f}x"
        )
    at_minimum = [
        label
        for label, ex in extractors.items()
        if getattr(ex, "selection", None) is not None
        and all(len(rec.boxes) == ex.selection.boxes.min for rec in outputs[label])
    ]
    if at_minimum:
        print(
            f"  random weights: {', '.join(at_minimum)} kept the minimum box count on every image (no class "
            "reaches the score threshold, so the selection falls back to its minimum); their res5 head still "
            "runs on every RPN proposal, as with trained weights, which keep more boxes (up to the maximum)"
        )
    print(f"  peak RSS of this process so far: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if cuda:
        print(f"  peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MB")


# -- today's CPU path against the fast one --------------------------------------------


def matmul_peak(threads: int, size: int = 4096, repeats: int = 4) -> dict[str, float]:
    """GFLOP/s of a large float32 GEMM at `threads` torch threads, best of `repeats`: MKL's
    (``torch.mm``, size x size x size) and oneDNN's (a 1x1 convolution of a channels-last
    (1, size/2, 64, 64) map to size/2 channels, the prepared weights of the fast path: a
    4096 x size/2 x size/2 GEMM)."""
    from pipeline.detect.cpu import FusedConv, onednn

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = {}
        a, b = torch.randn(size, size), torch.randn(size, size)
        best = min(_seconds(lambda: torch.mm(a, b)) for _ in range(repeats + 1))
        out["MKL sgemm (torch.mm)"] = 2 * size**3 / best / 1e9
        if onednn():
            c = size // 2
            conv = torch.nn.Conv2d(c, c, 1, bias=False)
            x = torch.randn(1, c, 64, 64).contiguous(memory_format=torch.channels_last)
            fused = FusedConv(conv, x.shape)
            with torch.no_grad():
                best = min(_seconds(lambda: fused(x)) for _ in range(repeats + 1))
            out["oneDNN (1x1 convolution)"] = 2 * 64 * 64 * c * c / best / 1e9
        return out
    finally:
        torch.set_num_threads(saved)


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class StageClock:
    """Seconds an extractor spends in its backbone, RPN and ROI head, by wrapping them."""

    STAGES = {"backbone": "backbone_features", "RPN": "proposals", "ROI head": "region_features"}

    def __init__(self, ex):
        self.ex, self.seconds = ex, dict.fromkeys(self.STAGES, 0.0)
        for stage, method in self.STAGES.items():
            inner = getattr(ex, method)

            def timed(*a, _inner=inner, _stage=stage, **kw):
                start = time.perf_counter()
                try:
                    return _inner(*a, **kw)
                finally:
                    self.seconds[_stage] += time.perf_counter() - start

            setattr(ex, method, timed)

    def stop(self) -> None:
        for method in self.STAGES.values():
            del self.ex.__dict__[method]


def cpu_paths(n: int, rounds: int, all_threads: int) -> None:
    """The VG R101 at BUTD's default selection, today's CPU path against the fast one (see the
    module doc), batch 1, on the same `n` photo-like JPEGs, alternating order, `rounds` rounds."""
    model = random_detector(DetectorConfig.load("vg-r101"))
    today = build_extractor("vg-r101", model, kernels="torch")
    fast = build_extractor("vg-r101", model, kernels="fast")
    counts = sorted({1, all_threads})

    def side(ex, threads):
        def run(rgb):
            saved = torch.get_num_threads()
            torch.set_num_threads(threads)  # today's path runs at the caller's count; the fast one at one
            ex.threads = threads  # the fast path's workers
            try:
                return ex([rgb], ["x"])
            finally:
                torch.set_num_threads(saved)

        return run

    sides = {}
    for threads in counts:
        sides[f"today, {threads} thread{'s' * (threads > 1)}"] = side(today, threads)
        sides[f"fast, {threads} thread{'s' * (threads > 1)}"] = side(fast, threads)
    rgbs = [load_rgb(b) for b in make_jpegs(n)]
    load = [os.getloadavg()[0]]
    _, flops, modules = count_flops(sides["today, 1 thread"], rgbs[0])  # also the warm-up of today's path
    sides["fast, 1 thread"](rgbs[0])  # the fast path's warm-up: weights prepared, oneDNN primitives made
    per_round: dict[str, list[float]] = {}
    seconds, outputs = timed_rounds(sides, rgbs, rounds, per_round)
    load.append(os.getloadavg()[0])
    stages = {}
    for name, ex, threads in (("today", today, 1), ("fast", fast, all_threads)):
        clock = StageClock(ex)
        start = time.perf_counter()
        side(ex, threads)(rgbs[0])
        total = time.perf_counter() - start
        clock.stop()
        stages[f"{name}, {threads} thread{'s' * (threads > 1)}"] = {
            **clock.seconds,
            "rest": total - sum(clock.seconds.values()),
            "total": total,
        }
    peaks = {threads: matmul_peak(threads) for threads in counts}
    load.append(os.getloadavg()[0])

    print(
        f"\nVG R101 on a CPU, today's path vs the fast one: {n} photo-like 640x480 JPEGs (600x800 after the "
        f"resize) x {rounds} rounds, batch 1, BUTD 10-100 boxes, alternating order; random weights (seed 0); "
        f"load average {load[0]:.2f} at the start, {load[1]:.2f} after the rounds, {load[2]:.2f} at the end"
    )
    print(f"  {'path':20s} {'images/s':>9s} {'s/image':>8s} {'by round':>16s} {'GFLOP/s':>8s}")
    rates = {}
    for label in sides:
        rates[label] = rounds * n / seconds[label]
        by_round = ", ".join(f"{sec / n:.2f}" for sec in per_round[label])
        print(
            f"  {label:20s} {rates[label]:9.4f} {1 / rates[label]:8.2f} {by_round:>16s} "
            f"{flops * rates[label] / 1e9:8.1f}"
        )
    top = f"{all_threads} thread{'s' * (all_threads > 1)}"
    for a, b, title in (
        (f"fast, {top}", "today, 1 thread", "vltrain predict / one-CPU actors (today at 1 thread, fast on every core)"),
        (f"fast, {top}", f"today, {top}", "the same threads (every core)"),
        ("fast, 1 thread", "today, 1 thread", "the same threads (one)"),
    ):
        if a in rates and b in rates:
            best = min(per_round[b]) / min(per_round[a])
            print(f"  ratio {a} / {b}: {rates[a] / rates[b]:.2f}x (best rounds: {best:.2f}x) -- {title}")
    where = module_paths(today.model, list(modules))
    parts = ", ".join(f"{where[name]} {value / 1e9:.1f}" for name, value in modules.items())
    print(f"  FLOPs per image: {flops / 1e9:.0f} GFLOP (2 per multiply-add, today's path counted); by module: {parts}")
    for label, parts in stages.items():
        print(
            f"  time by stage, {label}: "
            + ", ".join(
                f"{stage} {sec:.2f} s ({sec / parts['total']:.0%})" for stage, sec in parts.items() if stage != "total"
            )
            + f"; total {parts['total']:.2f} s"
        )
    for threads, peak in peaks.items():
        limit = max(peak.values())
        print(
            f"  matmul peak at {threads} thread{'s' * (threads > 1)}: "
            + ", ".join(f"{name} {value:.0f} GFLOP/s" for name, value in peak.items())
            + f"; at {limit:.0f} GFLOP/s an image's {flops / 1e9:.0f} GFLOP take {flops / limit / 1e9:.2f} s"
        )
    reference = outputs["today, 1 thread"]
    for label in sides:
        if label == "today, 1 thread":
            continue
        same_boxes = sum(np.array_equal(a.boxes, b.boxes) for a, b in zip(reference, outputs[label]))
        labels = sum(np.array_equal(a.objects_id, b.objects_id) for a, b in zip(reference, outputs[label]))
        rel = max(
            float(np.abs(a.features - b.features).max() / np.abs(a.features).max())
            for a, b in zip(reference, outputs[label])
            if a.features.shape == b.features.shape
        )
        print(
            f"  {label} vs today, 1 thread: boxes identical on {same_boxes} of {n} images, labels on {labels}, "
            f"features within {rel:.1e} of their largest (float16 rounds by up to 4.9e-4)"
        )
    fast_runs = [outputs[label] for label in sides if label.startswith("fast")]
    bitwise = all(
        all(np.array_equal(x, y) for x, y in zip(a.array_fields().values(), b.array_fields().values()))
        for other in fast_runs[1:]
        for a, b in zip(fast_runs[0], other)
    )
    print(f"  the fast path at 1 and {all_threads} threads: records {'bitwise equal' if bitwise else 'DIFFER'}")
    print(f"  peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--n", type=int, default=12, help="images per measurement (in_process, end_to_end)")
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("--boxes", default="10-100")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--hf-frcnn-dir",
        type=Path,
        default=os.environ.get(HF_DIR_ENV),
        help=f"a transformers checkout's examples/research_projects/lxmert (default: ${HF_DIR_ENV})",
    )
    parser.add_argument("--hf-n", type=int, default=2, help="images per side and round (hf)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (hf, backends)")
    parser.add_argument(
        "--batching-rounds", type=int, default=1, help="rounds of all batching modes, alternating order"
    )
    parser.add_argument("--batching-n", type=int, default=8, help="mixed-size images (batching)")
    parser.add_argument("--batching-sizes", default="1,4,8")
    parser.add_argument("--pad-tolerance", type=float, default=0.15, help="padded groups' extra pixels (batching)")
    parser.add_argument("--backends-n", type=int, default=2, help="images per backend and round (backends)")
    parser.add_argument(
        "--grid-pool", type=GridPool.parse, default=GridPool(8, 8), help="the pooled grid-x152 row (backends)"
    )
    parser.add_argument(
        "--backends-extra", default="", help="more detector configs, comma-separated: grid-r50,grid-x101 (backends)"
    )
    parser.add_argument("--cpu-n", type=int, default=2, help="images per path and round (cpu)")
    parser.add_argument(
        "--cpu-threads", type=int, default=os.cpu_count() or 1, help="every core: the threads of the second pair (cpu)"
    )
    args = parser.parse_args()
    parts = args.parts.split(",")
    if set(parts) - set(PARTS):
        parser.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))}; choose from {', '.join(PARTS)}")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    name = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    )
    models = "full VG R101 C4" if set(parts) - {"backends"} else "the extraction backends"
    print(f"device: {name}; torch {torch.__version__}; fp16={args.fp16}; {models}")
    if "in_process" in parts:
        print(f"\nBUTD boxes {args.boxes}; {args.n} photo-like 640x480 JPEGs (600x800 after resize)")
        for batch in sizes:
            rate = in_process(args.device, args.fp16, args.n, batch, args.boxes)
            print(f"in process      batch {batch:3d}: {rate:7.2f} images/s  ({1 / rate:.3f} s/image)")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS (in-process runs): {rss:.0f} MB")
        if args.device.startswith("cuda"):
            print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MB")
    if "end_to_end" in parts:
        rate, wall = end_to_end(args.device, args.fp16, args.n, max(sizes), args.boxes, args.workers)
        print(
            (
                f"end to end (vlprep extract --images, batch {max(sizes)}, Ray start-up included): {rate:.2f} "
                f"images/s ({wall:.1f} s)"
            )
        )
    if "hf" in parts:
        if args.hf_frcnn_dir is None:
            print(
                f"\nHF research port: skipped — point --hf-frcnn-dir (or ${HF_DIR_ENV}) at a transformers "
                "checkout's examples/research_projects/lxmert (modeling_frcnn.py, processing_image.py, utils.py)"
            )
        else:
            side_by_side(Path(args.hf_frcnn_dir).expanduser(), args.hf_n, args.rounds, args.device)
    if "batching" in parts:
        batching(
            args.batching_n,
            [int(b) for b in args.batching_sizes.split(",")],
            args.pad_tolerance,
            args.batching_rounds,
            args.boxes,
            args.device,
            args.fp16,
        )
    if "backends" in parts:
        extra = [name for name in args.backends_extra.split(",") if name]
        backends(args.backends_n, args.rounds, args.grid_pool, extra, args.device, args.fp16)
    if "cpu" in parts:
        cpu_paths(args.cpu_n, args.rounds, args.cpu_threads)
    print(
        (
            "\nreference points: py-bottom-up-attention ~3 images/s on a T4; Caffe < 1 s/image; target >= 30 images/s "
            "on an H200"
        )
    )


if __name__ == "__main__":
    main()
