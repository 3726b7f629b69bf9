"""Evaluation on a mixture's validation split: the family's pretraining metrics (masked-LM
accuracy, matching / alignment accuracy, ...), the VQA soft score of a family with a QA
head, and zero-shot caption -> image retrieval R@1/5/10 scored by the family's pair head.
The scores each family reports, with their better direction, are its `eval_metrics`.

Under torchrun every rank calls it: each scores its share of the batches and of the
retrieval queries (`distributed.shard`), the shares are gathered on every rank and
combined in the one-process order, so the scores equal one process's and no rank waits
for another's whole evaluation (a collective timeout)."""

from __future__ import annotations

import numpy as np
import torch

from vl_models import distributed
from vl_models.config import TaskConfig
from vl_models.data.dataset import PretrainDataset
from vl_models.data.padding import padded
from vl_models.eval.metrics import recall_at_k, vqa_score
from vl_models.tasks.pretrain import pretrain_losses


@torch.no_grad()
def evaluate(
    family,
    model,
    data: PretrainDataset,
    device: str = "cpu",
    batch_size: int = 32,
    max_items: int = 512,
    retrieval_images: int = 50,
    captions_per_image: int = 1,
) -> dict:
    was_training = model.training
    model.eval()
    # Evenly spaced over the split, so every source (captions, questions) is represented
    # whatever order the mixture lists them in.
    items = np.unique(np.linspace(0, len(data) - 1, min(len(data), max_items)).round().astype(int))
    batches = [[int(i) for i in items[start : start + batch_size]] for start in range(0, len(items), batch_size)]
    scored = distributed.gather_shards(
        [_score_batch(family, model, data, batches[b], device) for b in distributed.shard(len(batches))]
    )
    qa_pred, qa_ids, qa_scores = [], [], []
    for _, answers in scored:
        for pred, ids, scores in answers:
            qa_pred.append(pred)
            qa_ids.append(ids)
            qa_scores.append(scores)
    result = {f"eval_{k}": v for k, v in batch_means([metrics for metrics, _ in scored]).items()}
    if qa_pred:
        result["eval_qa_score"] = vqa_score(np.array(qa_pred), qa_ids, qa_scores)
    result.update(retrieval(family, model, data, device, retrieval_images, captions_per_image))
    if was_training:
        model.train()
    return result


def batch_means(per_batch: list[dict]) -> dict:
    """Each metric's mean over the batches that have it: a batch without that metric's target
    (NaN: e.g. ``qa_acc`` on a batch of captions) is left out, not counted as 0."""
    values: dict = {}
    for metrics in per_batch:
        for k, v in metrics.items():
            if v == v:  # not NaN
                values.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in values.items()}


def _score_batch(family, model, data: PretrainDataset, idx: list[int], device: str) -> tuple[dict, list]:
    """One batch's pretraining metrics, and for a family with a QA head the (predicted
    answer, answer ids, scores) of its matched items that have answers."""
    batch = padded(torch.utils.data.default_collate([data[i] for i in idx]), data.cfg.padding)
    batch = {k: v.to(device) for k, v in batch.items()}
    # Without gradients the losses' means are local to the batch: no collective inside.
    _, _, metrics = pretrain_losses(family, model, batch, TaskConfig(), epoch=10**6)
    answers = []
    if family.answers:
        logits = family.answer_logits(family.forward(model, batch, decode=False))
        for j, i in enumerate(idx):
            ids, scores = data.labels(i)
            if ids and int(batch["matched"][j]) != 0:  # its own text (-1: an item without a pair label)
                answers.append((int(logits[j].argmax()), ids, scores))
    return metrics, answers


def retrieval(family, model, data: PretrainDataset, device: str, limit: int, captions_per_image: int = 1) -> dict:
    """Caption -> image R@K over the first `limit` images of the split, each queried with up
    to `captions_per_image` of its captions (the first ones); the queries shared out over
    the ranks."""
    captions = data.captions(limit, captions_per_image)
    image_rows = [rows[0] for rows in captions]
    if len(image_rows) < 2:
        return {}
    queries = [(row, target) for target, rows in enumerate(captions) for row in rows]
    collate, padding = torch.utils.data.default_collate, data.cfg.padding
    images = {k: v.to(device) for k, v in padded(collate([data.image(row) for row in image_rows]), padding).items()}

    def score(text_row: int) -> np.ndarray:
        # repeated, not a stride-0 view: a compiled backbone would recompile for the stride
        text = padded(collate([data.text(text_row)]), padding)
        text = {k: v.to(device).repeat(len(image_rows), 1) for k, v in text.items()}
        return family.pair_score(model, {**text, **images}).cpu().numpy()

    scores = np.stack(distributed.gather_shards([score(queries[q][0]) for q in distributed.shard(len(queries))]))
    recalls = recall_at_k(scores, np.array([t for _, t in queries]))
    return {
        "eval_retrieval_images": len(image_rows),
        "eval_retrieval_queries": len(queries),
        **{f"eval_retrieval_{k}": v for k, v in recalls.items()},
    }
