"""What a long `vltrain` command shows while it works: a progress bar on a terminal (done of
total, elapsed, time left), one log line per logged step in a batch job (`progress_line`), and
the last losses and scores when training ends."""

from __future__ import annotations

import datetime
import logging
import math
from typing import Optional

from rich.console import Console


def bar(label: str, disable: bool = False, info: bool = False):
    """A progress bar on stderr (done of total, elapsed, time left) that goes away when done;
    `info`: a text column the task's ``info`` field fills (training's loss and speed)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    if info:
        columns.insert(3, TextColumn("{task.fields[info]}"))
    return Progress(*columns, console=Console(stderr=True), transient=True, disable=disable)


def progress_line(metrics: dict, steps: int) -> str:
    """``step 120/1000: loss 2.345, lr 1.0e-04, 88.1 samples/s, ETA 0:12:03 (mlm 1.2, ...)``."""
    losses = {k[len("loss_") :]: v for k, v in metrics.items() if k.startswith("loss_")}
    eta: Optional[float] = metrics.get("eta_s")
    eta_text = str(datetime.timedelta(seconds=round(eta))) if eta is not None and math.isfinite(eta) else "?"
    parts = ", ".join(f"{k} {v:.4g}" for k, v in losses.items())
    return (
        f"step {metrics['step']}/{steps}: loss {sum(losses.values()):.4g}, lr {metrics['lr']:.2e}, "
        f"{metrics['samples_per_s']:.1f} samples/s, ETA {eta_text} ({parts})"
    )


def train_with_progress(run, cfg, label: str) -> None:
    """Call ``run(cfg, on_step)`` with a progress bar on a terminal (a log line per logged step
    in a batch job), then print the last losses and validation scores (under torchrun: rank 0)."""
    from vl_models import distributed

    stderr = Console(stderr=True)
    if not stderr.is_terminal:  # a batch job: a log line per logged step instead of a bar
        last = run(
            cfg, on_step=lambda step, metrics, total: logging.getLogger("vltrain").info(progress_line(metrics, total))
        )
    else:
        with bar(label, info=True) as shown:
            task = shown.add_task("steps", total=None, info="")  # the total comes with the first step

            def update(step: int, metrics: dict, total: int) -> None:
                loss = sum(v for k, v in metrics.items() if k.startswith("loss_"))
                shown.update(
                    task, completed=step, total=total, info=f"loss {loss:.3f}, {metrics['samples_per_s']:.1f} samples/s"
                )

            last = run(cfg, on_step=update)
    if not distributed.is_main():  # the other ranks log nothing either
        return
    scores = {k: round(v, 4) for k, v in last.items() if k.startswith(("loss_", "eval_"))}
    Console().print(f"done: step {last.get('step', 'unchanged: the run was at its end')} -> {cfg.out}")
    Console().print(scores)
