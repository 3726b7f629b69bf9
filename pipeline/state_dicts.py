"""Comparing the tensors of a weights file with a model's: the one wording of a mismatch, used by
the detector backends' loaders (`pipeline.detect.strict`) and the trainer's checkpoint loaders
(`vl_models.models.weights`)."""

from __future__ import annotations

from typing import Mapping, Optional

SHOWN = 12  # keys named per kind of mismatch


def mismatch(expected: Mapping, state: Mapping) -> Optional[str]:
    """One line naming the keys of `expected` missing from `state`, those of `state` the model
    lacks, and those of another shape (both map names to tensors); None when they agree."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    misshaped = [
        f"{k}: file {tuple(state[k].shape)}, model {tuple(expected[k].shape)}"
        for k in state
        if k in expected and state[k].shape != expected[k].shape
    ]
    parts = [
        f"{title}: {', '.join(keys[:SHOWN])}" + (f" ... ({len(keys)} in all)" if len(keys) > SHOWN else "")
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("misshaped", misshaped))
        if keys
    ]
    return "; ".join(parts) or None
