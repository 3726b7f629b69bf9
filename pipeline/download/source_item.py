"""`SourceItem`: one image to fetch, as the dataset readers (`pipeline.datasets`) yield it,
`vlprep download` fetches it and the image shards (`pipeline.image_shards`) keep it beside
the image: a stable id, a URL or a local path, and its texts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Text:
    """One text of an item: its kind and the words."""

    kind: str  # caption | question | statement
    text: str


@dataclass(frozen=True)
class SourceItem:
    """One image to fetch: a stable, collision-free id, where it lives, and its texts (not a
    mixture's text item: that is `pipeline.mixture.sources.TextItem`)."""

    image_id: str
    url: Optional[str] = None  # http(s) URL ...
    path: Optional[str] = None  # ... or a local file
    texts: tuple[Text, ...] = ()
    split: str = ""
    source: str = ""  # the reader's name
    extra: tuple[tuple[str, str], ...] = ()  # reader-specific string fields (e.g. url_sha1)

    def __post_init__(self) -> None:
        if (self.url is None) == (self.path is None):
            raise ValueError(f"item {self.image_id!r}: give exactly one of url and path")

    @property
    def location(self) -> str:
        return self.url if self.url is not None else str(self.path)
