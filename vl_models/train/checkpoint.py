"""Checkpoints: everything a run needs to continue bit-exactly, written atomically, with
a `latest` pointer written last. Loaded with ``weights_only=True`` (no pickle code)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from pipeline.io import atomic_write_bytes

LATEST = "latest"


def rng_state() -> dict:
    _, py_state, py_gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {"python": list(py_state), "python_gauss": py_gauss,
            "numpy": np_keys.tolist(), "numpy_pos": int(np_pos), "numpy_has_gauss": int(np_has_gauss),
            "numpy_gauss": float(np_gauss), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"],
                         state["numpy_has_gauss"], state["numpy_gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save(run: Path, step: int, payload: dict) -> Path:
    """Write checkpoints/step_NNNNNNN.pt atomically, then the `latest` pointer."""
    folder = run / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    buf = io.BytesIO()
    torch.save({**payload, "step": step, "rng": rng_state()}, buf)
    atomic_write_bytes(path, buf.getvalue())
    atomic_write_bytes(folder / LATEST, path.name.encode())
    return path


def load_latest(run: Path) -> Optional[dict]:
    pointer = run / "checkpoints" / LATEST
    if not pointer.exists():
        return None
    return torch.load(run / "checkpoints" / pointer.read_text().strip(), map_location="cpu", weights_only=True)
