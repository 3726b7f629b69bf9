"""Train the shapes-world detector (config ``shapes-tiny``) on CPU and write it where
`load_detector` reads it: the detectron2 pickle layout of the public bottom-up-attention
weights, its sha256, and a JSON training record (the exact command, hyper-parameters,
final losses, seconds, parameter count, and — unless --no-eval — the held-out numbers of
`evaluate_shapes_detector`).

Scenes are generated on the fly from a seeded generator (no files). The committed
weights in pipeline/detect/backends/butd_c4/weights_data/ come from:

    python workflows/shapes/train_detector.py --out pipeline/detect/backends/butd_c4/weights_data/shapes-tiny.pkl

(see workflows/shapes/README.md for the time it takes and what it measures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from shapes_detector import SHAPES_CONFIG, ShapesTraining, evaluate_shapes_detector, train_shapes_detector

from pipeline.detect.backends.butd_c4.config import DetectorConfig
from pipeline.detect.backends.butd_c4.weights import load_detector, save_detector


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    d = ShapesTraining()
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="the weights file (.pkl); .sha256 and .json are written next to it"
    )
    ap.add_argument("--config", default=SHAPES_CONFIG, help="detector config name or path (default %(default)s)")
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--batch", type=int, default=d.batch, help="images per step")
    ap.add_argument("--seed", type=int, default=d.seed)
    ap.add_argument("--lr", type=float, default=d.lr)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default %(default)s)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-images", type=int, default=200, help="held-out scenes measured after training")
    ap.add_argument("--no-eval", action="store_true")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    cfg = DetectorConfig.load(args.config)
    t = ShapesTraining(steps=args.steps, batch=args.batch, seed=args.seed, lr=args.lr)
    print(f"training {cfg.name}: {t}", flush=True)
    began = time.perf_counter()
    load_before = os.getloadavg()[0]

    def on_step(step: int, losses: dict[str, float]) -> None:
        if step % args.log_every == 0 or step == t.steps - 1:
            shown = " ".join(f"{k}={v:.3f}" for k, v in losses.items())
            print(f"step {step + 1}/{t.steps} [{time.perf_counter() - began:6.0f}s] {shown}", flush=True)

    model, summary = train_shapes_detector(cfg, t, on_step)
    load_after = os.getloadavg()[0]
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    digest = save_detector(model, out, author=f"vlprep {cfg.name} (workflows/shapes/train_detector.py)")
    out.with_suffix(".sha256").write_text(f"{digest}  {out.name}\n")
    load_detector(out, cfg)  # the saved file loads strictly, through the public-weights path
    print(
        f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB, sha256 {digest}); "
        f"{summary['parameters']:,} parameters; trained in {summary['seconds']:.0f} s",
        flush=True,
    )

    record = {
        "config": cfg.name,
        "weights": out.name,
        "sha256": digest,
        "bytes": out.stat().st_size,
        "command": "python "
        + " ".join(shlex.quote(a) for a in [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]),
        "training": asdict(t),
        **summary,
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores ({platform.machine()})",
        # 1-minute load averages: above `threads`, other work shared the cores and `seconds` is inflated
        "load_average": {"start": round(load_before, 2), "end": round(load_after, 2)},
        "detector_config": cfg.to_json(),
    }
    if not args.no_eval:
        record["evaluation"] = evaluate_shapes_detector(out, args.eval_images, cfg=cfg)
        print("held-out:", json.dumps(record["evaluation"]), flush=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
