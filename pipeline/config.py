"""The one way a configuration is checked, written to JSON and read back.

Every stage's settings are a frozen dataclass that validates itself in ``__post_init__``
(before any work, with a `ConfigError` naming the flag), written into its output folder
with `to_json` and read back with `from_json`. The helpers here are those three steps for
every config class, so no class re-implements them:

* `to_json(cfg)`: a plain JSON value (paths become strings, tuples lists, nested configs
  dicts; a value with its own ``to_json`` or a ``str``-round-tripping type uses it);
* `from_json(cls, obj)`: the config back (lists become tuples, nested config classes are
  read recursively); an unknown key is a ConfigError that names it;
* `at_least`, `one_of` and `check_device`: the common checks, with the flag's name in the message.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, Iterable, TypeVar

from pipeline.errors import ConfigError

T = TypeVar("T")


def flag(name: str) -> str:
    """The command-line flag of a config field: ``max_regions`` -> ``--max-regions``."""
    return "--" + name.replace("_", "-")


def to_json(value: Any) -> Any:
    """`value` (a config dataclass, or anything inside one) as plain JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        own = getattr(type(value), "to_json", None)
        if own is not None and own is not Config.to_json:
            return value.to_json()
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "to_json"):
        return value.to_json()
    return str(value)


def from_json(cls: type[T], obj: Mapping, what: str = "", ignore: Iterable[str] = ()) -> T:
    """The config `cls` from its JSON form; ConfigError naming unknown keys (except
    `ignore`). Lists become tuples; a field typed as a config dataclass is read as one."""
    what = what or cls.__name__
    if not isinstance(obj, Mapping):
        raise ConfigError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    names = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(obj) - set(names) - set(ignore)
    if unknown:
        raise ConfigError(f"unknown {what} keys: {', '.join(sorted(unknown))} (known: {', '.join(names)})")
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in obj.items():
        if key not in names:
            continue
        kind = hints.get(key)
        if dataclasses.is_dataclass(kind) and isinstance(value, Mapping):
            value = getattr(kind, "from_json", lambda o: from_json(kind, o, f"{what}.{key}"))(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[key] = value
    try:
        return cls(**values)
    except TypeError as err:  # a required field is missing
        raise ConfigError(f"{what}: {err}") from err


class Config:
    """Mixin for config dataclasses: ``to_json`` / ``from_json`` through this module."""

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls, obj: Mapping):
        return from_json(cls, obj)


def at_least(cfg: Any, minimum: Mapping[str, float]) -> None:
    """ConfigError naming the first field of `cfg` below its minimum in `minimum`."""
    for name, least in minimum.items():
        value = getattr(cfg, name)
        if value < least:
            raise ConfigError(f"{flag(name)} must be >= {least}, got {value}")


def one_of(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """ConfigError unless `value` is one of `allowed` (field `name`, shown as its flag)."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"{flag(name)} must be one of {', '.join(map(str, allowed))}, got {value!r}")


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"  # what a --device takes (each command says what auto picks)
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def is_device(value: Any) -> bool:
    """Whether `value` is a device name a --device takes (`DEVICE_NAMES`)."""
    return isinstance(value, str) and _DEVICE.fullmatch(value) is not None


def check_device(name: str, value: Any) -> None:
    """ConfigError unless `value` is a device name (`DEVICE_NAMES`; field `name`, shown as its flag)."""
    if not is_device(value):
        raise ConfigError(f"{flag(name)} must be {DEVICE_NAMES}, got {value!r}")
