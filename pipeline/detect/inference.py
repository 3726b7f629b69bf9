"""What every extractor does with its model: put it on its device in eval mode, and run it under
float16 autocast on CUDA when asked (`OnDevice`); and, for the region detectors on a CPU, which
kernels run their ROI heads (`KERNELS`)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
from torch import nn

# "fast": on a CPU, the ROI head through `pipeline.detect.cpu` (oneDNN, units of proposals on worker
# threads, results independent of the thread count); "torch": the model's modules at the caller's
# thread count (always so on a GPU).
KERNELS = ("fast", "torch")


class OnDevice:
    """`model` (its `cfg` as `self.cfg`) on `device`, eval mode; `fp16` only takes on CUDA;
    `kernels` ("fast" only takes on a CPU) and `threads` (the fast path's workers; None: the
    caller's torch thread count at each call)."""

    def place(
        self, model: nn.Module, device: str, fp16: bool, kernels: str = "torch", threads: Optional[int] = None
    ) -> None:
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, not {kernels!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model = model.to(device).eval()
        self.cfg = model.cfg
        self.device = torch.device(device)
        self.fp16 = fp16 and self.device.type == "cuda"
        self.kernels = kernels if self.device.type == "cpu" else "torch"
        self.threads = threads

    @property
    def thread_invariant(self) -> bool:
        """Whether the outputs are the same bit for bit at any thread count (the fast CPU path)."""
        return self.kernels == "fast"

    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.float16) if self.fp16 else nullcontext()
