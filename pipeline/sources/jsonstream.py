"""Streaming JSON: iterate the members of a huge top-level array or object without
loading the file (Visual Genome's region descriptions and GQA's questions are GBs).

`iter_json(path)` yields (key, value) for a top-level object, (index, value) for a
top-level array; `iter_json(path, member="questions")` streams the array (or object)
stored under that key of a top-level object; `array=True` requires the streamed container
to be an array. Each member is decoded with the standard library, under the rules of
`pipeline.sources.base` (bad bytes and lone surrogates become U+FFFD; .gz files are
gunzipped); memory stays at one member plus a read buffer. A file that is not such JSON is a
ConfigError naming the file and the character where it goes wrong.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Optional

from pipeline.errors import ConfigError
from pipeline.sources.base import SURROGATE_ESCAPE, open_text, replace_surrogates

_CHUNK = 1 << 20
_WS = " \t\r\n"


class _Reader:
    def __init__(self, path: Path):
        self.path = path
        self.f = open_text(path)
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # characters dropped from the buffer before pos 0
        self.decoder = json.JSONDecoder()

    def fill(self) -> bool:
        chunk = self.f.read(_CHUNK)
        if not chunk:
            return False
        self.consumed += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

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
        self.peek()
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as err:
                if err.pos >= len(self.buf) - 1 or "Unterminated" in err.msg or "Expecting" in err.msg:
                    if self.fill():
                        continue
                self.pos = err.pos
                self.fail(f"invalid JSON: {err.msg}")
            # A number at the very end of the buffer may continue in the next chunk.
            if end == len(self.buf) and self.fill():
                continue
            if SURROGATE_ESCAPE.search(self.buf, self.pos, end):
                obj = replace_surrogates(obj)
            self.pos = end
            return obj

    def fail(self, message: str) -> None:
        raise ConfigError(f"{self.path}: {message} at character {self.consumed + self.pos:,}")

    def close(self) -> None:
        self.f.close()


def _members(r: _Reader, openers: str = "[{") -> Iterator[tuple[Any, Any]]:
    opener = r.expect(openers)
    closer = "]" if opener == "[" else "}"
    index = 0
    if r.peek() == closer:
        r.pos += 1
        return
    while True:
        if opener == "{":
            key = r.value()
            r.expect(":")
        else:
            key = index
        yield key, r
        index += 1
        if r.expect("," + closer) == closer:
            return


def iter_json(path: Path, member: Optional[str] = None, array: bool = False) -> Iterator[tuple[Any, Any]]:
    path = Path(path)
    openers = "[" if array else "[{"
    r = _Reader(path)
    try:
        if member is None:
            for key, reader in _members(r, openers):
                yield key, reader.value()
            return
        found = False
        for key, reader in _members(r, "{"):
            if key == member:
                found = True
                for inner_key, inner in _members(reader, openers):
                    yield inner_key, inner.value()
            else:
                reader.value()  # skip
        if not found:
            raise ConfigError(f"{path}: no {member!r} member at the top level")
    finally:
        r.close()
