"""Evaluation on a mixture's validation split: masked-LM accuracy, matching / alignment
accuracy, QA accuracy (LXMERT) and zero-shot caption -> image retrieval R@1/5/10 scored
by the alignment head."""

from __future__ import annotations

import numpy as np
import torch

from vl_models.data.dataset import PretrainDataset
from vl_models.eval.metrics import recall_at_k, vqa_score
from vl_models.tasks.losses import local_means
from vl_models.tasks.pretrain import TaskConfig, pretrain_losses


def alignment_scores(kind: str, model, batch: dict) -> torch.Tensor:
    """Higher = the text matches the image (ViLBERT: class 0 = aligned; LXMERT: 1 = matched)."""
    out = model(batch["input_ids"], batch["visual_feats"], batch["visual_pos"], batch["attention_mask"], batch["visual_mask"])
    logits = out.alignment_logits if kind == "vilbert" else out.matched_logits
    probs = torch.softmax(logits.float(), dim=-1)
    return probs[:, 0] if kind == "vilbert" else probs[:, 1]


@torch.no_grad()
def evaluate(kind: str, model, data: PretrainDataset, device: str = "cpu", batch_size: int = 32,
             max_items: int = 512, retrieval_images: int = 50) -> dict:
    was_training = model.training
    model.eval()
    collate = torch.utils.data.default_collate
    n = min(len(data), max_items)
    sums: dict = {}
    batches = 0
    qa_pred, qa_ids, qa_scores = [], [], []
    for start in range(0, n, batch_size):
        idx = list(range(start, min(n, start + batch_size)))
        batch = {k: v.to(device) for k, v in collate([data[i] for i in idx]).items()}
        with local_means():  # evaluation runs on rank 0 alone
            _, _, metrics = pretrain_losses(kind, model, batch, TaskConfig(), epoch=10**6)
        for k, v in metrics.items():
            if v == v:  # not NaN
                sums[k] = sums.get(k, 0.0) + v
        batches += 1
        if kind == "lxmert":
            out = model(batch["input_ids"], batch["visual_feats"], batch["visual_pos"], batch["attention_mask"],
                        batch["visual_mask"])
            for j, i in enumerate(idx):
                row = int(data.rows[i])
                ids = data.table.column("answer_ids")[row].as_py()
                if ids and int(batch["matched"][j]) == 1:
                    qa_pred.append(int(out.answer_logits[j].argmax()))
                    qa_ids.append(ids)
                    qa_scores.append(data.table.column("answer_scores")[row].as_py())
    result = {f"eval_{k}": v / batches for k, v in sums.items()}
    if qa_pred:
        result["eval_qa_score"] = vqa_score(np.array(qa_pred), qa_ids, qa_scores)
    result.update(retrieval(kind, model, data, device, retrieval_images))
    if was_training:
        model.train()
    return result


def retrieval(kind: str, model, data: PretrainDataset, device: str, limit: int) -> dict:
    """Caption -> image R@K over up to `limit` images, one caption each."""
    kinds = data.table.column("kind").to_numpy(zero_copy_only=False)
    chosen: dict[str, int] = {}
    for row in data.rows:
        image = data.images[row]
        if kinds[row] == "caption" and image not in chosen:
            chosen[image] = int(row)
            if len(chosen) == limit:
                break
    rows = list(chosen.values())
    if len(rows) < 2:
        return {}
    collate = torch.utils.data.default_collate
    scores = np.zeros((len(rows), len(rows)), np.float32)
    for qi, text_row in enumerate(rows):
        pairs = [data.pair(text_row, image_row) for image_row in rows]
        batch = {k: v.to(device) for k, v in collate(pairs).items()}
        scores[qi] = alignment_scores(kind, model, batch).cpu().numpy()
    return {f"eval_retrieval_{k}": v for k, v in recall_at_k(scores, np.arange(len(rows))).items()}
