"""Asking a trained model about images of one's own: `load_predictor` and `vltrain predict`.

    p = load_predictor("runs/vqa", device="cpu")     # the run's model, and its store's detector
    p.answer("photo.jpg", "what is on the table?", k=5)   # [(answer, score), ...]
    p.verify("left.jpg", "right.jpg", "both images show a dog")   # (True, 0.83)
    p.ground("photo.jpg", "the man on the left")      # ([x1, y1, x2, y2], score)
    p.rank("a dog in the snow", ["a.jpg", "b.jpg"])   # [(image, score), ...] best first
    p.choose("x.jpg", question, choices, rationales)  # VCR: probabilities per choice
    p.match("photo.jpg", "a dog in the snow")         # the pair head's probability
    p.ask([{"image": ..., "question": ...}, ...])      # a batch: one JSON-ready dict per query

An image is a file, an ``http(s)`` URL (fetched under the downloader's rules), an
`ImageBytes` (an image's bytes, held in memory: an upload), or a `StoreImage` (an id of a
feature store: no detector runs); the images a caption ranks may be folders too (their image
files). New images go through the detector of the store the model was trained on, as that
store's run extracted its own (`pipeline.detect.like_store.StoreDetector`: same weights,
preprocessing, box policy; the same features, bitwise, as `vlprep extract` writes), once per
image (kept for the predictor's later questions).

Which head answers: the query's fields say the kind (a question: an answer classifier, or
with choices a 4-way choice; a statement and two images: the pair classifier; an expression:
the region scorer; a caption and images, or an image and captions: the retrieval head, else
the pretraining pair head; an image and a text: the pretraining pair head, or a fine-tuned
run's retrieval head); ``task`` picks one where the run has several of that kind. A
pretraining run answers zero-shot: LXMERT's pretraining QA head over its mixture's answer
table, either family's pair head.

Bad input (an image that cannot be read, decoded or fetched; an empty text; no head for the
query) is a named error: `ask` reports it in that query's result (``error``, ``detail``) and
answers the others; the single-query methods raise it.

One concern per module: `queries` (what a query is, its checks, the flags' and a
``--queries`` file's queries), `images` (the images asked about and their regions: the cache,
the store's detector), `heads` (which head answers, and how its scores are read out),
`predictor` (`Predictor`: the batched forward), `load` (a run loaded as a predictor, and the
checks of what it reads), `draw` (`picture`), `config` (`PredictConfig`: the command's
settings) and `command` (`vltrain predict`). The names below are imported from their module
on first use, so that the command line's flags (`config`, `command`) load without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {  # public name -> the module of this package that owns it
    "load_predictor": "load",
    "recorded_inputs": "load",
    "Predictor": "predictor",
    "TaskHead": "heads",
    "PAIR_HEAD": "heads",
    "StoreImage": "images",
    "ImageBytes": "images",
    "ImageLike": "images",
    "PredictError": "queries",
    "query_of": "queries",
    "query_from_json": "queries",
    "read_queries": "queries",
    "local_images": "queries",
    "MAX_QUERY_LINE": "queries",
    "picture": "draw",
    "PredictConfig": "config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
