"""Strict key accounting of a weights file against a model's state dict, shared by the backends.

Every tensor of the file fills a parameter or buffer of the same name and shape, and every one
of the model's is filled, or the load fails listing the keys. The tolerated differences are
named and counted in the `LoadReport`: BatchNorm ``num_batches_tracked`` counters (meaningless
for frozen norms) are dropped, and FrozenBN running statistics absent from a file take identity
values (detectron2's rule for its old checkpoints).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from pipeline.detect.backends.base import LoadReport
from pipeline.errors import ConfigError

log = logging.getLogger(__name__)
NORM_STATS = (".norm.running_mean", ".norm.running_var")


def strict_state(
    path: Path, tensors: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], config: str, report: LoadReport
) -> dict[str, torch.Tensor]:
    """The state dict to load (`tensors` cast to the model's dtypes, identity statistics added);
    ConfigError naming every missing, unexpected or misshaped key."""
    tensors = dict(tensors)
    for key in [k for k in tensors if k.endswith(".num_batches_tracked")]:
        report.dropped.append(key)
        del tensors[key]
    missing = [k for k in expected if k not in tensors]
    identity = [k for k in missing if k.endswith(NORM_STATS)]
    missing = [k for k in missing if k not in identity]
    unexpected = [k for k in tensors if k not in expected]
    misshaped = [
        f"{k}: file {tuple(tensors[k].shape)}, model {tuple(expected[k].shape)}"
        for k in tensors
        if k in expected and tensors[k].shape != expected[k].shape
    ]
    if missing or unexpected or misshaped:
        lines = []
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("misshaped", misshaped)):
            if keys:
                shown = ", ".join(keys[:12]) + (f" ... ({len(keys)} in all)" if len(keys) > 12 else "")
                lines.append(f"{title}: {shown}")
        raise ConfigError(
            f"{path} ({report.layout}) does not match detector config {config!r}:\n  " + "\n  ".join(lines)
        )
    state = {k: v.to(expected[k].dtype) for k, v in tensors.items()}
    for key in identity:
        state[key] = torch.zeros_like(expected[key]) if key.endswith("running_mean") else torch.ones_like(expected[key])
    report.identity_norm_stats = len(identity)
    if identity:
        log.info("%s: %d FrozenBN running statistics absent, identity statistics used", path.name, len(identity))
    return state
