"""Asking a run's model from the page: `load_predictor` per run (the few asked last kept), one
query at a time.

A predictor keeps the features of the images it was asked about (by content: the same upload
again reuses them) and the detector sets torch's thread count around each extraction, so the
queries of every run go through one lock: parallel requests queue, they never interleave
inside a predictor. A store's image the run's own store holds is asked by id (no detector); an
image of another store, or an upload, goes through the run's detector from its bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from pipeline.errors import VlprepError

log = logging.getLogger(__name__)

KINDS = {  # what the form asks -> (the query's field, the head kinds that answer it)
    "question": ("question", ("answers", "choice")),
    "expression": ("expression", ("regions",)),
    "statement": ("statement", ("pair",)),
    "caption": ("caption", ("retrieval",)),
    "captions": ("captions", ("retrieval",)),
    "text": ("text", ("retrieval",)),
}
RANKED_IMAGES = 24  # images a caption ranks when none are named: the store's first
MAX_TEXT = 1_000  # characters of a question, expression, statement or caption
KEPT_PREDICTORS = 4


class AskError(ValueError):
    """A query the page cannot ask (shown on the page: `status` is the HTTP status)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass
class Picture:
    """An image of a query as the result page draws it: where its pixels come from (a URL of
    the site, or a data URL of an upload's preview) and its regions."""

    name: str
    src: str
    width: int
    height: int
    boxes: list  # every region, [x1, y1, x2, y2]


def kinds_of(run_config: dict) -> list[str]:
    """The kinds of query a run answers (from its config: no model loaded)."""
    from pipeline.errors import ConfigError
    from vl_models import families, transfer

    tasks = run_config.get("tasks") or []
    heads = set()
    for name in tasks:
        try:
            heads.add(transfer.get(name).head)
        except ConfigError:  # a task of another version: nothing to ask it
            continue
    if not tasks:  # a pretraining run: the pair head, and a QA head (LXMERT's) over its mixture's answers
        try:
            qa = "qa" in families.from_run(run_config).tasks
        except (ConfigError, KeyError):
            qa = False
        heads |= {"retrieval"} | ({"answers"} if qa else set())
    return [kind for kind, (_, fits) in KINDS.items() if heads & set(fits)]


class Asker:
    """The predictors of a site's runs, and the lock every query takes."""

    def __init__(self, site, device: str = "cpu", keep: int = KEPT_PREDICTORS):
        self.site, self.device, self.keep = site, device, keep
        self.lock = threading.Lock()
        self._predictors: OrderedDict = OrderedDict()
        self.asked = 0

    def predictor(self, run: str):
        """The run's predictor, loaded on first use (under the lock)."""
        from vl_models.predict import load_predictor
        from vl_models.serve.runs import default_step

        entry = self.site.runs.get(run)
        if entry is None:
            raise AskError(f"no run named {run!r} is served", 404)
        if run in self._predictors:
            self._predictors.move_to_end(run)
            return self._predictors[run]
        try:
            predictor = load_predictor(entry.path, device=self.device, step=default_step(entry.path))
        except (VlprepError, OSError, ValueError) as err:
            raise AskError(f"cannot load the model of run {run}: {err}") from None
        self._predictors[run] = predictor
        while len(self._predictors) > self.keep:
            self._predictors.popitem(last=False)
        return predictor

    def ask(self, run: str, form: dict, upload=None) -> dict:
        """Answer the form's query with the run's model: the predictor's result (``error`` and
        ``detail`` for a query it cannot answer), with ``features`` (``store``: the run's store
        had them; ``extracted``: the detector ran; ``reused``: an image asked about before),
        ``seconds`` and the pictures to draw."""
        with self.lock:
            started = time.perf_counter()
            predictor = self.predictor(run)
            query, pictures = self._query(predictor, form, upload)
            before = predictor.extracted
            result = predictor.ask([query])[0]
            self.asked += 1
            if "error" not in result:
                pictures = [self._picture(predictor, source, picture) for source, picture in pictures]
            else:
                pictures = [picture for _, picture in pictures]
            result["features"] = _features(query, predictor.extracted - before)
            result["seconds"] = round(time.perf_counter() - started, 4)
            return {"result": result, "pictures": pictures, "query": _shown(query)}

    # -- the query ----------------------------------------------------------------------------

    def _query(self, predictor, form: dict, upload) -> tuple[dict, list]:
        kind = str(form.get("kind") or "question")
        if kind not in KINDS:
            raise AskError(f"kind={kind[:40]!r}: ask a {', '.join(KINDS)}")
        field, _ = KINDS[kind]
        text = str(form.get("text") or "").strip()
        if len(text) > MAX_TEXT * (20 if kind == "captions" else 1):
            raise AskError(f"the {field} is longer than {MAX_TEXT:,} characters")
        query: dict = {}
        if kind == "captions":
            query["captions"] = [line.strip() for line in text.splitlines() if line.strip()]
        else:
            query[field] = text
        task = str(form.get("task") or "").strip()
        if task:
            query["task"] = task
        top_k = str(form.get("top_k") or "").strip()
        if top_k:
            if not top_k.isdigit() or not 1 <= int(top_k) <= 100:
                raise AskError(f"top_k={top_k[:20]!r}: a whole number from 1 to 100")
            query["top_k"] = int(top_k)
        choices = [c.strip() for c in str(form.get("choices") or "").splitlines() if c.strip()]
        if choices and kind == "question":
            query["choices"] = choices
        pictures = []
        if kind == "caption":
            ids = _ids(form.get("rank_ids"))
            store = self._store(form)
            if not ids:
                with store.lock:
                    ids = [store.store.record_at(i).image_id for i in range(min(RANKED_IMAGES, len(store.store)))]
            images = [self._image(predictor, store, i)[0] for i in ids[:200]]
            query["images"] = images
            return query, []
        first, picture = self._first_image(predictor, form, upload)
        pictures.append((first, picture))
        if kind == "statement":
            second_id = str(form.get("image_id2") or "").strip()
            if not second_id:
                raise AskError("a statement is about two images: name the second one's id (right image)")
            store = self._store(form)
            second, picture2 = self._image(predictor, store, second_id)
            query["images"] = [first, second]
            pictures.append((second, picture2))
        else:
            query["image"] = first
        return query, pictures

    def _first_image(self, predictor, form: dict, upload):
        from vl_models.predict import ImageBytes
        from vl_models.serve.images import data_url

        if upload is not None:
            source = ImageBytes(upload.data, upload.name)
            return source, Picture(
                upload.name, data_url(upload.preview, upload.preview_type), upload.width, upload.height, []
            )
        image_id = str(form.get("image_id") or "").strip()
        if not image_id:
            raise AskError("choose an image: a store's image id, or upload one")
        return self._image(predictor, self._store(form), image_id)

    def _store(self, form: dict):
        name = str(form.get("store") or "").strip()
        if not name and len(self.site.stores) == 1:
            name = next(iter(self.site.stores))
        store = self.site.stores.get(name)
        if store is None:
            raise AskError(f"no store named {name!r} is served" if name else "name the store of the image")
        return store

    def _image(self, predictor, store, image_id: str):
        """A store's image as the predictor takes it: by id where the run's store holds it, else
        its file's bytes (through the run's detector)."""
        from urllib.parse import quote

        from vl_models.predict import ImageBytes, StoreImage

        with store.lock:
            if image_id not in store.store:
                raise AskError(f"image {image_id!r} is not in the store {store.name}", 404)
            rec = store.store.get(image_id)
            size, boxes = (rec.image_w, rec.image_h), [[float(v) for v in b] for b in rec.boxes]
        src = f"/stores/{store.name}/file?id={quote(image_id, safe='')}"
        picture = Picture(image_id, src, size[0], size[1], boxes)
        own = predictor.store
        if own is not None and own.path.resolve() == store.path.resolve():
            return StoreImage(image_id), picture
        try:
            data, _, _ = store.images.load(image_id)
        except LookupError:
            raise AskError(
                f"image {image_id!r} of store {store.name} is not in the run's store ({own.path if own else 'none'}) "
                "and has no image file under --images: the model needs its features from the run's detector"
            ) from None
        return ImageBytes(data, image_id), picture

    def _picture(self, predictor, source, picture: Picture) -> Picture:
        """The regions the model saw of an image (a new image's come from the detector)."""
        from vl_models.predict import StoreImage

        if isinstance(source, StoreImage):
            return picture
        _, record, _ = predictor.image(source)
        picture.boxes = [[float(v) for v in b] for b in record.boxes]
        picture.width, picture.height = record.image_w, record.image_h
        return picture


def _ids(value) -> list[str]:
    return [part for part in str(value or "").replace(",", " ").split() if part]


def _features(query: dict, extracted: int) -> str:
    from vl_models.predict import StoreImage

    images = [query["image"]] if "image" in query else list(query.get("images") or [])
    if images and all(isinstance(i, StoreImage) for i in images):
        return "store"
    return "extracted" if extracted else "reused"


def _shown(query: dict) -> dict:
    """The query as the page repeats it (images by name)."""
    from vl_models.predict import StoreImage

    def name(image) -> str:
        return image.image_id if isinstance(image, StoreImage) else str(image)

    return {k: (name(v) if k == "image" else [name(i) for i in v] if k == "images" else v) for k, v in query.items()}
