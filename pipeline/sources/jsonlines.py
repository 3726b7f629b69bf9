"""JSON-lines files (NLVR2's ``dev.json``, VCR's ``val.jsonl``): one JSON value a line,
streamed under the rules of `pipeline.sources.base` (.gz read through gzip, bad bytes and
lone surrogates become U+FFFD, JSON read strictly). Blank lines are passed over; a line that
is not JSON, holds NaN / Infinity or is nested too deep is a `Malformed` naming its line
number ("invalid JSON: ...").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from pipeline.sources.base import Malformed, load_json, open_text


def iter_json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(line number, value) for each non-blank line of `path`, in file order; the value is
    a `Malformed` when the line is not JSON."""
    path = Path(path)
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = str(lineno)
            try:
                value = load_json(line)
            except json.JSONDecodeError as err:
                value = Malformed(path, where, f"invalid JSON: {err.msg}")
            yield where, value
