"""A run as its page shows it: the resolved config, the checkpoints (latest, best), the
validation metrics and the training curves (`vltrain plot`'s picture, drawn into memory: the
run folder is only read)."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from vl_models.train import checkpoint

_PLOT_LOCK = threading.Lock()  # matplotlib's pyplot is not thread-safe
_CURVES: dict = {}  # run path -> (metrics.jsonl's mtime and size, PNG bytes)


def metrics_rows(run: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (unreadable lines left out)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def info(run: Path) -> dict:
    """A run's kind, model, tasks, checkpoints and validation rows (JSON-ready)."""
    from vl_models.train.checkpoint import BEST, FOLDER, LATEST, file_name, pointer_name, steps_in

    try:
        config = json.loads((run / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}
    folder = run / FOLDER
    pointers = {}
    for pointer in (LATEST, BEST):
        try:
            pointers[pointer] = pointer_name(folder, pointer)
        except Exception:  # an unreadable pointer: shown as none
            pointers[pointer] = None
    checkpoints = []
    for step in steps_in(folder):
        name = file_name(step)
        checkpoints.append(
            {
                "step": step,
                "file": name,
                "bytes": (folder / name).stat().st_size,
                "latest": pointers[LATEST] == name,
                "best": pointers[BEST] == name,
            }
        )
    rows = metrics_rows(run)
    evals = [r for r in rows if any(k.startswith("eval_") for k in r)]
    keys = sorted({k for r in evals for k in r if k.startswith("eval_")})
    train = [r for r in rows if "lr" in r]
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    return {
        "kind": "fine-tuning" if config.get("tasks") else "pretraining",
        "family": config.get("kind") or "",
        "model": model.get("name") or model.get("model_type") or "",
        "tasks": config.get("tasks") or [],
        "checkpoints": checkpoints,
        "eval_keys": keys,
        "evals": [{"step": r.get("step"), **{k: r.get(k) for k in keys}} for r in evals],
        "steps": max((r.get("step", 0) for r in train if isinstance(r.get("step"), int)), default=0),
        "last": {k: v for k, v in (train[-1] if train else {}).items() if isinstance(v, (int, float))},
        "config": json.dumps(config, indent=2, sort_keys=True),
        "has_metrics": bool(rows),
    }


def default_step(run: Path):
    """The checkpoint the page asks with: the best one where the run keeps one, else the latest."""
    try:
        return checkpoint.BEST if checkpoint.pointed(run, checkpoint.BEST) is not None else None
    except Exception:
        return None


def curves_png(run: Path) -> bytes:
    """The run's curves as `vltrain plot` draws them, drawn again only when metrics.jsonl changed."""
    from vl_models.train.plot import plot_run

    stat = (run / "metrics.jsonl").stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    with _PLOT_LOCK:
        cached = _CURVES.get(str(run))
        if cached is not None and cached[0] == stamp:
            return cached[1]
        buf = io.BytesIO()
        plot_run(run, buf)
        _CURVES[str(run)] = (stamp, buf.getvalue())
        return buf.getvalue()
