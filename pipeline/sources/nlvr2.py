"""NLVR2: the JSON-lines files ``train.json``, ``dev.json``, ``test1.json`` (streamed):
``{"identifier": "dev-850-0-0", "sentence", "label": "True" | "False", ...}``; the URL
release adds ``"left_url"`` and ``"right_url"``, the image release gives ``"directory"``
(train's images sit in numbered subfolders).

An identifier is ``<split>-<set>-<pair>-<sentence>``; a pair has two images, named as in
the released image folders by the identifier up to its last dash: ``dev-850-0-img0``
(left) and ``dev-850-0-img1`` (right). Several sentences share a pair.

Rows: a line needs a JSON object with an identifier holding a dash; a label, when given,
is "True" / "False" (or a JSON boolean); urls and directory, when given, are strings (the
directory may be a number); read with ``urls_required``, both urls are needed. Anything else
is `Malformed` (``dev.json:12``), as is a line holding NaN or Infinity or nested too
deep. A null or blank sentence is a `Skip` in the example's `sentence`, and so is the
sentence of a line whose identifier an earlier line of the file has ("duplicate id": the
first is kept): the pair's images are still images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from pipeline.sources.base import DUPLICATE_ID, Malformed, Skip, is_id, shown, text_or_skip
from pipeline.sources.jsonlines import iter_json_lines

_LABELS = {"True": True, "False": False}


@dataclass(frozen=True)
class Nlvr2Example:
    identifier: str  # "dev-850-0-0"
    sentence: Union[str, Skip]  # cleaned; a Skip naming the pair when null or blank
    left_image: str  # "dev-850-0-img0"
    right_image: str  # "dev-850-0-img1"
    left_url: str  # "" when the file gives none (the image release)
    right_url: str
    label: Optional[bool]  # None when the file gives none
    directory: str  # the image release's subfolder of train's images ("41"); "" when absent

    @property
    def pair(self) -> str:
        """The identifier up to its last dash: "dev-850-0"."""
        return self.identifier.rsplit("-", 1)[0]

    @property
    def split(self) -> str:
        """The identifier's first part: "train", "dev", "test1"."""
        return self.identifier.split("-", 1)[0]


def _given(value: Any) -> Optional[str]:
    """A url or directory as given ("" when absent or null); None when it is something else."""
    if value is None:
        return ""
    return str(value) if is_id(value) else None


def read_nlvr2(path: Path, urls_required: bool = False) -> Iterator[Union[Nlvr2Example, Malformed]]:
    """The examples of an NLVR2 file, one a line, in file order; with `urls_required` (what
    `vlprep download` reads: the URL release) a line without both urls is `Malformed`."""
    path = Path(path)
    seen: set[str] = set()
    for where, obj in iter_json_lines(path):
        if isinstance(obj, Malformed):
            yield obj
            continue
        identifier = obj.get("identifier") if isinstance(obj, dict) else None
        pair, _, sentence_index = identifier.rpartition("-") if isinstance(identifier, str) else ("", "", "")
        if not pair or not sentence_index:
            yield Malformed(path, where, "needs identifier (split-set-pair-sentence)")
            continue
        label = obj.get("label")
        label = _LABELS.get(label, label) if isinstance(label, str) else label
        if label is not None and not isinstance(label, bool):
            yield Malformed(path, where, f'label must be "True" or "False", not {shown(obj["label"])}')
            continue
        left_url, right_url, directory = (_given(obj.get(key)) for key in ("left_url", "right_url", "directory"))
        if left_url is None or right_url is None or directory is None:
            yield Malformed(path, where, "left_url, right_url and directory must be strings when given")
            continue
        if urls_required and not (left_url and right_url):
            yield Malformed(path, where, "needs left_url and right_url (the URL release)")
            continue
        sentence = Skip(pair, DUPLICATE_ID) if identifier in seen else text_or_skip(pair, obj.get("sentence"))
        seen.add(identifier)
        yield Nlvr2Example(
            identifier,
            sentence,
            f"{pair}-img0",
            f"{pair}-img1",
            left_url,
            right_url,
            label,
            directory,
        )
