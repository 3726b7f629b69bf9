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
feature store: no detector runs); the images a caption ranks may be
folders too (their image files). New
images go through the detector of the store the model was trained on, as that store's run
extracted its own (`pipeline.detect.like_store.StoreDetector`: same weights, preprocessing,
box policy; the same features, bitwise, as `vlprep extract` writes), once per image (kept
for the predictor's later questions).

The examples are the task's own (`Task.example` on a `TaskDataset` over the queries as
task-dataset rows), run through evaluation's batched forward (`transfer.evaluate.predict`,
`pair_scores` for rankings): on the items of a task split, a prediction is the answer, label,
box or choice `vltrain evaluate` gives, with its score beside it. The scores: an answer
head's sigmoid per answer (both references train it with BCE; LXMERT's pretraining QA head,
trained with cross-entropy, its softmax), NLVR2's softmax probability of True, a region's
sigmoid, VCR's softmax over the four choices, and for rankings and `match` the pair head's
logit (and its sigmoid: the probability that the text describes the image).

Which head answers: the query's fields say the kind (a question: an answer classifier, or
with choices a 4-way choice; a statement and two images: the pair classifier; an expression:
the region scorer; a caption and images, or an image and captions: the retrieval head, else
the pretraining pair head; an image and a text: the pretraining pair head, or a fine-tuned
run's retrieval head); ``task`` picks one where the
run has several of that kind. A pretraining run answers zero-shot: LXMERT's pretraining QA
head over its mixture's answer table, either family's pair head.

Bad input (an image that cannot be read, decoded or fetched; an empty text; no head for the
query) is a named error: `ask` reports it in that query's result (``error``, ``detail``) and
answers the others; the single-query methods raise it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from pipeline.detect.like_store import ImageInputError, ProvenanceError, StoreDetector, image_sources
from pipeline.download.fetch import FetchConfig, redact_url
from pipeline.errors import ConfigError, VlprepError
from pipeline.mixture import Mixture
from pipeline.records import RegionFeatures
from pipeline.store import FeatureStore
from pipeline.store.manifest import IDENTITY_KEYS
from pipeline.task_data import TaskData
from vl_models import distributed, families, transfer
from vl_models.config import DataSettings
from vl_models.data.tokenize import WordPiece
from vl_models.models.weights import init_pretraining
from vl_models.train import checkpoint
from vl_models.train.run_folder import answers_digest
from vl_models.train.trainer import resolve_device
from vl_models.transfer.dataset import TaskDataset
from vl_models.transfer.evaluate import pair_scores, predict
from vl_models.transfer.heads import RetrievalHead, TransferModel, build_transfer_model, run_heads
from vl_models.transfer.retrieval import FLICKR30K
from vl_models.transfer.runs import backbone_state, data_settings, is_finetuned
from vl_models.transfer.vcr import QA2R
from vl_models.transfer.vqa import TASK as VQA

log = logging.getLogger(__name__)

PAIR_HEAD = "pair-head"  # the pretraining pair head, under the name the model's heads know it by
TEXT_FIELDS = ("question", "statement", "expression", "caption", "text")
KEPT_IMAGES = 64  # extracted images kept for later questions
DEFAULT_ANSWERS = 5  # answers a question gets unless it says (rankings: every item)
ASKED = {  # a query's kind, as an error names what was asked
    "answers": "a question",
    "choice": "a question with choices",
    "pair": "a statement",
    "regions": "an expression",
    "retrieval": "a caption",
    "match": "a text",
}


@dataclass(frozen=True)
class StoreImage:
    """An image of a feature store, by id (the run's store unless the predictor was given one)."""

    image_id: str


@dataclass(frozen=True)
class ImageBytes:
    """An image given as its bytes (an upload, say: nothing is written to disk), read under the
    same rules as a file (size cap, sniffing, decompression-bomb checks) and, like a file, known
    by its content: the same bytes asked about again reuse their features. ``str()`` names it
    by `name` and the start of its sha256."""

    data: bytes = field(repr=False)
    name: str = "upload"

    def __post_init__(self) -> None:
        digest = hashlib.sha256(self.data).hexdigest()
        object.__setattr__(self, "_label", f"{self.name}#{digest[:12]}")

    def __str__(self) -> str:
        return self._label


ImageLike = Union[str, Path, StoreImage, ImageBytes]


class PredictError(VlprepError, ValueError):
    """A query that cannot be answered: `kind` names the reason (``empty text``, ``no head``,
    ``bad query``, or an image's: ``decode error``, ``private address``, ...)."""

    exit_code = 2

    def __init__(self, kind: str, detail: str):
        self.kind, self.detail = kind, detail
        super().__init__(f"{kind}: {detail}")


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


class _Records:
    """Region records by image id, read as a store's (`layout`: the store they join)."""

    def __init__(self, layout, records: dict[str, RegionFeatures]):
        self.layout, self._records = layout, records

    def __contains__(self, key) -> bool:
        return key in self._records

    def get(self, key: str) -> RegionFeatures:
        return self._records[key]


class _PretrainingAnswers(nn.Module):
    """LXMERT's pretraining QA head (over its mixture's answer table) as an answer head."""

    softmax = True  # trained with cross-entropy over the answers

    def __init__(self, logit_fc: nn.Module):
        super().__init__()
        self.logit_fc = logit_fc

    def forward(self, enc, batch: dict) -> torch.Tensor:
        return self.logit_fc(enc.pooled)


@dataclass
class _Head:
    """A task the predictor answers with: its `Task`, answer table, data settings and the task
    dataset folder it was trained on (VCR's names table), and what kind of run gave it."""

    task: object
    answers: list
    settings: DataSettings
    path: Optional[Path] = None
    zero_shot: bool = False


def _id_of(query) -> dict:
    """A result's ``id``: the query's, when it has one."""
    return {"id": query["id"]} if isinstance(query, dict) and "id" in query else {}


def _kind(query: dict) -> str:
    """The head kind a query asks for (`heads` kinds, plus ``match``); one thing per query."""
    asked = [
        n for n in ("question", "statement", "expression", "caption", "captions", "text") if query.get(n) is not None
    ]
    if len(asked) > 1:
        raise PredictError(
            "bad query", f"ask one thing: a question, statement, expression, caption or text (got {', '.join(asked)})"
        )
    if query.get("question") is not None:
        return "choice" if query.get("choices") is not None else "answers"
    if query.get("statement") is not None:
        return "pair"
    if query.get("expression") is not None:
        return "regions"
    if query.get("caption") is not None or query.get("captions") is not None:
        return "retrieval"
    if query.get("text") is not None:
        return "match"
    raise PredictError("bad query", f"ask a question, statement, expression, caption or text (got {sorted(query)})")


class Predictor:
    """A trained model with its store's detector, answering queries about images (see the
    module's docstring). Build one with `load_predictor`."""

    def __init__(
        self,
        model: TransferModel,
        heads: dict[str, _Head],
        tokenizer: WordPiece,
        store: Optional[FeatureStore],
        detector_of,
        device: str,
        batch_size: int = 16,
        source: str = "",
    ):
        self.model, self.heads, self.tokenizer = model.to(device).eval(), heads, tokenizer
        self.family, self.store, self.device, self.batch_size = model.family, store, device, batch_size
        self._detector_of, self._detector = detector_of, None
        self.source = source
        self.inputs: list[Path] = []  # what the predictor reads: the run, its store, vocab, task datasets
        # ("store", id) or ("content", sha256 of the bytes) -> (image id, record, image bytes or None):
        # an image is known by what it holds, so a file replaced at the same path is a new picture
        self._images: OrderedDict = OrderedDict()
        self._sources: dict[str, tuple] = {}  # a file or URL of the current batch -> its key in _images
        self.extracted = 0  # images run through the detector so far (those asked about again are not)

    @property
    def tasks(self) -> list[str]:
        """The tasks (heads) this predictor answers with."""
        return list(self.heads)

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
        self._trim()
        self._sources = {}  # files and URLs are read again: one replaced since is a new picture
        asked: dict[int, tuple[str, list]] = {}
        for i, query in enumerate(queries):
            try:
                task = self._task_of(query)
                self._check_texts(query, self.heads[task].task)
                _top_k(query, k)
                asked[i] = (task, self.sources_of(query))
            except (PredictError, ImageInputError) as err:
                results[i] = self._error(query, err.kind, _detail(err))
            except ConfigError as err:
                results[i] = self._error(query, "bad query", str(err))
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
                    "_keys": [self._image(s) for s in sources],
                    "_names": [s.image_id if isinstance(s, StoreImage) else redact_url(str(s)) for s in sources],
                }
                groups.setdefault(task, []).append(i)
            except ImageInputError as err:
                results[i] = self._error(queries[i], err.kind, _detail(err))
        for name, members in groups.items():
            answered = self._run(name, [ready[i] for i in members], k)
            for i, result in zip(members, answered):
                results[i] = {**_id_of(queries[i]), "task": name, **result}
        return results

    @staticmethod
    def _error(query: dict, kind: str, detail: str) -> dict:
        return {**_id_of(query), "error": kind, "detail": detail}

    def _task_of(self, query: dict) -> str:
        if not isinstance(query, dict):
            raise PredictError("bad query", f"a query is a JSON object, not {type(query).__name__}")
        kind = _kind(query)
        if kind == "match":
            return PAIR_HEAD if PAIR_HEAD in self.heads else self._named(query, "retrieval", kind)
        return self._named(query, kind, kind)

    def _named(self, query: dict, kind: str, asked: str) -> str:
        fits = [n for n, h in self.heads.items() if h.task.head == kind]
        if kind == "retrieval" and not fits and PAIR_HEAD in self.heads:
            fits = [PAIR_HEAD]
        wanted = query.get("task")
        if wanted is not None:
            if wanted not in fits:
                raise PredictError(
                    "no head",
                    f"--task {wanted}: not a head of {self.source} for this query (fitting: {fits or 'none'})",
                )
            return wanted
        if not fits:
            raise PredictError(
                "no head",
                f"{self.source} has no head for {ASKED.get(asked, 'a ' + asked)} "
                f"(its heads: {', '.join(self.heads) or 'none'})",
            )
        if len(fits) > 1:
            raise PredictError("bad query", f"several heads fit ({', '.join(fits)}): say which with --task / task")
        return fits[0]

    @staticmethod
    def _check_texts(query: dict, task) -> None:
        if isinstance(task, QA2R) and ("rationales" not in query or query.get("answer") is None):
            raise PredictError("bad query", f"{task.name} scores rationales: give the 4 rationales and the answer")
        for name in TEXT_FIELDS:
            if name in query and not isinstance(query[name], str):
                raise PredictError("bad query", f"the {name} must be a text, not {type(query[name]).__name__}")
            if name in query and not query[name].strip():
                raise PredictError("empty text", f"the {name} is empty")
        answer = query.get("answer")
        if answer is not None:
            if "choices" not in query or isinstance(answer, bool) or not isinstance(answer, int):
                raise PredictError(
                    "bad query", f"answer: the chosen answer's index (0-3) with its choices, not {answer!r}"
                )
            if not 0 <= answer < len(query["choices"]):
                raise PredictError(
                    "bad query", f"answer {answer}: an index of the {len(query['choices'])} choices (0-3)"
                )
        for name in (*TEXT_FIELDS, "choices", "rationales", "captions"):
            values = query.get(name)
            for value in values if isinstance(values, list) else [values]:
                if isinstance(value, str):
                    try:
                        value.encode("utf-8")
                    except UnicodeEncodeError:
                        raise PredictError("bad text", f"the {name} holds a lone surrogate (not UTF-8 text)") from None
        for name, count in (("choices", 4), ("rationales", 4)):
            if name in query:
                values = query[name]
                if not isinstance(values, list) or len(values) != count:
                    raise PredictError("bad query", f"{name}: {count} texts, not {values!r}")
                if not all(isinstance(v, str) and v.strip() for v in values):
                    raise PredictError("empty text", f"one of the {name} is empty")
        if "captions" in query and not (
            isinstance(query["captions"], list)
            and query["captions"]
            and all(isinstance(c, str) and c.strip() for c in query["captions"])
        ):
            raise PredictError("empty text", "captions: give one or more texts")

    # -- images -------------------------------------------------------------------------------

    def sources_of(self, query: dict) -> list:
        images = query.get("images")
        kind = _kind(query)
        if kind == "pair":
            if not isinstance(images, list) or len(images) != 2:
                raise PredictError("bad query", "a statement is about two images: give the left and the right")
            return list(images)
        if kind == "retrieval" and query.get("caption") is not None:
            if not images:
                raise PredictError("bad query", "a caption ranks images: give them (files, folders, URLs)")
            return [i for image in images for i in (self._expand(image))]
        if query.get("image") is None:
            raise PredictError("bad query", "give the image")
        return [query["image"]]

    @staticmethod
    def _expand(image) -> list:
        return [image] if isinstance(image, (StoreImage, ImageBytes)) else image_sources([image])

    def keys_of(self, query: dict) -> list[str]:
        """The store keys of the query's images (each extracted once, then kept)."""
        return [self._image(source) for source in self.sources_of(query)]

    def _key(self, source) -> tuple:
        """The key `source`'s image is kept under (a file or URL is read by `extract` first)."""
        if isinstance(source, StoreImage):
            return ("store", source.image_id)
        if str(source) not in self._sources:
            error = self.extract([source]).get(str(source))
            if error is not None:
                raise error
        return self._sources[str(source)]

    def _image(self, source) -> str:
        cache_key = self._key(source)
        if cache_key[0] == "content":
            self._images.move_to_end(cache_key)
            return self._images[cache_key][0]
        if cache_key in self._images:
            self._images.move_to_end(cache_key)
            return self._images[cache_key][0]
        if self.store is None or source.image_id not in self.store:
            where = self.store.path if self.store is not None else "no store"
            raise ImageInputError(source.image_id, "not in the store", f"{where} has no such id")
        self._images[cache_key] = (source.image_id, self.store.get(source.image_id), None)
        return source.image_id

    def _trim(self) -> None:
        """Forget the images asked about longest ago beyond `KEPT_IMAGES` (between batches only:
        a batch's images stay until it is answered)."""
        while len(self._images) > KEPT_IMAGES:
            self._images.popitem(last=False)

    def extract(self, sources: Sequence) -> dict[str, ImageInputError]:
        """Read the files and URLs among `sources` (each once per batch: a file replaced since an
        earlier batch is read anew), and extract the pictures not seen before at once (the
        detector's batches; an image the detector fails on fails alone), so that questions about
        them find them ready; returns the ones that could not be used, by source, with their
        errors."""
        given = {str(s): s for s in sources if isinstance(s, ImageBytes)}
        todo = list(dict.fromkeys(str(s) for s in sources if not isinstance(s, StoreImage)))
        todo = [source for source in todo if source not in self._sources]
        if not todo:
            return {}
        if self._detector is None:
            self._detector = self._detector_of()
        fresh, failed = {}, {}
        for source in todo:
            try:
                data = self._detector.read(source) if source not in given else self._held(given[source])
                key = ("content", hashlib.sha256(data).hexdigest())
                if key not in self._images and key not in fresh:
                    fresh[key] = (source, self._detector.load(source, data))
                self._sources[source] = key
            except ImageInputError as err:
                failed[source] = err
        for key, (source, image), record in zip(fresh, fresh.values(), self._extract_each(list(fresh.values()))):
            if isinstance(record, ImageInputError):
                failed[source] = record
                self._sources = {s: k for s, k in self._sources.items() if k != key}
            else:
                self._images[key] = (image.image_id, record, image.data)
                self.extracted += 1
        return failed

    def _held(self, image: ImageBytes) -> bytes:
        """An in-memory image's bytes, under the size cap a file or a download has."""
        cap = self._detector.fetch_cfg.max_bytes
        if len(image.data) > cap:
            raise ImageInputError(str(image), "too large", f"{len(image.data):,} bytes, more than {cap:,}")
        return image.data

    def _extract_each(self, loaded: list) -> list:
        """The records of `loaded` (source, image) pairs in the detector's batches; where a batch
        fails, its images one by one, and an image that fails alone gets its error (an image of
        extreme aspect ratio, say, whose feature map has no pixel)."""
        try:
            return self._detector.extract([image for _, image in loaded])
        except Exception:
            if len(loaded) == 1:
                source, image = loaded[0]
                try:
                    return self._detector.extract([image])
                except Exception as err:  # the detector on this image: its error, not the batch's
                    return [ImageInputError(image.image_id, "extract error", f"{type(err).__name__}: {err}")]
            return [record for item in loaded for record in self._extract_each([item])]

    def image(self, source) -> tuple[str, RegionFeatures, Optional[bytes]]:
        """(id, regions, bytes as decoded) of an image asked about (`--show`)."""
        self._image(source)
        return self._images[self._key(source)]

    def _records(self) -> _Records:
        layout = self.store.layout if self.store is not None else None
        return _Records(layout, {key: record for key, record, _ in self._images.values()})

    # -- forward ------------------------------------------------------------------------------

    def _view(self, head: _Head, rows: list[dict]) -> TaskDataset:
        return TaskDataset(
            _Rows(rows, head.answers, head.path),
            head.task,
            [self._records()],
            self.tokenizer,
            self.family,
            head.settings,
            "query",
            train=False,
        )

    def _run(self, name: str, queries: list[dict], k: Optional[int]) -> list[dict]:
        head = self.heads[name]
        task = head.task
        ks = [_top_k(q, k) for q in queries]
        if task.head == "retrieval":
            return [self._rank(name, head, q, own) for q, own in zip(queries, ks)]
        ks = [own or DEFAULT_ANSWERS for own in ks]
        rows = [self._row(q, task) for q in queries]
        view = self._view(head, rows)
        module = self.model.heads[name]
        readout = _readout(task.head, module, max(ks))
        predictions = predict(self.model, view, self.device, self.batch_size, readout=readout)
        values, out = predictions.values, [dict() for _ in rows]
        for e, index in enumerate(values["index"]):
            row, answer = task.example_of(view, int(index))
            _describe(task.head, out[row], {key: v[e] for key, v in values.items()}, head.answers, answer)
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
        kind = _kind(query)
        text = query.get(
            {"answers": "question", "choice": "question", "pair": "statement", "regions": "expression"}[kind]
        )
        row = {"uid": str(query.get("id", "")), "text": text, "images": tuple(query["_keys"]), "box": [0.0] * 4}
        if kind == "choice":
            row.update(choices=query["choices"], rationales=query.get("rationales") or query["choices"])
            if query.get("answer") is not None:
                row["label"] = int(query["answer"])
        return row

    def _rank(self, name: str, head: _Head, query: dict, k: Optional[int]) -> dict:
        keys = query["_keys"]
        if query.get("caption") is not None:
            texts, images = [query["caption"]], keys
        elif query.get("captions") is not None:
            texts, images = list(query["captions"]), keys
        else:  # match: one text, one image
            texts, images = [query["text"]], keys
        view = self._view(head, [{"uid": str(i), "text": t, "images": (images[0],)} for i, t in enumerate(texts)])
        scores = pair_scores(self.model, view, list(range(len(texts))), images, self.device, self.batch_size)
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


def _detail(err: Union[PredictError, ImageInputError]) -> str:
    """An error's detail, naming the image where it is about one."""
    image = getattr(err, "image", None)
    return f"{image}: {err.detail}" if image and not str(err.detail).startswith(str(image)) else err.detail


def _top_k(query: dict, k: Optional[int]) -> Optional[int]:
    """How many answers or ranked items a query gets: its ``top_k``, else `k` (None: the kind's
    default). PredictError for one below 1."""
    value = query.get("top_k", k)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise PredictError("bad query", f"top_k must be an integer >= 1, not {value!r}")
    return value


def _readout(kind: str, head: nn.Module, k: int):
    """The per-example scores `vltrain predict` keeps beside the task's predictions."""

    def answers(logits, batch):
        probs = logits.float().softmax(-1) if getattr(head, "softmax", False) else logits.float().sigmoid()
        top = probs.topk(min(max(k, 1), probs.shape[-1]), dim=-1)
        return {"top_ids": top.indices.cpu().numpy(), "top_scores": top.values.cpu().numpy()}

    def pair(logits, batch):
        return {"probability": logits.float().softmax(-1)[:, 1].cpu().numpy()}

    def regions(logits, batch):
        return {"region_score": logits.float().max(-1).values.sigmoid().cpu().numpy()}

    def choice(logits, batch):
        return {"probabilities": logits.float().softmax(-1).cpu().numpy()}

    return {"answers": answers, "pair": pair, "regions": regions, "choice": choice}[kind]


def _describe(kind: str, out: dict, values: dict, answers: list, conditioned: int) -> None:
    """Fill a query's result from one of its examples' prediction values."""
    if kind == "answers":
        top = [{"answer": answers[int(a)], "score": float(s)} for a, s in zip(values["top_ids"], values["top_scores"])]
        out.update(answer=answers[int(values["answer"])], score=top[0]["score"], top_k=top)
    elif kind == "pair":
        out.update(label=bool(values["label"]), probability=float(values["probability"]))
    elif kind == "regions":
        out.update(
            box=[float(v) for v in values["box"]], score=float(values["region_score"]), region=int(values["region"])
        )
    else:
        probs = [float(p) for p in values["probabilities"]]
        if conditioned < 0:
            out.update(answer=int(np.argmax(probs)), answer_probabilities=probs)
        else:
            out.setdefault("rationale_probabilities", [None] * len(probs))[conditioned] = probs


def load_predictor(
    source: Union[str, Path],
    device: str = "cpu",
    step: Union[int, str, None] = None,
    weights: Optional[Union[str, Path]] = None,
    detector: Optional[str] = None,
    store: Optional[Union[str, Path]] = None,
    vocab: Optional[Union[str, Path]] = None,
    task_data: Optional[dict] = None,
    fetch: FetchConfig = FetchConfig(),
    batch_size: int = 16,
    detector_threads: Optional[int] = None,
) -> Predictor:
    """A `Predictor` for a run of ours (its ``latest`` checkpoint, or `step`: a number, ``best``):
    a fine-tuning run's task heads, or a pretraining run's zero-shot heads (the pair head;
    LXMERT's QA head over its mixture's answers). New images go through the detector of the
    run's store (or `store`'s) as `StoreDetector` finds it (`weights` / `detector` where the
    recorded ones are not at hand; `detector_threads`: CPU threads for it, default every CPU for
    the region detectors, whose features are the same at any thread count, and the store's run's
    for the others, for bitwise-equal features). `task_data`: task name -> task dataset folder, where the
    run's recorded one is not there (its answer table)."""
    device = resolve_device(device, distributed.world()[2])
    path = Path(source)
    if not path.exists():  # a broken symbolic link, or a loop of them, too
        link = " (a symbolic link to nothing, or a loop of links)" if path.is_symlink() else ""
        raise ConfigError(f"--checkpoint {source} does not exist{link}")
    ckpt = checkpoint.resolve(path, step, role="--checkpoint")
    state = checkpoint.load(ckpt, "--checkpoint")
    run = state.get("run")
    if not run:
        raise ConfigError(f"{source}: not a run of vltrain (its checkpoint records no run)")
    family = families.from_run(run)
    mcfg = family.config_class.from_json(run["model"])
    train = run["train"]
    store_path = Path(store or _recorded(train.get("stores"), "feature store", "--store"))
    if store:
        _check_same_detector(store_path, train.get("stores") or ())
    vocab_path = Path(vocab or _recorded(train.get("vocab"), "vocab", "--vocab"))
    heads: dict[str, _Head] = {}
    unknown = sorted(set(task_data or {}) - set(run.get("tasks") or ()))
    if unknown:
        raise ConfigError(
            f"--task-data {', '.join(unknown)}: {source} has no such head "
            f"(its heads: {', '.join(run.get('tasks') or ()) or 'none: a pretraining run'})"
        )
    if is_finetuned(run):
        tasks = [transfer.get(name) for name in run["tasks"]]
        folders = dict(zip(run["tasks"], train.get("task_data") or ()))
        folders.update(task_data or {})
        tables = {t.name: _answer_table(t, folders.get(t.name), run) for t in tasks}
        model = build_transfer_model(family, mcfg, tasks, [_Table(tables[t.name]) for t in tasks], **run_heads(run))
        model.load_state_dict(backbone_state(ckpt, heads=tuple(run["tasks"])))
        for t in tasks:
            folder = folders.get(t.name)
            heads[t.name] = _Head(t, tables[t.name], data_settings(run, t.name), Path(folder) if folder else None)
    else:
        backbone = family.build(mcfg)
        init_pretraining(backbone, ckpt, family.load_checkpoint)
        modules: dict[str, nn.Module] = {PAIR_HEAD: RetrievalHead(1)}
        settings = data_settings(run)
        pair_task = copy.copy(FLICKR30K)
        pair_task.name = PAIR_HEAD
        heads[PAIR_HEAD] = _Head(pair_task, [], settings, zero_shot=True)
        mixture = train.get("mixture")
        if family.answers and mixture and Path(mixture).is_dir():
            modules[VQA.name] = _PretrainingAnswers(family.qa_head(backbone))
            heads[VQA.name] = _Head(VQA, Mixture.open(mixture).answers, settings, zero_shot=True)
        model = TransferModel(family, backbone, modules)
    opened = FeatureStore.open(store_path, dtype="float32") if store_path.exists() else None
    inputs = [Path(source), store_path, vocab_path, *(h.path for h in heads.values() if h.path is not None)]
    if weights is not None:
        inputs.append(Path(weights))
    predictor = Predictor(
        model,
        heads,
        WordPiece(vocab_path),
        opened,
        lambda: StoreDetector.of(store_path, weights, detector, device, fetch, detector_threads),
        device,
        batch_size,
        str(source),
    )
    predictor.inputs = inputs
    return predictor


class _Table:
    """An answer table where `build_transfer_model` expects a task dataset."""

    def __init__(self, answers: list):
        self.answers = answers


def _answer_table(task, folder: Optional[str], run: dict) -> list:
    """A classifier task's answer table (the task dataset's the run was trained on, checked by
    its digest); [] for the other heads."""
    if task.head != "answers":
        return []
    if not folder or not Path(folder).is_dir():
        raise ConfigError(
            f"the {task.name} head's answer table is in its task dataset {folder}, which is not there: "
            f"name it with --task-data {task.name}=FOLDER"
        )
    data = TaskData.open(folder, task=task.name)
    if answers_digest(data) != run["answers"][task.name]:
        raise ConfigError(f"{folder}: its answer table is not the one the {task.name} head was trained on")
    return list(data.answers)


def _check_same_detector(store: Path, recorded: Sequence[str]) -> None:
    """`--store`'s detector is the one the run's recorded store was extracted with (its
    provenance's detector, weights, box policy and preprocessing); unknown when that store is
    not on this machine (said in the log)."""
    here = [Path(p) for p in recorded if Path(p).exists()]
    if not here:
        log.warning("--store %s: the run's own store is not here to check that the detector is the same", store)
        return
    keys = (*IDENTITY_KEYS, "preprocess")
    theirs = {k: FeatureStore.open(here[0]).manifest.provenance.get(k) for k in keys}
    ours = {k: FeatureStore.open(store).manifest.provenance.get(k) for k in keys}
    differ = [k for k in keys if theirs[k] != ours[k]]
    if differ:
        raise ProvenanceError(
            f"--store {store}: its features come from another detector than the run's store {here[0]} "
            f"({', '.join(f'{k} {ours[k]!r}, not {theirs[k]!r}' for k in differ)})"
        )


def _recorded(value, what: str, flag: str) -> str:
    value = value[0] if isinstance(value, (list, tuple)) and value else value
    if not value:
        raise ConfigError(f"{flag}: the run records no {what}; name it")
    if not Path(value).exists():
        raise ConfigError(f"the run's {what} {value} is not there: name it with {flag}")
    return str(value)


def query_of(
    images: Sequence[ImageLike] = (),
    rank_images: Sequence[ImageLike] = (),
    question: Optional[str] = None,
    statement: Optional[str] = None,
    expression: Optional[str] = None,
    captions: Sequence[str] = (),
    text: Optional[str] = None,
    choices: Sequence[str] = (),
    rationales: Sequence[str] = (),
    answer: Optional[int] = None,
    task: Optional[str] = None,
) -> dict:
    """The query `vltrain predict`'s flags ask (ConfigError for a combination that asks nothing
    or two things): `images` the ``--image`` / ``--image-id`` ones, `rank_images` ``--images``."""
    asked = [
        n
        for n, v in (
            ("--question", question),
            ("--statement", statement),
            ("--expression", expression),
            ("--caption", captions or None),
            ("--text", text),
        )
        if v is not None
    ]
    if len(asked) != 1:
        raise ConfigError(
            "ask one thing: --question, --statement, --expression, --caption or --text"
            + (f" (got {', '.join(asked)})" if asked else "")
        )
    query: dict = {"task": task} if task else {}
    if statement is not None:
        return {**query, "images": list(images), "statement": statement}
    if captions:
        if rank_images:
            if len(captions) != 1:
                raise ConfigError("--images ranks images for one --caption")
            return {**query, "caption": captions[0], "images": list(rank_images)}
        return {**query, "image": _only(images), "captions": list(captions)}
    query["image"] = _only(images)
    if question is not None:
        query["question"] = question
        if choices:
            query["choices"] = list(choices)
        if rationales:
            query["rationales"] = list(rationales)
        if answer is not None:
            query["answer"] = answer
    elif expression is not None:
        query["expression"] = expression
    else:
        query["text"] = text
    return query


def _only(images: Sequence[ImageLike]) -> ImageLike:
    if len(images) != 1:
        raise ConfigError(f"--image: this asks about one image, not {len(images)}")
    return images[0]


def recorded_inputs(source: Union[str, Path]) -> list[Path]:
    """What a run folder's config.json says its model reads (its stores, vocab, task datasets),
    read without loading the checkpoint: what `vltrain predict` keeps its outputs off before it
    takes their locks ([] for a checkpoint file outside a run folder; `load_predictor` knows)."""
    config = Path(source) / "config.json"
    try:
        train = json.loads(config.read_text(encoding="utf-8")).get("train", {}) if config.is_file() else {}
    except (OSError, ValueError, RecursionError, AttributeError):
        return []
    named = [*(train.get("stores") or ()), train.get("vocab"), *(train.get("task_data") or ())]
    return [Path(p) for p in named if isinstance(p, str) and p]


MAX_QUERY_LINE = 1 << 20  # bytes of one --queries line (a question is a few hundred)


def read_queries(path: Path) -> Iterator[dict]:
    """The queries of a ``--queries`` JSON-lines file, streamed (never the whole file in memory):
    each line's query (`query_from_json`), or, for a line that cannot be one, ``{"id": "line N",
    "_bad": why}`` (longer than `MAX_QUERY_LINE`, not UTF-8, not JSON, nested too deep). A
    UTF-8 byte-order mark before the first line is skipped. ConfigError when the file cannot
    be read at all."""
    try:
        handle = open(path, "rb")
    except OSError as err:
        raise ConfigError(f"--queries {path}: cannot read it: {err.strerror}") from err
    with handle:
        number = 0
        while True:
            line = handle.readline(MAX_QUERY_LINE + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_QUERY_LINE and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # skip the rest of the line, a bounded read at a time
                    line = handle.readline(MAX_QUERY_LINE)
                yield {"id": f"line {number}", "_bad": f"longer than {MAX_QUERY_LINE:,} bytes"}
                continue
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as err:
                yield {"id": f"line {number}", "_bad": f"not UTF-8 ({err.reason} at byte {err.start})"}
                continue
            try:
                yield query_from_json(json.loads(text))
            except RecursionError:
                yield {"id": f"line {number}", "_bad": "JSON nested too deep"}
            except ValueError as err:  # JSONDecodeError, or a PredictError of a line that is no query
                yield {
                    "id": f"line {number}",
                    "_bad": f"not JSON: {err}" if isinstance(err, json.JSONDecodeError) else str(err),
                }


def local_images(query: dict) -> list[Path]:
    """The local files a query names (not URLs, not store ids): what an output must not replace."""
    named = [query.get("image"), *(query.get("images") if isinstance(query.get("images"), list) else [])]
    return [Path(n) for n in named if isinstance(n, str) and n and "://" not in n]


def query_from_json(obj) -> dict:
    """A query of a ``--queries`` JSON line: its fields as `ask` takes them, with ``image_id`` /
    ``image_ids`` turned into `StoreImage`s (PredictError for a line that is no object)."""
    if not isinstance(obj, dict):
        raise PredictError("bad query", f"a query line is a JSON object, not {type(obj).__name__}")
    query = {k: v for k, v in obj.items() if k not in ("image_id", "image_ids")}
    if "image_id" in obj:
        query["image"] = StoreImage(str(obj["image_id"]))
    if "image_ids" in obj:
        if not isinstance(obj["image_ids"], list):
            raise PredictError("bad query", "image_ids: a list of store ids")
        query["images"] = [StoreImage(str(i)) for i in obj["image_ids"]]
    return query


def picture(predictor: Predictor, query: dict, result: dict, title: str = ""):
    """The image(s) of a query with their regions (thin grey), `title`, what was asked and the
    answer on top: the grounded box (thick), the verdict, the ranking's best images with their
    scores. A PIL image."""
    from PIL import Image, ImageDraw, ImageFont

    from pipeline.detect.show import side_by_side
    from pipeline.images import load_rgb

    def tile(source, highlight=None, note: str = "") -> Image.Image:
        _, record, data = predictor.image(source)
        im = Image.fromarray(load_rgb(data)) if data else Image.new("RGB", (record.image_w, record.image_h), "gray")
        draw = ImageDraw.Draw(im)
        for box in record.boxes:
            draw.rectangle([float(v) for v in box], outline=(200, 200, 200), width=1)
        if highlight is not None:
            draw.rectangle(highlight, outline=(230, 25, 75), width=max(3, im.width // 120))
        if note:
            font = ImageFont.load_default(size=max(12, im.height // 20))
            draw.rectangle(draw.textbbox((4, 4), note, font=font), fill=(255, 255, 255))
            draw.text((4, 4), note, fill=(0, 0, 0), font=font)
        return im

    asked = next((query[f] for f in TEXT_FIELDS if f in query), " / ".join(query.get("captions") or []))
    if "error" in result:
        lines, tiles = [asked, f"error: {result['error']}: {result['detail']}"], []
    elif "ranking" in result and "image" in result["ranking"][0]:
        lines = [asked]
        by_key = dict(zip(predictor.keys_of(query), predictor.sources_of(query)))
        tiles = [
            tile(by_key[r["image"]], note=f"#{n + 1}  {r['score']:.2f}") for n, r in enumerate(result["ranking"][:8])
        ]
    elif "label" in result:
        lines = [asked, f"{result['label']} (p = {result['probability']:.2f})"]
        tiles = [tile(s) for s in query["images"]]
    elif "box" in result:
        lines = [asked, f"score {result['score']:.2f}"]
        tiles = [tile(query["image"], highlight=result["box"])]
    elif "top_k" in result:
        lines = [asked, "  ".join(f"{a['answer']} {a['score']:.2f}" for a in result["top_k"])]
        tiles = [tile(query["image"])]
    elif "answer_probabilities" in result:
        probs = result["answer_probabilities"]
        lines = [asked, f"{query['choices'][result['answer']]} (p = {probs[result['answer']]:.2f})"]
        tiles = [tile(query["image"])]
    elif "ranking" in result:
        lines = [asked, *(f"{r['score']:.2f}  {r['caption']}" for r in result["ranking"][:8])]
        tiles = [tile(query["image"])]
    else:
        lines = [asked, f"p = {result['probability']:.2f}"]
        tiles = [tile(query["image"])]
    lines = [title, *lines] if title else lines
    font = ImageFont.load_default(size=16)
    row = side_by_side(tiles, gap=4) if tiles else None
    width = int(max([row.width if row else 0, *(font.getlength(str(x)) + 12 for x in lines)]))
    top = 8 + 22 * len(lines)
    canvas = Image.new("RGB", (width, top + (row.height if row else 0) + 4), "white")
    draw = ImageDraw.Draw(canvas)
    for n, line in enumerate(lines):
        draw.text((6, 4 + 22 * n), str(line), fill=(0, 0, 0), font=font)
    if row:
        canvas.paste(row, (0, top))
    return canvas
