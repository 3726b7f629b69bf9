"""Where a run's numbers go (rank 0): ``metrics.jsonl`` always (training rows carry
``lr``; validation rows ``eval_*``; notes ``note``), and TensorBoard event files in
``RUN/tensorboard`` with ``--report-to tensorboard`` (the optional ``tensorboard``
package)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from pipeline.errors import ConfigError

REPORTERS = ("tensorboard",)


def check_reporters(report_to: Sequence[str]) -> None:
    """ConfigError for an unknown reporter, or TensorBoard asked for but not installed."""
    unknown = sorted(set(report_to) - set(REPORTERS))
    if unknown:
        raise ConfigError(f"--report-to {', '.join(unknown)}: unknown; known: {', '.join(REPORTERS)}")
    if "tensorboard" in report_to:
        try:
            import torch.utils.tensorboard  # noqa: F401  (imports the tensorboard package)
        except ImportError as err:
            raise ConfigError(
                "--report-to tensorboard needs the tensorboard package: pip install tensorboard "
                "(or pip install 'vlprep[tensorboard]')"
            ) from err


class RunLog:
    """Appends rows to ``metrics.jsonl`` and mirrors them to TensorBoard: training rows as
    ``train/<key>``, validation rows as ``eval/<key without eval_>``, notes as text.
    `start_step`: the step a resumed run continues from (TensorBoard drops the killed
    run's events after it, as `truncate_metrics` drops its rows)."""

    def __init__(self, out: Path, report_to: Sequence[str] = (), start_step: int = 0):
        self.path = Path(out) / "metrics.jsonl"
        self.tensorboard = None
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(Path(out) / "tensorboard"), purge_step=start_step + 1)

    def write(self, row: dict) -> None:
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as err:  # name the file (a full disk's message shows it)
            raise OSError(err.errno, err.strerror, err.filename or str(self.path)) from err
        if self.tensorboard is not None:
            step = row["step"]
            if "note" in row:
                self.tensorboard.add_text("notes", row["note"], step)
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    tag = f"eval/{key[len('eval_') :]}" if key.startswith("eval_") else f"train/{key}"
                    self.tensorboard.add_scalar(tag, value, step)
            self.tensorboard.flush()

    def note(self, step: int, text: str) -> None:
        self.write({"step": step, "note": text})

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
