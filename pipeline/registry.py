"""A registry of named things (model families, downstream tasks): one way to add, find and
list them, with errors that name what is known."""

from __future__ import annotations

from typing import Generic, Iterator, TypeVar

from pipeline.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Objects with a ``name``, registered once each; `what` names them in errors."""

    def __init__(self, what: str):
        self.what = what
        self._known: dict[str, T] = {}

    def register(self, item: T) -> T:
        """Make `item` known by its name (another object of the same name is an error)."""
        known = self._known.get(item.name)
        if known is not None and known is not item:
            raise ConfigError(f"a {self.what} named {item.name!r} is already registered ({known!r})")
        self._known[item.name] = item
        return item

    def unregister(self, name: str) -> None:
        self._known.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._known)

    def get(self, name: str) -> T:
        """The one called `name`; ConfigError listing the known ones."""
        if name not in self._known:
            raise ConfigError(f"unknown {self.what} {name!r}; known: {', '.join(self._known)}")
        return self._known[name]

    def __iter__(self) -> Iterator[T]:
        return iter(self._known.values())
