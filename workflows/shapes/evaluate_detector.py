"""Measure a shapes-world detector on held-out generated scenes through the real
extraction path (strict `load_detector`, `RegionFeatureExtractor`, policy ``butd``):
box recall at IoU 0.5, class accuracy and attribute accuracy — the definitions are in
`evaluate_shapes_detector` in shapes_detector.py beside this file.

    python workflows/shapes/evaluate_detector.py                      # the packaged shapes-tiny weights
    python workflows/shapes/evaluate_detector.py --weights my.pkl --n-images 500 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from shapes_detector import SHAPES_BOXES, SHAPES_CONFIG, evaluate_shapes_detector

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
from pipeline.synthetic.world import JPEG_QUALITY


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, default=None, help="default: the packaged shapes-tiny.pkl")
    ap.add_argument("--config", default=SHAPES_CONFIG)
    ap.add_argument("--n-images", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1_000_000, help="scene stream (training never draws from it)")
    ap.add_argument("--boxes", default=SHAPES_BOXES, help="box count of the butd selection (default %(default)s)")
    ap.add_argument("--raw", action="store_true", help=f"raw renders instead of JPEG q{JPEG_QUALITY}")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    weights = args.weights or shapes_tiny_weights()
    result = evaluate_shapes_detector(
        weights,
        args.n_images,
        args.seed,
        args.boxes,
        None if args.raw else JPEG_QUALITY,
        cfg=DetectorConfig.load(args.config),
    )
    result["weights"] = str(weights)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
