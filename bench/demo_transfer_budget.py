"""Does pretraining give a task a head start that more fine-tuning does not? The demo's
transfer runs (`vlprep demo`: 50 steps of 32 per task, pretrained vs from scratch) again on a
finished demo folder, at another fine-tuning budget, side by side with the demo's own scores.

    vlprep demo --quick --out /tmp/demo
    python bench/demo_transfer_budget.py --out /tmp/demo --steps 300 --tasks refcoco+,vcr --models vilbert

Prints, per model and task, the best validation score (the task's official metric) from
scratch and from pretraining at the demo's budget (read from its report.json) and at
``--steps`` (runs written next to the demo's, ``<task>-<init>-seed<S>-steps<N>``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    from vl_models.data.tokenize import bundled_bert_vocab
    from vl_models.demo import MODELS, TRANSFER_STEPS, DemoConfig, finetune

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="a finished `vlprep demo` folder")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--tasks", default="refcoco+,vcr")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = p.parse_args()
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    report = json.loads((a.out / "report.json").read_text())
    cfg = DemoConfig(out=a.out, quick=report["config"]["quick"], seed=a.seed)
    vocab = bundled_bert_vocab()
    row = "{:<8} {:<10} {:>5} {:>8.1f} {:>10.1f} {:>+6.1f}"
    print(f"{'model':<8} {'task':<10} {'steps':>5} {'scratch':>8} {'pretrained':>10} {'gain':>6} {'s':>6}")
    for kind in a.models.split(","):
        for task in a.tasks.split(","):
            demo = report["transfer"]["scores"][kind][task]
            k = report["transfer"]["seeds"].index(a.seed)
            scratch, pretrained = demo["scratch"][k], demo["pretrained"][k]
            print(row.format(kind, task, TRANSFER_STEPS, scratch, pretrained, pretrained - scratch))
            started = time.perf_counter()
            scores = {
                init: finetune(cfg, kind, task, init, a.seed, a.out, vocab, a.steps)
                for init in ("scratch", "pretrained")
            }
            seconds = time.perf_counter() - started
            gain = scores["pretrained"] - scores["scratch"]
            print(row.format(kind, task, a.steps, scores["scratch"], scores["pretrained"], gain) + f" {seconds:>6.0f}")


if __name__ == "__main__":
    main()
