"""The rules every source reader follows, in one place so the readers cannot drift apart.

* Files are UTF-8 (a ``.gz`` file is read through gzip); bytes that are not UTF-8 become
  U+FFFD, and so do lone surrogates (``\\ud800`` escapes in JSON: text no UTF-8 file can
  hold). A file that is not of its format at all (invalid JSON, the wrong top level), or
  that cannot be read at all (not gzip, truncated, an I/O error: `reading`), is a
  ConfigError naming it.
* A row, line or JSON member without the format's shape is a `Malformed` (file, where in
  it, why), yielded in file order; a reader never stops at one. What to do with it is the
  caller's choice: `vlprep download` / `extract` count and list them, `vlprep
  build-mixture` refuses the input (ConfigError naming the first).
* JSON is read strictly: ``NaN``, ``Infinity`` and ``-Infinity`` (which Python's json
  accepts), nesting too deep for the decoder and an integer of more digits than Python
  converts are a `json.JSONDecodeError` whose msg is `NON_FINITE` / `TOO_DEEP` / `TOO_LONG`
  (`UNUSABLE`), so a JSON line or streamed member holding one is a
  `Malformed` and a whole-file format holding one is a ConfigError. A number too large for
  a float (``1e400``: valid JSON, read as infinity; an integer of 400 digits) is refused by
  the readers that use numbers as floats (boxes, scores: `finite_numbers`); elsewhere it is
  never read.
* A row whose id (VQA's question_id, NLVR2's identifier, VCR's annot_id, Karpathy's file
  name and sentid) repeats an earlier row's of the same file is skipped as "duplicate id"
  (`Skip`): the first is kept.
* Texts (captions, region descriptions, questions, statements) are cleaned by `clean_text`:
  outer whitespace stripped, inner runs of whitespace made one space. A null or non-string
  text is skipped as "null text", a blank one as "empty text", a question whose answer is
  null as "null answer" (`Skip`, naming the image): data, not errors.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import reprlib
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, TypeVar, Union

from pyarrow import ArrowException

from pipeline.errors import ConfigError

T = TypeVar("T")

NULL_TEXT = "null text"
EMPTY_TEXT = "empty text"
NULL_ANSWER = "null answer"
DUPLICATE_ID = "duplicate id"
NON_FINITE = "a non-finite number (NaN or Infinity), which JSON does not allow"
TOO_DEEP = "nested too deeply"
TOO_LONG = "an integer with too many digits"  # more than Python converts (sys.get_int_max_str_digits)
UNUSABLE = (NON_FINITE, TOO_DEEP, TOO_LONG)  # the msg of a JSONDecodeError for JSON Python reads but that is no data


@dataclass(frozen=True)
class Malformed:
    """A source row that could not be read: its file, where in it, and why."""

    path: Path
    where: str  # a line number ("12"), a JSON position ("annotations[3]", "[5]", '["q1"]')
    reason: str

    @property
    def location(self) -> str:
        """``file.tsv:12``, ``captions_train2014.json:annotations[3]``."""
        return f"{self.path.name}:{self.where}"

    def __str__(self) -> str:
        return f"{self.location}: {self.reason}"


@dataclass(frozen=True)
class Skip:
    """An annotation with no usable text (or a question with a null answer), left out and
    counted under `reason`; `source` names the part of a multi-source file it came from
    (LXMERT's json: mscoco, vg, vqa, ...), empty otherwise."""

    image: str
    reason: str  # NULL_TEXT | EMPTY_TEXT | NULL_ANSWER | DUPLICATE_ID
    source: str = ""


def clean_text(text: str) -> str:
    """`text` with outer whitespace stripped and inner whitespace runs made one space."""
    return " ".join(text.split())


def text_or_skip(image: str, value: Any, source: str = "") -> Union[str, Skip]:
    """The cleaned text of an annotation of `image`, or the `Skip` saying why there is none."""
    if not isinstance(value, str):
        return Skip(image, NULL_TEXT, source)
    text = clean_text(value)
    return text if text else Skip(image, EMPTY_TEXT, source)


def is_int(value: Any) -> bool:
    """A JSON integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_id(value: Any) -> bool:
    """An image id as the official files write them: an integer or a non-empty string."""
    return is_int(value) or (isinstance(value, str) and value != "")


def open_text(path: Path) -> IO[str]:
    """A text file, transparently gunzipped when it ends in .gz; bad bytes are replaced."""
    path = Path(path)
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")


SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(value: Any) -> Any:
    """`value` (a string, or lists and dicts of them) with every surrogate code point (a
    lone surrogate from JSON, an undecodable file-name byte) replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replace_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {replace_surrogates(k): replace_surrogates(v) for k, v in value.items()}
    return value


def all_finite(value: Any) -> bool:
    """Whether no float in `value` (lists and dicts of any depth, walked without recursion)
    is NaN or infinite."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float):
            if not math.isfinite(v):
                return False
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return True


def finite_numbers(values: Iterable[Any]) -> bool:
    """Whether every value is a number (not a boolean) that a float holds: not NaN or
    infinite (``1e400`` reads as infinity), nor an integer too large for a float."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        try:
            if not math.isfinite(v):  # an int is converted to float here
                return False
        except OverflowError:
            return False
    return True


def finished_json(value: Any, text: str, start: int, end: int, constant: bool) -> Any:
    """`value`, decoded from ``text[start:end]``, made data: lone surrogates replaced
    (`replace_surrogates`); a `json.JSONDecodeError` of msg `NON_FINITE` when the decoder
    met a NaN / Infinity constant (`constant`), of msg `TOO_DEEP` when the value is nested
    too deep to walk."""
    if constant:
        raise json.JSONDecodeError(NON_FINITE, text, start)
    try:
        if SURROGATE_ESCAPE.search(text, start, end):
            value = replace_surrogates(value)
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, text, start) from None
    return value


def _refuse_constant(name: str) -> Any:
    raise json.JSONDecodeError(NON_FINITE, name, 0)


_STRICT = json.JSONDecoder(parse_constant=_refuse_constant)


def load_json(text: str) -> Any:
    """The JSON value of `text`, read strictly: lone surrogates (``\\ud800`` escapes)
    replaced by U+FFFD, as undecodable bytes are (`open_text`); a `json.JSONDecodeError`,
    of msg `NON_FINITE` / `TOO_DEEP` / `TOO_LONG` for NaN / Infinity, nesting too deep or
    an integer of too many digits."""
    try:
        value = _STRICT.decode(text)
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, text, 0) from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise json.JSONDecodeError(TOO_LONG, text, 0) from None
    return finished_json(value, text, 0, len(text), False)


def parse_json(text: str, path: Path) -> Any:
    """`load_json` of the text of file `path`; ConfigError naming the file (and the line and
    column where it goes wrong) when it is not strict JSON."""
    try:
        return load_json(text)
    except json.JSONDecodeError as err:
        if err.msg in UNUSABLE:
            raise ConfigError(f"{path}: not usable JSON: {err.msg}") from err
        raise ConfigError(f"{path}: invalid JSON at line {err.lineno} column {err.colno}: {err.msg}") from err


def load_json_file(path: Path) -> Any:
    """A whole JSON file (`open_text`, `parse_json`)."""
    with open_text(path) as f:
        return parse_json(f.read(), path)


@contextmanager
def reading(what: str) -> Iterator[None]:
    """Inside: an input that cannot be read at all (not gzip, truncated, not Parquet, an I/O
    error) becomes a ConfigError naming `what` instead of a traceback."""
    try:
        yield
    except (OSError, EOFError, zlib.error, ArrowException) as err:
        raise ConfigError(f"{what}: cannot be read ({type(err).__name__}: {err})") from err


def named_read_errors(results: Iterator[T], what: str) -> Iterator[T]:
    """`results`, read under `reading(what)`."""
    with reading(what):
        yield from results


def shown(value: Any) -> str:
    """A short repr of a value read from a file, for a message: bounded in length and depth
    (a hostile value may be huge or nested thousands deep)."""
    return reprlib.repr(value)


def base_name(path: Path) -> str:
    """File name without .gz and the last suffix: 'Train_GCC-training.tsv.gz' -> 'Train_GCC-training'."""
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return name.rsplit(".", 1)[0] if "." in name else name
