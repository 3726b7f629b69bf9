"""Streaming JSON: iterate the members of a huge top-level array or object without
loading the file (Visual Genome's region descriptions and GQA's questions are GBs).

`iter_json(path)` yields (key, value) for a top-level object, (index, value) for a
top-level array; `iter_json(path, member="questions")` streams the array (or object)
stored under that key of a top-level object; `array=True` requires the streamed container
to be an array, `mapping=True` an object. Each member is decoded with the standard
library, under the rules of `pipeline.sources.base` (bad bytes and lone surrogates become U+FFFD; .gz files are
gunzipped; JSON is read strictly): a member holding NaN / Infinity or an integer of too
many digits, or nested too deep to decode, is yielded as a `Malformed` value named as the readers name rows
(``questions[3]``, ``[5]``, ``["q1"]``) and the stream goes on. Memory stays at one member
plus a read buffer; time is linear in the file, however large one member is (a member that
does not fit the buffer is read on in reads as large as what is already buffered, so it is
decoded again only a logarithmic number of times). A file that is not such JSON is a
ConfigError naming the file and the character where it goes wrong.
"""

from __future__ import annotations

import gc
import json
import math
import re
from pathlib import Path
from typing import Any, Iterator, Optional

from pipeline.errors import ConfigError
from pipeline.sources.base import TOO_DEEP, TOO_LONG, Malformed, finished_json, open_text

_CHUNK = 1 << 20
_WS = " \t\r\n"
_CUT = 16  # longer than any JSON literal ("-Infinity") or escape ("\\uXXXX")
_BRACKET_OR_QUOTE = re.compile(r'[\[\]{}"]')
_NUMBER_CHARS = re.compile(r"[-+0-9.eE]*")
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)  # after the opening quote, through the closing one


class _Unusable:
    """A member that is JSON but no data (`pipeline.sources.base.UNUSABLE`): why."""

    def __init__(self, reason: str):
        self.reason = reason


def _decode_uncollected(decoder: json.JSONDecoder, text: str, pos: int) -> tuple[Any, int]:
    """`decoder.raw_decode(text, pos)` with the cyclic garbage collector off (on again after,
    unless it was off before): a member larger than a read builds many objects at once,
    several times over, and the collector would walk them all again and again (JSON makes no
    cycles)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return decoder.raw_decode(text, pos)
    finally:
        if enabled:
            gc.enable()


class _Reader:
    def __init__(self, path: Path):
        self.path = path
        self.f = open_text(path)
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # characters dropped from the buffer before pos 0
        self.constant = False  # the decoder met NaN / Infinity since the last reset
        self.decoder = json.JSONDecoder(parse_constant=self._constant)

    def _constant(self, name: str) -> float:
        self.constant = True
        return math.nan

    def fill(self, size: Optional[int] = None) -> bool:
        """Drop the buffer before `pos` and append up to `size` (default `_CHUNK`) characters;
        False at the end."""
        chunk = self.f.read(size or _CHUNK)
        if not chunk:
            return False
        self.consumed += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def fill_more(self) -> bool:
        """`fill` with a read at least as large as what is buffered from `pos` on, so that a
        value decoded again after each refill is decoded O(log size) times (linear time)."""
        return self.fill(max(_CHUNK, len(self.buf) - self.pos))

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, chars: str) -> str:
        c = self.peek()
        if c == "" or c not in chars:
            self.fail(f"expected {' or '.join(repr(x) for x in chars)}, found {c or 'end of file'!r}")
        self.pos += 1
        return c

    def value(self) -> Any:
        """The next value, or `_Unusable` (the stream positioned after it) when it holds NaN /
        Infinity or an integer of too many digits or is nested too deep; ConfigError when it
        is not JSON."""
        self.peek()
        refilled = False
        while True:
            self.constant = False
            try:
                if refilled:
                    obj, end = _decode_uncollected(self.decoder, self.buf, self.pos)
                else:
                    obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except RecursionError:
                self.skip()
                return _Unusable(TOO_DEEP)
            except json.JSONDecodeError as err:
                # A value cut by the buffer's end fails there (within a literal's or an escape's
                # length of it), or as a string left open: read on; anything else is an error.
                if err.pos >= len(self.buf) - _CUT or err.msg.startswith("Unterminated"):
                    if self.fill_more():
                        refilled = True
                        continue
                self.pos = err.pos
                self.fail(f"invalid JSON: {err.msg}")
            except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
                self.skip()
                return _Unusable(TOO_LONG)
            # A number near the buffer's end may go on in the next chunk ("1" of "1.5", "1e-3").
            if end > len(self.buf) - _CUT and self.buf[end - 1] not in ']}"' and self.fill_more():
                refilled = True
                continue
            start, self.pos = self.pos, end
            try:
                return finished_json(obj, self.buf, start, end, self.constant)
            except json.JSONDecodeError as err:  # NON_FINITE or TOO_DEEP (`finished_json`)
                return _Unusable(err.msg)

    def skip(self) -> None:
        """Move past the value at `pos` without decoding it (one the decoder refuses: nested
        too deep, an integer of too many digits): a number by its characters, a container by
        matching brackets outside strings; ConfigError when the file ends inside it."""
        if self.buf[self.pos] not in "[{":
            while True:
                end = _NUMBER_CHARS.match(self.buf, self.pos).end()
                if end < len(self.buf) or not self.fill_more():
                    self.pos = end
                    return
        depth = 0
        while True:
            m = _BRACKET_OR_QUOTE.search(self.buf, self.pos)
            if m is None:
                self.pos = len(self.buf)
            elif m.group() == '"':
                rest = _STRING_REST.match(self.buf, m.end())
                if rest is not None:
                    self.pos = rest.end()
                    continue
                self.pos = m.start()  # the string goes on in the next chunk
            else:
                self.pos = m.end()
                depth += 1 if m.group() in "[{" else -1
                if depth == 0:
                    return
                continue
            if not self.fill_more():
                self.fail("invalid JSON: unterminated value")

    def fail(self, message: str) -> None:
        raise ConfigError(f"{self.path}: {message} at character {self.consumed + self.pos:,}")

    def close(self) -> None:
        self.f.close()


_KINDS = {"[": "an array", "{": "an object", '"': "a string", "": "the end of the file"}


def _kind(c: str) -> str:
    """What a JSON value starting with `c` is: "an array", "a number", ..."""
    return _KINDS.get(c, "a number" if c in "-0123456789" else "a literal" if c in "tfnNI" else repr(c))


def _members(r: _Reader, openers: str = "[{") -> Iterator[tuple[Any, Any]]:
    if r.peek() not in openers or r.peek() == "":
        found = r.peek()
        r.fail(
            f"expected {' or '.join(repr(c) for c in openers)}, found {found or 'end of file'!r} (not its format: "
            f"needs {' or '.join(_kind(c) for c in openers)}, found {_kind(found)})"
        )
    opener = r.expect(openers)
    closer = "]" if opener == "[" else "}"
    index = 0
    if r.peek() == closer:
        r.pos += 1
        return
    while True:
        if opener == "{":
            if r.peek() != '"':
                r.fail("expected a string key")
            key = r.value()
            r.expect(":")
        else:
            key = index
        yield key, r
        index += 1
        if r.expect("," + closer) == closer:
            return


def _where(container: Optional[str], key: Any) -> str:
    """A member's name as the readers name rows: ``questions[3]``, ``[5]``, ``["q1"]``."""
    return f"{container or ''}[{key if isinstance(key, int) else json.dumps(key)}]"


def iter_json(
    path: Path, member: Optional[str] = None, array: bool = False, mapping: bool = False
) -> Iterator[tuple[Any, Any]]:
    """(key or index, value) of each member of the streamed container (`array`: it must be an
    array, `mapping`: an object), in file order; a member that is JSON but no data is yielded
    as a `Malformed` value."""
    path = Path(path)
    openers = "[" if array else "{" if mapping else "[{"
    r = _Reader(path)

    def checked(key: Any, value: Any) -> Any:
        return Malformed(path, _where(member, key), value.reason) if isinstance(value, _Unusable) else value

    try:
        if member is None:
            for key, reader in _members(r, openers):
                yield key, checked(key, reader.value())
            return
        found = False
        for key, reader in _members(r, "{"):
            if key == member:
                found = True
                for inner_key, inner in _members(reader, openers):
                    yield inner_key, checked(inner_key, inner.value())
            else:
                reader.value()  # skip
        if not found:
            raise ConfigError(f"{path}: no {member!r} member at the top level")
    finally:
        r.close()
