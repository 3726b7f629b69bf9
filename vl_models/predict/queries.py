"""What a query is: its kind (what it asks), the checks of its texts and its ``top_k``, the
images it names, its errors (`PredictError`), and the two ways a user gives queries: the
flags of `vltrain predict` (`query_of`) and a ``--queries`` JSON-lines file (`read_queries`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

from pipeline.detect.like_store import ImageInputError, image_sources
from pipeline.errors import ConfigError, VlprepError
from vl_models.predict.images import ImageBytes, ImageLike, StoreImage

TEXT_FIELDS = ("question", "statement", "expression", "caption", "text")
ASKED = {  # a query's kind, as an error names what was asked
    "answers": "a question",
    "choice": "a question with choices",
    "pair": "a statement",
    "regions": "an expression",
    "retrieval": "a caption",
    "match": "a text",
}


class PredictError(VlprepError, ValueError):
    """A query that cannot be answered: `kind` names the reason (``empty text``, ``no head``,
    ``bad query``, or an image's: ``decode error``, ``private address``, ...)."""

    exit_code = 2

    def __init__(self, kind: str, detail: str):
        self.kind, self.detail = kind, detail
        super().__init__(f"{kind}: {detail}")


def id_of(query) -> dict:
    """A result's ``id``: the query's, when it has one."""
    return {"id": query["id"]} if isinstance(query, dict) and "id" in query else {}


def detail_of(err: Union[PredictError, ImageInputError]) -> str:
    """An error's detail, naming the image where it is about one."""
    image = getattr(err, "image", None)
    return f"{image}: {err.detail}" if image and not str(err.detail).startswith(str(image)) else err.detail


def kind_of(query: dict) -> str:
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


def check_texts(query: dict) -> None:
    """PredictError for a query whose texts cannot be asked: a text field that is no text or
    is empty, a VCR ``answer`` that is no index of its choices, a lone surrogate, choices or
    rationales that are not 4 texts, captions that are not one or more texts."""
    for name in TEXT_FIELDS:
        if name in query and not isinstance(query[name], str):
            raise PredictError("bad query", f"the {name} must be a text, not {type(query[name]).__name__}")
        if name in query and not query[name].strip():
            raise PredictError("empty text", f"the {name} is empty")
    answer = query.get("answer")
    if answer is not None:
        if "choices" not in query or isinstance(answer, bool) or not isinstance(answer, int):
            raise PredictError("bad query", f"answer: the chosen answer's index (0-3) with its choices, not {answer!r}")
        if not 0 <= answer < len(query["choices"]):
            raise PredictError("bad query", f"answer {answer}: an index of the {len(query['choices'])} choices (0-3)")
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


def top_k_of(query: dict, k: Optional[int]) -> Optional[int]:
    """How many answers or ranked items a query gets: its ``top_k``, else `k` (None: the kind's
    default). PredictError for one below 1."""
    value = query.get("top_k", k)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise PredictError("bad query", f"top_k must be an integer >= 1, not {value!r}")
    return value


def sources_of(query: dict) -> list:
    """The images a query asks about, in order: a statement's two, the images a caption ranks
    (each folder replaced by its image files), else its one image."""
    images = query.get("images")
    kind = kind_of(query)
    if kind == "pair":
        if not isinstance(images, list) or len(images) != 2:
            raise PredictError("bad query", "a statement is about two images: give the left and the right")
        return list(images)
    if kind == "retrieval" and query.get("caption") is not None:
        if not images:
            raise PredictError("bad query", "a caption ranks images: give them (files, folders, URLs)")
        return [i for image in images for i in _expand(image)]
    if query.get("image") is None:
        raise PredictError("bad query", "give the image")
    return [query["image"]]


def _expand(image) -> list:
    return [image] if isinstance(image, (StoreImage, ImageBytes)) else image_sources([image])


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
