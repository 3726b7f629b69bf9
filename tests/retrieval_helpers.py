"""The uncached reference of retrieval scoring (`vl_models.transfer.evaluate.pair_scores`): every
caption x image pair through the whole model; and a spy on the callers' `pair_scores`."""

import numpy as np
import torch


def full_pair_scores(tmodel, view, rows, images) -> np.ndarray:
    """(len(rows), len(images)) scores of the view's rows' captions against `images` by full
    pair forwards (`ModelFamily.encode`, each pair padded to the maximum on its own): the
    uncached reference of `score_pairs`, through the task's head (the pair head, or a fine-tuned
    scorer of the pooled pair vector)."""
    from vl_models.transfer.heads import RetrievalHead

    family, head = tmodel.family, tmodel.heads[view.task.name]
    token = tmodel.task_tokens.get(view.task.name)
    collate = torch.utils.data.default_collate
    out = np.zeros((len(rows), len(images)), np.float32)
    for c, row in enumerate(rows):
        i = int(np.nonzero(view.rows == row)[0][0])
        text = view.text(view.value("text", i))
        batch = collate([{**view.candidates([(text, view.image(key))]), "x": 0} for key in images])
        with torch.no_grad():
            enc = family.encode(tmodel.backbone, batch, token)
            out[c] = (enc.pair if isinstance(head, RetrievalHead) else head.score(enc.pooled)).float().numpy()
    return out


def spy_on_pair_scores(monkeypatch, module) -> dict:
    """Replace `module.pair_scores` with one recording its last call: the model, view, caption rows,
    images and the scores."""
    from vl_models.transfer import evaluate

    seen = {}
    original = evaluate.pair_scores

    def spy(model, view, captions, images, *args, **kwargs):
        scores = original(model, view, captions, images, *args, **kwargs)
        seen.update(model=model, view=view, rows=view.rows[list(captions)], images=list(images), scores=scores)
        return scores

    monkeypatch.setattr(module, "pair_scores", spy)
    return seen


def assert_scores_as_full_forwards(seen: dict) -> None:
    """The scores a `spy_on_pair_scores` saw equal full pair forwards of the same pairs to 1e-5."""
    full = full_pair_scores(seen["model"].eval(), seen["view"], seen["rows"], seen["images"])
    assert full.shape == seen["scores"].shape
    assert np.abs(full - seen["scores"]).max() < 1e-5, np.abs(full - seen["scores"]).max()
