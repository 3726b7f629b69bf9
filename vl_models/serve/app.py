"""The web app of `vlprep serve`: Starlette routes rendering Jinja2 pages, served by uvicorn.

    /                               what is served
    /stores/NAME                    the gallery (?page, per, object, attribute, min_conf, q, from)
    /stores/NAME/image?id=ID        an image: its regions, its items in the tasks and mixtures
    /stores/NAME/card               the store's dataset card (provenance, counts, sizes)
    /stores/NAME/file?id=ID         the image file; /thumb?id=ID its thumbnail
    /tasks/NAME                     a task dataset or mixture (?page, q: an image id)
    /runs/NAME                      a run: curves, validation metrics, checkpoints, config
    /runs/NAME/curves.png           the curves `vltrain plot` draws
    /ask                            ask a run's model (GET: the form; POST: the answer)
    /api/ask                        the same, answered in JSON

Stores, tasks and runs are named, never given by path; an image by its id in a store (its file
is found under the ``--images`` roots only: `images`). Requests never write: the pages read
the stores, items and runs, and the model's answers stay in memory. A bad parameter is a page
(or JSON) saying what is wrong with HTTP 400, an unknown name 404; an unexpected error is a
page naming its type with HTTP 500 (the traceback goes to the server's log, not the page).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import socket
import threading
import time
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qsl, quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pipeline.errors import VlprepError
from vl_models.serve import gallery, items, runs
from vl_models.serve.ask import KINDS, Asker, AskError, kinds_of
from vl_models.serve.gallery import QueryError
from vl_models.serve.images import MAX_BYTES, Thumbnails, UploadError, blank_png, check_upload
from vl_models.serve.site import is_loopback

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
MAX_BODY = MAX_BYTES + (1 << 20)  # an upload at the downloader's cap, and the form's other fields
CARD_COUNT_LIMIT = 20_000  # a store up to this size has its regions counted for its card
PALETTE = [
    "#e6194b",
    "#3cb44b",
    "#ffe119",
    "#0082c8",
    "#f58231",
    "#911eb4",
    "#46f0f0",
    "#f032e6",
    "#d2f53c",
    "#fabebe",
    "#008080",
    "#aa6e28",
]
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}
LOCAL_HOSTS = ["127.0.0.1", "localhost"]


class SecurityHeaders:
    """Adds `HEADERS` to every response (pure ASGI: no buffering of the body)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {k.lower() for k, _ in headers}
                headers += [
                    (k.lower().encode(), v.encode()) for k, v in HEADERS.items() if k.lower().encode() not in present
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class Pages:
    """The routes' work, over one site."""

    def __init__(self, site, device: str = "cpu"):
        self.site = site
        self.asker = Asker(site, device)
        self.thumbs = Thumbnails()
        self.env = Environment(
            loader=PackageLoader("vl_models.serve", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(
            site=site,
            palette=PALETTE,
            q=lambda v: quote(str(v), safe=""),
            fmt_bytes=_fmt_bytes,
            kinds=list(KINDS),
        )
        self.env.filters["qs"] = lambda params: urlencode({k: v for k, v in params.items() if v not in (None, "")})

    def page(self, template: str, http_status: int = 200, **context) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(template).render(**context), status_code=http_status)

    def error(self, message: str, status: int) -> HTMLResponse:
        titles = {400: "This request cannot be answered", 403: "Refused", 404: "Not found", 413: "Too large"}
        titles[500] = "Server error"
        return self.page("error.html", status, title=titles.get(status, "Error"), message=message, status=status)

    # -- lookups ------------------------------------------------------------------------------

    def store(self, name: str):
        entry = self.site.stores.get(name)
        if entry is None:
            raise HTTPException(404, f"no store named {name!r} is served")
        return entry

    def items_entry(self, name: str):
        entry = self.site.items.get(name)
        if entry is None:
            raise HTTPException(404, f"no task dataset or mixture named {name!r} is served")
        return entry

    def run(self, name: str):
        entry = self.site.runs.get(name)
        if entry is None:
            raise HTTPException(404, f"no run named {name!r} is served")
        return entry

    def store_of(self, image_id: str) -> Optional[str]:
        """The first served store holding `image_id`."""
        for name, entry in self.site.stores.items():
            with entry.lock:
                if image_id in entry.store:
                    return name
        return None

    # -- pages --------------------------------------------------------------------------------

    def home(self, request: Request) -> HTMLResponse:
        stores = []
        for name, entry in self.site.stores.items():
            manifest = entry.manifest
            stores.append(
                {
                    "name": name,
                    "path": str(entry.path),
                    "records": len(entry.store),
                    "shards": len(manifest.shards),
                    "detector": manifest.provenance.get("detector") or "",
                    "images": bool(self.site.roots),
                }
            )
        tasks = [{"name": n, "kind": e.kind, "title": e.title, "path": str(e.path)} for n, e in self.site.items.items()]
        run_rows = []
        for name, entry in self.site.runs.items():
            config = entry.config
            run_rows.append(
                {
                    "name": name,
                    "path": str(entry.path),
                    "family": config.get("kind") or "",
                    "tasks": ", ".join(config.get("tasks") or []) or "pretraining",
                    "kinds": kinds_of(config),
                }
            )
        return self.page(
            "home.html", stores=stores, tasks=tasks, runs=run_rows, roots=[str(r) for r in self.site.roots]
        )

    def gallery(self, request: Request) -> Response:
        entry = self.store(request.path_params["store"])
        params = request.query_params
        store, total = entry.store, len(entry.store)
        per = gallery.number(params.get("per"), "per", gallery.PER_PAGE, 1, gallery.MAX_PER_PAGE)
        min_conf = gallery.number(params.get("min_conf"), "min_conf", 0.0, 0.0, 1.0, float)
        objects = gallery.label_id(params.get("object"), entry.objects, "object", "obj")
        attribute = gallery.label_id(params.get("attribute"), entry.attributes, "attribute", "attr")
        search = (params.get("q") or "").strip()
        if len(search) > 500:
            raise QueryError("the id searched for is longer than 500 characters")
        form = {
            "object": params.get("object") or "",
            "attribute": params.get("attribute") or "",
            "min_conf": params.get("min_conf") or "",
            "q": search,
            "per": per if per != gallery.PER_PAGE else "",
        }
        with entry.lock:
            if search and search in store:
                return RedirectResponse(f"/stores/{entry.name}/image?id={quote(search, safe='')}", 303)
            flt = gallery.Filter(objects, attribute, min_conf, search)
            if flt.active:
                start = gallery.number(params.get("from"), "from", 0, 0, total)
                found, stop = gallery.scan(store, flt, start, per)
                cards = [gallery.card(rec, entry.objects, entry.attributes, min_conf, flt, pos) for pos, rec in found]
                paging = {
                    "filtered": True,
                    "from": start,
                    "to": stop,
                    "next": {**form, "from": stop} if stop < total else None,
                    "first": {**form} if start > 0 else None,
                }
            else:
                pages = max(1, math.ceil(total / per))
                page = gallery.number(params.get("page"), "page", 1, 1, pages)
                cards = [
                    gallery.card(store.record_at(p), entry.objects, entry.attributes, min_conf, flt, p)
                    for p in gallery.positions(total, page, per)
                ]
                paging = {
                    "filtered": False,
                    "page": page,
                    "pages": pages,
                    "prev": {**form, "page": page - 1} if page > 1 else None,
                    "next": {**form, "page": page + 1} if page < pages else None,
                    "last": {**form, "page": pages} if page < pages else None,
                }
        return self.page(
            "gallery.html",
            entry=entry,
            total=total,
            cards=cards,
            form=form,
            paging=paging,
            min_conf=min_conf,
            has_images=bool(self.site.roots),
            recorded=entry.images.recorded_source,
            scan_limit=gallery.SCAN,
        )

    def image(self, request: Request) -> Response:
        entry = self.store(request.path_params["store"])
        params = request.query_params
        image_id = params.get("id")
        if image_id is None:
            raise QueryError("name the image: ?id=IMAGE_ID")
        min_conf = gallery.number(params.get("min_conf"), "min_conf", 0.0, 0.0, 1.0, float)
        limit = gallery.number(params.get("regions"), "regions", 0, 0, 10_000)
        with entry.lock:
            if image_id not in entry.store:
                raise HTTPException(404, f"image {image_id!r} is not in the store {entry.name}")
            rec = entry.store.get(image_id)
            order = gallery.shown(rec, min_conf, limit or None)
            rows = gallery.region_rows(rec, entry.objects, entry.attributes, order)
            total = len(entry.store)
            position = gallery.number(params.get("pos"), "pos", None, 0, max(total - 1, 0))
            neighbours = {}
            if position is not None and entry.store.record_at(position).image_id == image_id:
                for step, key in ((-1, "prev"), (1, "next")):
                    if 0 <= position + step < total:
                        neighbours[key] = (entry.store.record_at(position + step).image_id, position + step)
        found = []
        for name, task in self.site.items.items():
            try:
                hits = items.rows_of_image(task, image_id)
                if len(hits):
                    shown = items.describe(task, hits, items.ITEMS_PER_IMAGE)
                    found.append({"name": name, "entry": task, "count": len(hits), "items": shown})
            except (VlprepError, OSError) as err:
                found.append({"name": name, "entry": task, "count": 0, "items": [], "error": str(err)})
        return self.page(
            "image.html",
            entry=entry,
            rec={"id": image_id, "width": rec.image_w, "height": rec.image_h, "regions": rec.num_boxes},
            rows=rows,
            min_conf=min_conf,
            limit=limit,
            found=found,
            neighbours=neighbours,
            runs=[n for n, r in self.site.runs.items() if kinds_of(r.config)],
        )

    def card(self, request: Request) -> Response:
        from markdown_it import MarkdownIt

        from pipeline.formats.card import card_body, card_metadata, count_regions

        entry = self.store(request.path_params["store"])
        manifest = entry.manifest
        with entry.lock:
            counted = len(entry.store) <= CARD_COUNT_LIMIT
            counts = count_regions(entry.store) if counted else None
        name = entry.path.resolve().name
        body = card_body(manifest, name=name, counts=counts)
        header = json.dumps(card_metadata(manifest, name=name), indent=1, default=str)
        html = MarkdownIt("commonmark", {"html": False}).enable("table").render(body)
        records = manifest.num_records
        stored = sum(s.bytes for s in manifest.shards)
        sizes = {
            "records": f"{records:,}",
            "shards": f"{len(manifest.shards):,} ({manifest.layout.backend})",
            "bytes": _fmt_bytes(stored),
            "per image": _fmt_bytes(stored / records) if records else "-",
            "regions counted": "yes"
            if counted
            else f"no: more than {CARD_COUNT_LIMIT:,} records (vlprep inspect --card)",
        }
        return self.page("card.html", entry=entry, body=html, header=header, sizes=sizes)

    def file(self, request: Request) -> Response:
        entry = self.store(request.path_params["store"])
        image_id = self._known_id(entry, request)
        try:
            data, media_type, _ = entry.images.load(image_id)
        except LookupError as err:
            raise HTTPException(404, str(err)) from None
        return Response(data, media_type=media_type, headers={"Cache-Control": "private, max-age=600"})

    def thumb(self, request: Request) -> Response:
        entry = self.store(request.path_params["store"])
        image_id = self._known_id(entry, request)
        try:
            data, _, key = entry.images.load(image_id)
            small, media_type = self.thumbs.get(key, data)
        except LookupError:
            with entry.lock:
                rec = entry.store.get(image_id)
            small, media_type = blank_png(rec.image_w, rec.image_h), "image/png"
        return Response(small, media_type=media_type, headers={"Cache-Control": "private, max-age=600"})

    def _known_id(self, entry, request: Request) -> str:
        image_id = request.query_params.get("id")
        if image_id is None:
            raise QueryError("name the image: ?id=IMAGE_ID")
        with entry.lock:
            if image_id not in entry.store:
                raise HTTPException(404, f"image {image_id!r} is not in the store {entry.name}")
        return image_id

    def task(self, request: Request) -> Response:
        entry = self.items_entry(request.path_params["name"])
        params = request.query_params
        data = entry.data
        search = (params.get("q") or "").strip()
        if search:
            rows = items.rows_of_image(entry, search)
            pages, page = 1, 1
            shown = items.describe(entry, rows, items.ROWS_PER_PAGE)
            total = len(rows)
        else:
            total = len(data)
            pages = max(1, math.ceil(total / items.ROWS_PER_PAGE))
            page = gallery.number(params.get("page"), "page", 1, 1, pages)
            import numpy as np

            start = (page - 1) * items.ROWS_PER_PAGE
            shown = items.describe(entry, np.arange(start, min(total, start + items.ROWS_PER_PAGE)))
        for item in shown:
            item["links"] = [(key, self.store_of(key)) for key in item.get("images", [])]
        return self.page(
            "task.html",
            entry=entry,
            summary=items.summary(entry),
            items=shown,
            total=total,
            page=page,
            pages=pages,
            search=search,
        )

    def run_page(self, request: Request) -> Response:
        entry = self.run(request.path_params["name"])
        details = runs.info(entry.path)
        return self.page("run.html", entry=entry, info=details, kinds=kinds_of(entry.config))

    def curves(self, request: Request) -> Response:
        entry = self.run(request.path_params["name"])
        if not (entry.path / "metrics.jsonl").is_file():
            raise HTTPException(404, f"run {entry.name} has no metrics.jsonl yet")
        return Response(runs.curves_png(entry.path), media_type="image/png", headers={"Cache-Control": "no-cache"})

    def ask_form(self, request: Request) -> Response:
        params = dict(request.query_params)
        return self._ask_page(params, None, 200)

    def _ask_page(self, form: dict, answer: Optional[dict], status: int, error: Optional[str] = None) -> Response:
        run_names = list(self.site.runs)
        form = {k: str(v) for k, v in form.items() if isinstance(v, (str, int, float))}
        if not form.get("run") and run_names:
            form["run"] = next((n for n in run_names if kinds_of(self.site.runs[n].config)), run_names[0])
        if not form.get("store") and self.site.stores:
            form["store"] = next(iter(self.site.stores))
        run = self.site.runs.get(form.get("run", ""))
        run_kinds = {n: kinds_of(r.config) for n, r in self.site.runs.items()}
        return self.page(
            "ask.html",
            status,
            form=form,
            answer=answer,
            error=error,
            run_kinds=run_kinds,
            kinds_here=run_kinds.get(run.name, list(KINDS)) if run else list(KINDS),
        )

    def ask(self, form: dict, upload) -> dict:
        run = str(form.get("run") or "").strip()
        if not run:
            raise AskError("choose a run to ask" if self.site.runs else "no run is served: start with --runs DIR")
        return self.asker.ask(run, form, upload)


# -- forms --------------------------------------------------------------------------------------


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int = MAX_BODY) -> bytes:
    """The request's body, refused past `limit` bytes (before reading, by its Content-Length)."""
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise BodyTooLarge(f"the request is {int(length):,} bytes, more than {limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request is more than {limit:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_form(body: bytes, content_type: str) -> tuple[dict, Optional[tuple[str, bytes]]]:
    """A form's fields (text) and its uploaded image (file name, bytes), all in memory: url-encoded,
    multipart (python-multipart's parser, nothing spooled to disk) or a JSON object."""
    from python_multipart.multipart import MultipartParser, parse_options_header

    kind, options = parse_options_header(content_type or "")
    kind = kind.decode("latin-1").lower()
    if kind == "application/json":
        try:
            obj = json.loads(body or b"{}")
        except ValueError as err:
            raise QueryError(f"the body is not JSON: {err}") from None
        if not isinstance(obj, dict):
            raise QueryError("the body is a JSON object of the form's fields")
        fields = {k: ("\n".join(map(str, v)) if isinstance(v, list) else v) for k, v in obj.items()}
        return {k: v for k, v in fields.items() if isinstance(v, (str, int, float))}, None
    if kind == "application/x-www-form-urlencoded" or not kind:
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=200)
        except (UnicodeDecodeError, ValueError) as err:
            raise QueryError(f"the form cannot be read: {err}") from None
        return dict(pairs), None
    if kind != "multipart/form-data" or b"boundary" not in options:
        raise QueryError(f"a form is url-encoded, multipart or JSON, not {kind!r}")
    parts: list[dict] = []
    header = {"field": b"", "value": b""}

    def on_part_begin():
        parts.append({"headers": {}, "data": []})

    def on_header_field(data, start, end):
        header["field"] += data[start:end]

    def on_header_value(data, start, end):
        header["value"] += data[start:end]

    def on_header_end():
        parts[-1]["headers"][header["field"].decode("latin-1").lower()] = header["value"]
        header["field"], header["value"] = b"", b""

    def on_part_data(data, start, end):
        parts[-1]["data"].append(data[start:end])

    parser = MultipartParser(
        options[b"boundary"],
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_part_data": on_part_data,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except Exception as err:  # python-multipart's errors for a malformed body
        raise QueryError(f"the form cannot be read: {err}") from None
    if len(parts) > 50:
        raise QueryError("the form has too many parts")
    fields, upload = {}, None
    for part in parts:
        _, disposition = parse_options_header(part["headers"].get("content-disposition", b""))
        name = disposition.get(b"name", b"").decode("utf-8", "replace")
        data = b"".join(part["data"])
        if b"filename" in disposition:
            if name == "image" and data:
                upload = (disposition[b"filename"].decode("utf-8", "replace"), data)
            continue
        try:
            fields[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise QueryError(f"the form's field {name!r} is not UTF-8 text") from None
    return fields, upload


# -- the app ------------------------------------------------------------------------------------


def make_app(site, device: str = "cpu", host: str = "127.0.0.1") -> Starlette:
    """The app over `site`; `host` decides the Host headers accepted (a loopback bind accepts
    only local names: a page elsewhere cannot reach it by DNS rebinding)."""
    pages = Pages(site, device)

    def sync(method):
        def endpoint(request: Request):
            return method(request)

        endpoint.__name__ = method.__name__
        return endpoint

    async def ask_post(request: Request) -> Response:
        return await _ask(request, html=True)

    async def ask_api(request: Request) -> Response:
        return await _ask(request, html=False)

    async def _ask(request: Request, html: bool) -> Response:
        form: dict = {}
        if cross_site(request):
            return _failure(pages, html, form, "a form of another site cannot ask the models here", 403)
        try:
            body = await read_body(request)
            form, uploaded = parse_form(body, request.headers.get("content-type", ""))
            upload = None
            if uploaded is not None:
                upload = await run_in_threadpool(check_upload, uploaded[1], uploaded[0])
            answer = await run_in_threadpool(pages.ask, form, upload)
        except BodyTooLarge as err:
            return _failure(pages, html, form, f"{err}: an image is at most {MAX_BYTES:,} bytes", 413)
        except UploadError as err:
            return _failure(pages, html, form, f"the uploaded image cannot be used: {err.kind}: {err.detail}", 400)
        except (AskError, QueryError) as err:
            return _failure(pages, html, form, str(err), getattr(err, "status", 400))
        status = 400 if "error" in answer["result"] else 200  # the model's answer to a query it cannot answer
        if not html:
            return JSONResponse(_json_ready(answer), status_code=status)
        return pages._ask_page(form, answer, status)

    routes = [
        Route("/", sync(pages.home)),
        Route("/stores/{store}", sync(pages.gallery)),
        Route("/stores/{store}/image", sync(pages.image)),
        Route("/stores/{store}/card", sync(pages.card)),
        Route("/stores/{store}/file", sync(pages.file)),
        Route("/stores/{store}/thumb", sync(pages.thumb)),
        Route("/tasks/{name}", sync(pages.task)),
        Route("/runs/{name}", sync(pages.run_page)),
        Route("/runs/{name}/curves.png", sync(pages.curves)),
        Route("/ask", sync(pages.ask_form), methods=["GET"]),
        Route("/ask", ask_post, methods=["POST"]),
        Route("/api/ask", ask_api, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    async def http_error(request: Request, exc: HTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "not found"
        if exc.status_code == 405:
            message = f"{request.method} is not allowed here"
        if wants_json(request):
            return JSONResponse({"error": "http", "detail": message}, status_code=exc.status_code)
        return pages.error(message, exc.status_code)

    async def bad_query(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status", 400)
        if wants_json(request):
            return JSONResponse({"error": "bad query", "detail": str(exc)}, status_code=status)
        return pages.error(str(exc), status)

    async def damaged(request: Request, exc: VlprepError) -> Response:
        log.error("%s: %s", request.url.path, exc)
        if wants_json(request):
            return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=500)
        return pages.error(f"{type(exc).__name__}: {exc}", 500)

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("%s %s failed", request.method, request.url.path)
        message = f"an unexpected {type(exc).__name__} answering this page (the server's log has the details)"
        if wants_json(request):
            return JSONResponse({"error": "server error", "detail": message}, status_code=500)
        return pages.error(message, 500)

    allowed = sorted({*LOCAL_HOSTS, host}) if is_loopback(host) and ":" not in host else ["*"]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityHeaders), Middleware(TrustedHostMiddleware, allowed_hosts=allowed)],
        exception_handlers={
            HTTPException: http_error,
            QueryError: bad_query,
            AskError: bad_query,
            VlprepError: damaged,
            Exception: unexpected,
        },
    )
    app.state.pages = pages
    return app


def cross_site(request: Request) -> bool:
    """Whether a request comes from a page of another site: as the browser says (Sec-Fetch-Site),
    else by its Origin (an opaque ``null`` one included); a request from no page (a script, curl)
    has neither."""
    from urllib.parse import urlsplit

    fetched_from = request.headers.get("sec-fetch-site")
    if fetched_from is not None:
        return fetched_from == "cross-site"
    origin = request.headers.get("origin")
    if not origin:
        return False
    return origin == "null" or urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()


def _failure(pages: Pages, html: bool, form: dict, message: str, status: int) -> Response:
    if not html:
        return JSONResponse({"error": "bad query", "detail": message}, status_code=status)
    return pages._ask_page(form, None, status, error=message)


def _json_ready(answer: dict) -> dict:
    out = {"result": answer["result"], "query": answer["query"]}
    out["pictures"] = [
        {"name": p.name, "width": p.width, "height": p.height, "regions": len(p.boxes)} for p in answer["pictures"]
    ]
    return out


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


# -- serving ------------------------------------------------------------------------------------


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one); OSError when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def server_for(app, sock: socket.socket):
    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
    return uvicorn.Server(config)


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


class Running:
    """An app served in a thread of this process (tests, benches): `url`, and `stop()`."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        self.sock = listen(host, port)
        self.url = url_of(self.sock)
        self.app = app
        self.server = server_for(app, self.sock)
        self.thread = threading.Thread(target=self._run, daemon=True, name="vlprep-serve")
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()

    def __enter__(self) -> "Running":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
