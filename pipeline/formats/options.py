"""A format's options: the one typed channel from ``--option KEY=VALUE`` to its reader and writer.

Each format declares its options as a frozen dataclass deriving from `FormatOptions`; each field is
one option, made with `option()` (its help, when it applies: on import, on export or both, and
how its text is read). ``vlprep import`` / ``vlprep export`` parse ``--option shard-bytes=200MB``
into that dataclass (`FormatOptions.parse`: unknown keys, options of the other direction and bad
values are a `ConfigError` naming the option, before any work), and the reader gets it as
``ReadOptions.options``, the writer as ``WriteContext.options``. ``vlprep formats`` lists them.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from pipeline.errors import ConfigError

IMPORT, EXPORT, BOTH = "import", "export", "both"

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20}
_UNITS.update({"gib": 2**30, "tib": 2**40})
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def byte_size(text: str) -> int:
    """``500MB`` (decimal units, as `datasets`' ``max_shard_size``), ``64MiB`` (binary) or a
    plain number of bytes -> bytes (at least 1)."""
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 500MB, 64MiB, 1000000)")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value < 1:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def split_name(text: str) -> str:
    """A split name as the Hub takes it (letters, digits, underscores; dots between)."""
    if not re.fullmatch(r"\w+(\.\w+)*", text, re.ASCII):
        raise ValueError(f"{text!r} is not a split name (letters, digits and _, e.g. train or validation)")
    return text


def human_size(value: int) -> str:
    """A byte count as `byte_size` reads it back (500MB, 64MiB, 1000)."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{unit}"
    return str(value)


def _boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def option(
    default: Any,
    help: str,
    *,
    when: str = BOTH,
    choices: Optional[Sequence[str]] = None,
    parse: Optional[Callable[[str], Any]] = None,
    show: Optional[Callable[[Any], str]] = None,
):
    """One option of a format (a dataclass field): `when` it applies (IMPORT, EXPORT or BOTH),
    its `choices` (for text options), `parse` (text -> value; default: by the field's type) and
    `show` (value -> text, for help and docs)."""
    assert when in (IMPORT, EXPORT, BOTH), when
    meta = {"help": help, "when": when, "choices": tuple(choices) if choices else None, "parse": parse, "show": show}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class OptionSpec:
    """What `vlprep formats`, help texts and the docs say about one option."""

    key: str  # as typed: shard-bytes
    default: str
    when: str
    help: str
    choices: Optional[tuple[str, ...]]

    def describe(self) -> str:
        choices = f" ({'|'.join(self.choices)})" if self.choices else ""
        where = "" if self.when == BOTH else f"{self.when} only; "
        return f"{self.key}={self.default}{choices}: {where}{self.help}"


@dataclass(frozen=True)
class FormatOptions:
    """Base of every format's options (a format without options uses it as it is)."""

    @classmethod
    def _fields(cls) -> list[dataclasses.Field]:
        return list(dataclasses.fields(cls))

    @classmethod
    def specs(cls) -> list[OptionSpec]:
        out = []
        for f in cls._fields():
            meta = f.metadata
            show = meta.get("show") or _show
            out.append(OptionSpec(key(f.name), show(f.default), meta["when"], meta["help"], meta["choices"]))
        return out

    @classmethod
    def parse(cls, pairs: Sequence[str], fmt: str, direction: str) -> "FormatOptions":
        """The options from ``KEY=VALUE`` texts, for an `direction` (IMPORT or EXPORT) of `fmt`;
        a `ConfigError` names an unknown key, one that does not apply to `direction`, a value
        that is not of its type or choices, or a key given twice."""
        fields = {key(f.name): f for f in cls._fields()}
        hints = typing.get_type_hints(cls)
        applicable = [k for k, f in fields.items() if f.metadata["when"] in (BOTH, direction)]
        known = f"{fmt} takes on {direction}: {', '.join(applicable)}" if applicable else f"{fmt} takes none"
        values: dict[str, Any] = {}
        for pair in pairs:
            name, eq, text = str(pair).partition("=")
            name = name.strip().replace("_", "-")
            if not eq or not name:
                raise ConfigError(f"--option {pair!r}: give KEY=VALUE (options {known})")
            f = fields.get(name)
            if f is None or f.metadata["when"] not in (BOTH, direction):
                raise ConfigError(f"--option {name}: no such option ({'options ' + known})")
            if f.name in values:
                raise ConfigError(f"--option {name} is given twice")
            values[f.name] = _parse_value(f, hints.get(f.name), text, name)
        return cls(**values)

    def to_json(self) -> dict:
        return {key(f.name): _jsonable(getattr(self, f.name)) for f in self._fields()}


def _show(value: Any) -> str:
    if value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


def key(field_name: str) -> str:
    return field_name.replace("_", "-")


def _jsonable(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value


def _parse_value(f: dataclasses.Field, kind: Any, text: str, name: str) -> Any:
    meta = f.metadata
    text = text.strip()
    try:
        if meta.get("parse") is not None:
            value = meta["parse"](text)
        else:
            optional = typing.get_origin(kind) is typing.Union and type(None) in typing.get_args(kind)
            base = next((a for a in typing.get_args(kind) if a is not type(None)), kind) if optional else kind
            if optional and text.lower() in ("", "none"):
                value = None
            elif base is bool:
                value = _boolean(text)
            elif base is int:
                value = int(text)
            elif base is float:
                value = float(text)
            elif base is Path:
                value = Path(text)
            else:
                value = text
    except ValueError as err:
        raise ConfigError(f"--option {name}: {err}") from None
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(f"--option {name}: {value!r} is not one of {', '.join(choices)}")
    return value
