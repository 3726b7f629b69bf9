"""A small schema for YAML/JSON specs (mixture specs, task specs): typed fields, required
or optional with defaults, enumerations, ranges, lists, nested mappings, and unknown keys
refused with a suggestion. Every problem is reported at once, as a ConfigError naming the
file and the key path:

    spec.yaml: sources[2]: unknown key 'topk' (did you mean 'top_k'?); spec.yaml: answers.top_k: must be >= 0 (got -1)

Example:

    SOURCE = Schema({"kind": Field(str, required=True, choices=KINDS),
                     "files": Field(str, many=True, required=True),
                     "repeat": Field(int, default=1, ge=1)})
    SPEC = Schema({"sources": Field(SOURCE, many=True, required=True)})
    clean = SPEC.validate(yaml.safe_load(text), "spec.yaml")   # a dict with every key, defaults filled

A key given as null (YAML ``key:`` with no value) counts as absent. Integers are accepted
where floats are asked for; booleans are never numbers; floats must be finite.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Optional, Union

from pipeline.errors import ConfigError

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a finite number", bool: "true or false"}


@dataclass(frozen=True)
class Field:
    """One key: `type` is str, int, float, bool or a nested `Schema`; `many`: a list of them
    (returned as a tuple; a required list must hold at least one value); `choices`: the
    allowed values; `ge` / `gt`: a lower bound (numbers). An absent nested mapping gets its
    fields' defaults."""

    type: Union[type, "Schema"]
    required: bool = False
    default: Any = None
    many: bool = False
    choices: tuple = ()
    ge: Optional[float] = None
    gt: Optional[float] = None


class Schema:
    def __init__(self, fields: dict[str, Field]):
        self.fields = fields

    def validate(self, raw: Any, file: str) -> dict:
        """`raw` checked against the schema: a dict with every field (defaults filled in), or
        a ConfigError listing every problem, each as '<file>: <key path>: <problem>'."""
        problems: list[str] = []
        clean = self._check(raw, "", problems)
        if problems:
            raise ConfigError("; ".join(f"{file}: {p}" for p in problems))
        return clean

    def _check(self, raw: Any, path: str, problems: list[str]) -> dict:
        where = f"{path}: " if path else ""
        if not isinstance(raw, dict):
            problems.append(f"{where}must be a mapping of keys to values (got {_kind_of(raw)})")
            return {}
        for key in raw:
            if key not in self.fields:
                close = difflib.get_close_matches(str(key), list(self.fields), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(self.fields)})"
                problems.append(f"{where}unknown key {key!r}{hint}")
        clean = {}
        for key, field in self.fields.items():
            value = raw.get(key)
            name = f"{path}.{key}" if path else key
            if value is None:
                if field.required:
                    problems.append(f"{where}missing required key {key!r}")
                if isinstance(field.type, Schema) and not field.many:
                    clean[key] = {k: f.default for k, f in field.type.fields.items()}
                else:
                    clean[key] = field.default
            elif field.many:
                if not isinstance(value, list):
                    problems.append(f"{name}: must be a list of {_plural(field.type)} (got {_kind_of(value)})")
                    clean[key] = field.default
                elif field.required and not value:
                    problems.append(f"{name}: must list at least one value")
                    clean[key] = ()
                else:
                    clean[key] = tuple(_value(field, v, f"{name}[{i}]", problems) for i, v in enumerate(value))
            else:
                clean[key] = _value(field, value, name, problems)
        return clean


def _value(field: Field, value: Any, name: str, problems: list[str]) -> Any:
    kind = field.type
    if isinstance(kind, Schema):
        return kind._check(value, name, problems)
    ok = {
        str: isinstance(value, str),
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
    }[kind]
    if not ok:
        problems.append(f"{name}: must be {_TYPE_NAMES[kind]} (got {_describe(value)})")
        return field.default
    if field.choices and value not in field.choices:
        problems.append(f"{name}: must be one of {', '.join(map(str, field.choices))} (got {value!r})")
    if field.ge is not None and value < field.ge:
        problems.append(f"{name}: must be >= {field.ge:g} (got {value!r})")
    if field.gt is not None and value <= field.gt:
        problems.append(f"{name}: must be > {field.gt:g} (got {value!r})")
    return float(value) if kind is float else value


def _plural(kind) -> str:
    return (
        "mappings"
        if isinstance(kind, Schema)
        else {str: "strings", int: "integers", float: "numbers", bool: "booleans"}[kind]
    )


def _kind_of(value: Any) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return repr(value)


def _describe(value: Any) -> str:
    """A short string as itself (repr), anything else by its kind."""
    return repr(value) if isinstance(value, str) and len(value) <= 40 and "\n" not in value else _kind_of(value)
