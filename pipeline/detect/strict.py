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
from pipeline.state_dicts import mismatch

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
    identity = [k for k in expected if k not in tensors and k.endswith(NORM_STATS)]
    problems = mismatch({k: v for k, v in expected.items() if k not in identity}, tensors)
    if problems:
        raise ConfigError(f"{path} ({report.layout}) does not match detector config {config!r}: {problems}")
    state = {k: v.to(expected[k].dtype) for k, v in tensors.items()}
    for key in identity:
        state[key] = torch.zeros_like(expected[key]) if key.endswith("running_mean") else torch.ones_like(expected[key])
    report.identity_norm_stats = len(identity)
    if identity:
        log.info("%s: %d FrozenBN running statistics absent, identity statistics used", path.name, len(identity))
    return state
