"""`Predictor`: a trained model and its store's detector, answering queries about images.

The examples are the task's own (`Task.example` on a `TaskDataset` over the queries as
task-dataset rows), run through evaluation's batched forward (`transfer.evaluate.predict`,
`pair_scores` for rankings): on the items of a task split, a prediction is the answer, label,
box or choice `vltrain evaluate` gives, with its score beside it (`heads.readout`); for
rankings and `match` the pair head's logit and its sigmoid (the probability that the text
describes the image). A query that cannot be answered gets its named error and costs the
others nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from pipeline.detect.like_store import ImageInputError
from pipeline.download.fetch import redact_url
from pipeline.errors import ConfigError
from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore
from vl_models.data.tokenize import WordPiece
from vl_models.predict.heads import DEFAULT_ANSWERS, TaskHead, describe, head_for, readout
from vl_models.predict.images import ImageCache, ImageLike, StoreImage
from vl_models.predict.queries import PredictError, check_texts, detail_of, id_of, kind_of, sources_of, top_k_of
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import pair_scores, predict
from vl_models.transfer.heads import TransferModel


class _Rows:
    """Queries as rows of a task dataset (the fields of `pipeline.task_data.ITEMS_SCHEMA`), all
    in the one split ``query``: what `TaskDataset` reads of a `TaskData`."""

    splits = ("query",)

    def __init__(self, rows: list[dict], answers: Sequence[str], path: Optional[Path]):
        self._rows, self.answers, self.path = rows, list(answers), Path(path or ".")
        self._columns: dict[str, list] = {}

    def rows(self, split: str) -> np.ndarray:
        return np.arange(len(self._rows))

    def column(self, name: str) -> list:
        if name not in self._columns:
            self._columns[name] = [r.get(name) for r in self._rows]
        return self._columns[name]

    def store_keys(self, rows) -> set:
        return {k for r in rows for k in self._rows[int(r)]["images"]}


class Predictor:
    """A trained model with its store's detector, answering queries about images (see
    `vl_models.predict`). Build one with `load_predictor`."""

    def __init__(
        self,
        model: TransferModel,
        heads: dict[str, TaskHead],
        tokenizer: WordPiece,
        store: Optional[FeatureStore],
        detector_of,
        device: str,
        batch_size: int = 16,
        source: str = "",
    ):
        self.model, self.heads, self.tokenizer = model.to(device).eval(), heads, tokenizer
        self.family, self.store, self.device, self.batch_size = model.family, store, device, batch_size
        self.cache = ImageCache(store, detector_of)  # the images asked about, each extracted once
        self.source = source
        self.inputs: list[Path] = []  # what the predictor reads: the run, its store, vocab, task datasets

    @property
    def tasks(self) -> list[str]:
        """The tasks (heads) this predictor answers with."""
        return list(self.heads)

    @property
    def extracted(self) -> int:
        """Images run through the detector so far (those asked about again are not)."""
        return self.cache.extracted

    # -- one query each ---------------------------------------------------------------------

    def answer(self, image: ImageLike, question: str, k: int = 5, task: Optional[str] = None) -> list[tuple]:
        """The `k` best answers to `question` about `image`: [(answer, score)], best first."""
        out = self._one({"image": image, "question": question, "task": task}, k)
        return [(a["answer"], a["score"]) for a in out["top_k"]]

    def verify(self, left: ImageLike, right: ImageLike, statement: str, task: Optional[str] = None) -> tuple:
        """NLVR2: (whether `statement` is true of the two images, its probability)."""
        out = self._one({"images": [left, right], "statement": statement, "task": task})
        return out["label"], out["probability"]

    def ground(self, image: ImageLike, expression: str, task: Optional[str] = None) -> tuple:
        """The region `expression` refers to: (its box x1 y1 x2 y2 in pixels, its score)."""
        out = self._one({"image": image, "expression": expression, "task": task})
        return out["box"], out["score"]

    def rank(self, caption: str, images: Sequence[ImageLike], k: Optional[int] = None, task=None) -> list[tuple]:
        """`images` ranked for `caption` (folders expanded): [(image, score)], best first."""
        out = self._one({"caption": caption, "images": list(images), "task": task}, k)
        return [(r["image"], r["score"]) for r in out["ranking"]]

    def rank_captions(self, image: ImageLike, captions: Sequence[str], k: Optional[int] = None, task=None) -> list:
        """`captions` ranked for `image`: [(caption, score)], best first."""
        out = self._one({"image": image, "captions": list(captions), "task": task}, k)
        return [(r["caption"], r["score"]) for r in out["ranking"]]

    def choose(
        self,
        image: ImageLike,
        question: str,
        choices: Sequence[str],
        rationales: Optional[Sequence[str]] = None,
        task: Optional[str] = None,
    ) -> dict:
        """VCR: the choice's probabilities (``answer``, ``answer_probabilities``) and with
        `rationales` the rationale's, conditioned on each answer (``rationale_probabilities``)
        and on the chosen one (``rationale``)."""
        query = {"image": image, "question": question, "choices": list(choices), "task": task}
        if rationales is not None:
            query["rationales"] = list(rationales)
        return self._one(query)

    def match(self, image: ImageLike, text: str) -> float:
        """The probability that `text` describes `image` (the pair head: alignment / matching)."""
        return self._one({"image": image, "text": text})["probability"]

    def _one(self, query: dict, k: Optional[int] = None) -> dict:
        result = self.ask([{key: v for key, v in query.items() if v is not None}], k)[0]
        if "error" in result:
            raise PredictError(result["error"], result["detail"])
        return result

    # -- a batch ------------------------------------------------------------------------------

    def ask(self, queries: Sequence[dict], k: Optional[int] = None) -> list[dict]:
        """One result per query (JSON-ready, ``task`` and the query's ``id`` when it has one):
        queries of one task share forward passes (`batch_size` examples each); a query that
        cannot be answered gets ``error`` and ``detail`` and costs nothing else. A query's
        ``top_k`` (or else `k`) bounds its answers (default 5) or its ranking (default all)."""
        results: list[Optional[dict]] = [None] * len(queries)
        self.cache.new_batch()
        asked: dict[int, tuple[str, list]] = {}
        for i, query in enumerate(queries):
            try:
                task = head_for(self.heads, query, self.source)
                check_texts(query)
                top_k_of(query, k)
                asked[i] = (task, sources_of(query))
            except (PredictError, ImageInputError) as err:
                results[i] = _error(query, err.kind, detail_of(err))
            except ConfigError as err:
                results[i] = _error(query, "bad query", str(err))
        failed = self.extract([s for _, sources in asked.values() for s in sources])  # the detector's batches
        groups: dict[str, list[int]] = {}
        ready: dict[int, dict] = {}
        for i, (task, sources) in asked.items():
            try:
                bad = next((failed[str(s)] for s in sources if str(s) in failed), None)
                if bad is not None:
                    raise bad
                ready[i] = {
                    **queries[i],
                    "_keys": [self.cache.key_of(s) for s in sources],
                    "_names": [s.image_id if isinstance(s, StoreImage) else redact_url(str(s)) for s in sources],
                }
                groups.setdefault(task, []).append(i)
            except ImageInputError as err:
                results[i] = _error(queries[i], err.kind, detail_of(err))
        for name, members in groups.items():
            answered = self._run(name, [ready[i] for i in members], k)
            for i, result in zip(members, answered):
                results[i] = {**id_of(queries[i]), "task": name, **result}
        return results

    # -- images -------------------------------------------------------------------------------

    def extract(self, sources: Sequence) -> dict:
        """Read and extract the new pictures among `sources` at once (`ImageCache.extract`);
        returns the ones that could not be used, by source, with their errors."""
        return self.cache.extract(sources)

    def keys_of(self, query: dict) -> list[str]:
        """The store keys of the query's images (each extracted once, then kept)."""
        return [self.cache.key_of(source) for source in sources_of(query)]

    def image(self, source) -> tuple[str, RegionFeatures, Optional[bytes]]:
        """(id, regions, bytes as decoded) of an image asked about (`--show`)."""
        return self.cache.image(source)

    # -- forward ------------------------------------------------------------------------------

    def view(self, task: str, queries: Sequence[dict]) -> TaskDataset:
        """The task-dataset view `ask` forwards for `queries` to head `task` (their images
        extracted first): its examples are the batches the model sees."""
        head = self.heads[task]
        return self._view(head, [self._row({**q, "_keys": self.keys_of(q)}, head.task) for q in queries])

    def _view(self, head: TaskHead, rows: list[dict]) -> TaskDataset:
        return TaskDataset(
            data=_Rows(rows, head.answers, head.path),
            task=head.task,
            stores=[self.cache.records()],
            vocab=self.tokenizer,
            family=self.family,
            settings=head.settings,
            split="query",
            train=False,
        )

    def _run(self, name: str, queries: list[dict], k: Optional[int]) -> list[dict]:
        head = self.heads[name]
        task = head.task
        ks = [top_k_of(q, k) for q in queries]
        if task.head == "retrieval":
            return [self._rank(head, q, own) for q, own in zip(queries, ks)]
        ks = [own or DEFAULT_ANSWERS for own in ks]
        rows = [self._row(q, task) for q in queries]
        view = self._view(head, rows)
        scores = readout(task.head, self.model.heads[name], max(ks))
        predictions = predict(self.model, view, device=self.device, batch_size=self.batch_size, readout=scores)
        values, out = predictions.values, [dict() for _ in rows]
        for e, index in enumerate(values["index"]):
            row, answer = task.example_of(view, int(index))
            describe(task.head, out[row], {key: v[e] for key, v in values.items()}, head.answers, answer)
        for result, query, own in zip(out, queries, ks):
            if "top_k" in result:
                result["top_k"] = result["top_k"][:own]
            if task.head == "choice" and "rationales" not in query:
                result.pop("rationale_probabilities", None)  # the joint head's QA->R examples on no rationales
            chosen = result.get("answer", query.get("answer"))
            if "rationale_probabilities" in result and chosen is not None:
                result["rationale"] = int(np.argmax(result["rationale_probabilities"][int(chosen)]))
            if head.zero_shot:
                result["zero_shot"] = True
        return out

    @staticmethod
    def _row(query: dict, task) -> dict:
        kind = kind_of(query)
        text = query.get(
            {"answers": "question", "choice": "question", "pair": "statement", "regions": "expression"}[kind]
        )
        row = {"uid": str(query.get("id", "")), "text": text, "images": tuple(query["_keys"]), "box": [0.0] * 4}
        if kind == "choice":
            row.update(choices=query["choices"], rationales=query.get("rationales") or query["choices"])
            if query.get("answer") is not None:
                row["label"] = int(query["answer"])
        return row

    def _rank(self, head: TaskHead, query: dict, k: Optional[int]) -> dict:
        keys = query["_keys"]
        if query.get("caption") is not None:
            texts, images = [query["caption"]], keys
        elif query.get("captions") is not None:
            texts, images = list(query["captions"]), keys
        else:  # match: one text, one image
            texts, images = [query["text"]], keys
        view = self._view(head, [{"uid": str(i), "text": t, "images": (images[0],)} for i, t in enumerate(texts)])
        scores = pair_scores(
            self.model,
            view,
            captions=list(range(len(texts))),
            images=images,
            device=self.device,
            batch_size=self.batch_size,
        )
        result: dict = {"zero_shot": True} if head.zero_shot else {}
        if query.get("caption") is None and query.get("captions") is None:
            logit = float(scores[0, 0])
            return {**result, "probability": float(torch.sigmoid(torch.tensor(logit))), "logit": logit}
        if query.get("caption") is not None:
            order = np.argsort(-scores[0], kind="stable")
            ranking = [{"image": query["_names"][j], "score": float(scores[0, j])} for j in order]
        else:
            order = np.argsort(-scores[:, 0], kind="stable")
            ranking = [{"caption": texts[j], "score": float(scores[j, 0])} for j in order]
        return {**result, "ranking": ranking[:k] if k else ranking}


def _error(query: dict, kind: str, detail: str) -> dict:
    return {**id_of(query), "error": kind, "detail": detail}
