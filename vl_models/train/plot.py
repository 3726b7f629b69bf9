"""`vltrain plot RUN`: the training curves of a run as one PNG."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_run(run: Path, output: Path) -> Path:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "lr" in r]
    evals = [r for r in rows if any(k.startswith("eval_") for k in r)]
    losses = sorted({k for r in train for k in r if k.startswith("loss_")})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key in losses:
        axes[0].plot([r["step"] for r in train if key in r], [r[key] for r in train if key in r], label=key[5:])
    axes[0].set(title="training losses", xlabel="step", yscale="log")
    axes[0].legend(fontsize=8)
    accs = sorted({k for r in train for k in r if k.endswith("_acc")})
    for key in accs:
        axes[1].plot(
            [r["step"] for r in train if key in r and r[key] == r[key]],
            [r[key] for r in train if key in r and r[key] == r[key]],
            label=key,
        )
    axes[1].set(title="training accuracies", xlabel="step", ylim=(0, 1))
    axes[1].legend(fontsize=8)
    eval_keys = sorted(
        {k for r in evals for k in r if k.startswith("eval_") and ("acc" in k or "R@" in k or "qa" in k)}
    )
    for key in eval_keys:
        axes[2].plot(
            [r["step"] for r in evals if key in r], [r[key] for r in evals if key in r], marker="o", label=key[5:]
        )
    axes[2].set(title="validation", xlabel="step", ylim=(0, 1))
    if eval_keys:
        axes[2].legend(fontsize=8)
    fig.suptitle(str(run))
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output
