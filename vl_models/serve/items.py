"""The items of a task dataset or a mixture, as pages show them: those of one image (found by a
vectorized comparison over the memory-mapped image column: no per-row Python) and a page of
rows (a slice of the items)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ITEMS_PER_IMAGE = 60  # items of one task shown on an image's page, at most
ROWS_PER_PAGE = 50


def rows_of_image(entry, image_id: str) -> np.ndarray:
    """The rows of `entry`'s items that name `image_id` (ascending)."""
    data = entry.data
    if entry.kind == "mixture":
        hit = pc.equal(data.items.column("store_key"), pa.scalar(image_id, pa.string()))
        return np.flatnonzero(hit.to_numpy(zero_copy_only=False))
    flat, parents = _flat_images(entry)
    hit = pc.equal(flat, pa.scalar(image_id, pa.string())).to_numpy(zero_copy_only=False)
    return np.unique(parents[hit])


def _flat_images(entry) -> tuple[pa.Array, np.ndarray]:
    """A task dataset's image keys flattened, and the row of each (computed once per entry)."""
    cached = getattr(entry, "_flat", None)
    if cached is None:
        column = entry.data.items.column("images").combine_chunks()
        cached = (pc.list_flatten(column), pc.list_parent_indices(column).to_numpy())
        entry._flat = cached
    return cached


def describe(entry, rows: np.ndarray, limit: Optional[int] = None) -> list[dict]:
    """Rows of `entry` as the pages show them (only `limit` of them read)."""
    rows = rows[:limit] if limit else rows
    if len(rows) == 0:
        return []
    data = entry.data
    table = data.items.take(pa.array(np.asarray(rows, np.int64)))
    answers = data.answers
    out = []
    for row, item in zip(rows.tolist(), table.to_pylist()):
        shown = {"row": int(row), "uid": item.get("uid"), "text": item.get("text")}
        if entry.kind == "mixture":
            shown.update(kind=item["kind"], source=item["source"], splits=[item["split"]], images=[item["store_key"]])
        else:
            shown.update(kind=_task_kind(entry, item), splits=item["splits"], images=item["images"])
            if item.get("box"):
                shown["box"] = [round(float(v), 1) for v in item["box"]]
            if item.get("label") is not None:
                shown["label"] = int(item["label"])
            if item.get("choices"):
                shown["choices"] = item["choices"]
            if item.get("answers"):
                shown["given_answers"] = _counts(item["answers"])
        ids, scores = item.get("answer_ids") or [], item.get("answer_scores") or []
        if ids:
            pairs = sorted(zip(ids, scores), key=lambda p: -p[1])
            shown["targets"] = [
                {"answer": answers[i] if 0 <= i < len(answers) else f"#{i}", "score": round(float(s), 2)}
                for i, s in pairs[:5]
            ]
        out.append(shown)
    return out


def _task_kind(entry, item: dict) -> str:
    task = entry.manifest.get("task", "")
    if item.get("box"):
        return "expression"
    if item.get("choices"):
        return "question (choices)"
    if task.startswith("nlvr"):
        return "statement"
    if item.get("answer_ids") is not None or item.get("answers"):
        return "question"
    if task in ("flickr30k", "coco-retrieval"):
        return "caption"
    return "text"


def _counts(answers: list) -> list[str]:
    """The annotators' answers, most given first, with their counts (``no ×9``)."""
    values, counts = np.unique(np.asarray([str(a) for a in answers], dtype=object), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return [f"{values[i]} ×{counts[i]}" if counts[i] > 1 else str(values[i]) for i in order[:6]]


def summary(entry) -> dict:
    """What a task dataset's or mixture's page says of it: rows per split, answers, the task."""
    manifest = entry.manifest
    if entry.kind == "task":
        splits = manifest.get("splits") or {}
        return {
            "task": manifest.get("task"),
            "splits": splits if isinstance(splits, dict) else {},
            "answers": (manifest.get("answers") or {}).get("count")
            if isinstance(manifest.get("answers"), dict)
            else None,
        }
    totals = manifest.get("totals") or {}
    return {
        "task": "pretraining mixture",
        "splits": totals if isinstance(totals, dict) else {},
        "answers": len(entry.data.answers),
        "sources": sorted((manifest.get("counts") or {}).keys()) if isinstance(manifest.get("counts"), dict) else [],
    }
