"""What every extractor does with its model: put it on its device in eval mode, and run it under
float16 autocast on CUDA when asked (`OnDevice`)."""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn


class OnDevice:
    """`model` (its `cfg` as `self.cfg`) on `device`, eval mode; `fp16` only takes on CUDA."""

    def place(self, model: nn.Module, device: str, fp16: bool) -> None:
        self.model = model.to(device).eval()
        self.cfg = model.cfg
        self.device = torch.device(device)
        self.fp16 = fp16 and self.device.type == "cuda"

    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.float16) if self.fp16 else nullcontext()
