"""Region-feature extraction speed: the full VG ResNet-101 config at BUTD settings.

Measured in one run:
  1. the extractor in this process (JPEG decode + BUTD preprocessing + detector + BUTD
     per-class NMS selection + attributes), batch 1 and batched;
  2. end to end: `vlprep extract --images FOLDER` (Ray actor, store writing), as users run it.
Images are photo-like 640x480 JPEGs (resized to 600x800 by the BUTD rule); weights are
random in the full published shapes (the public weights cannot be fetched here — speed
does not depend on the values; box counts use the BUTD fallback to MIN).

No runnable anchor exists on this machine (detectron2 cannot be installed; the Caffe code
needs its own build), so reference points are quoted from users' reports:
py-bottom-up-attention ~2.7 s per 8 images on a T4 (~3 images/s), Caffe < 1 s per image.
Target on an H200: >= 30 images/s end to end.

    python bench/extract.py                       # CPU
    python bench/extract.py --device cuda --fp16 --n 256 --batch-sizes 1,8
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import make_jpegs

from pipeline.detect.boxes import BoxCount
from pipeline.detect.config import DetectorConfig
from pipeline.detect.extractor import RegionFeatureExtractor, SelectionConfig
from pipeline.detect.model import VGDetector
from pipeline.images import load_rgb


def in_process(device: str, fp16: bool, n: int, batch: int, boxes: str) -> float:
    torch.manual_seed(0)
    model = VGDetector(DetectorConfig.load("vg-r101"))
    ex = RegionFeatureExtractor(model, SelectionConfig("butd", BoxCount.parse(boxes)), device=device, fp16=fp16)
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
        cmd = [sys.executable, "-m", "pipeline.cli", "-q", "extract", "--images", str(folder), "--random-weights",
               "--boxes", boxes, "--batch-size", str(batch), "--device", device, "--out", str(root / "store"),
               "--workers", str(workers), "--shard-size", str(max(batch, 32))] + (["--fp16"] if fp16 else [])
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"vlprep extract failed:\n{proc.stderr[-3000:]}")
        return n / wall, wall
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--n", type=int, default=12, help="images per measurement")
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("--boxes", default="10-100")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    print(f"device: {name}; torch {torch.__version__}; fp16={args.fp16}; full VG R101 C4, BUTD boxes {args.boxes}; "
          f"{args.n} photo-like 640x480 JPEGs (600x800 after resize)\n")
    for batch in sizes:
        rate = in_process(args.device, args.fp16, args.n, batch, args.boxes)
        print(f"in process      batch {batch:3d}: {rate:7.2f} images/s  ({1 / rate:.3f} s/image)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS (in-process runs): {rss:.0f} MB")
    if args.device.startswith("cuda"):
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**20:.0f} MB")
    rate, wall = end_to_end(args.device, args.fp16, args.n, max(sizes), args.boxes, args.workers)
    print(f"end to end (vlprep extract --images, batch {max(sizes)}, Ray start-up included): {rate:.2f} images/s ({wall:.1f} s)")
    print("\nreference points: py-bottom-up-attention ~3 images/s on a T4; Caffe < 1 s/image; target >= 30 images/s on an H200")


if __name__ == "__main__":
    main()
