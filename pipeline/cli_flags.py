"""Command-line flags generated from config fields (`vlprep download` / `extract`, `vltrain
pretrain` / `finetune` / `evaluate` / `preview-batch`).

Each config field is declared once as a `Flag` (its help, and how its text becomes the
field's value), in a group (`Flags`) shown as one help panel; `config_command` turns a
command whose one parameter is its config into a command whose options are the groups'
flags, and calls it with the config they build. A group with a ``section`` builds the
config held in that field of the command's config, so the groups of sections two commands
share (shards and Ray, reader, fetching, images) are declared once
(tests/pipeline/test_cli_config.py checks fields against flags). A command may take options
that are no config field (`extra`, e.g. `vltrain pretrain --recipe`) and adjust the values
given before the config is built (`prepare`, which sees the click context: which options the
user gave).
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import MISSING, dataclass
from inspect import Parameter, Signature
from typing import Any, Callable, Iterable, List, Literal, Mapping, Optional, Sequence, Union

import typer

FIELD_DEFAULT = object()  # a Flag's default: the field's own


@dataclass(frozen=True)
class Flag:
    """How one config field is set on the command line (its default is the field's)."""

    help: str
    name: Optional[str] = None  # the flag, when it is not --<field name> (e.g. --input for `inputs`)
    choices: Optional[Iterable[str]] = None  # the values allowed: shown in --help, checked by click
    parse: Optional[Callable[[str], Any]] = None  # the flag's text -> the field's value
    show: Callable[[Any], str] = str  # with `parse`: the field's default -> the flag's default text
    many: bool = False  # with `parse`: repeatable, `parse` takes the list of texts
    default: Any = FIELD_DEFAULT  # the flag's default when it is not the field's (None: optional on the command line)
    argument: bool = False  # a positional argument, not an option (shown in the command's Arguments panel)

    def parameter(self, field: str, kind: Any, default: Any, panel: str) -> Parameter:
        if self.default is not FIELD_DEFAULT:
            default = self.default
        repeated = _repeated(kind)
        if self.parse is not None and self.many:
            kind, default = List[str], []
        elif self.parse is not None:
            kind, default = str, default if default in (None, ...) else self.show(default)
        elif self.choices is not None:
            kind = Literal[tuple(self.choices)]
        elif repeated is not None:  # tuple[X, ...], or an Optional one: None when not given
            kind, default = List[repeated], default if default in (None, ...) else list(default)
        if default is None:
            kind = Optional[kind]
        if self.argument:
            option = typer.Argument(default, help=self.help)
        else:
            option = typer.Option(default, *[self.name] if self.name else [], help=self.help, rich_help_panel=panel)
        return Parameter(field, Parameter.KEYWORD_ONLY, default=option, annotation=kind)

    def value(self, given: Any) -> Any:
        if self.parse is not None and given is not None:
            return self.parse(list(given) if self.many else given)
        return tuple(given) if isinstance(given, list) else given


@dataclass(frozen=True)
class Flags:
    """Flags of fields of the config class `cls`, shown in one help panel. With `section`
    they build the `cls` held in that field of the command's config; without, the fields
    are the command's config's own. A plain string is a `Flag` with that help."""

    cls: type
    panel: str
    flags: Mapping[str, Union[Flag, str]]
    section: Optional[str] = None
    defaults: Any = None  # an instance of `cls` whose values are the flags' defaults (None: the fields')

    def flag(self, field: str) -> Flag:
        flag = self.flags[field]
        return Flag(flag) if isinstance(flag, str) else flag

    def parameters(self) -> list[Parameter]:
        hints = typing.get_type_hints(self.cls)
        fields = {f.name: f for f in dataclasses.fields(self.cls)}

        def default(name: str) -> Any:
            return _default(fields[name]) if self.defaults is None else getattr(self.defaults, name)

        return [self.flag(name).parameter(name, hints[name], default(name), self.panel) for name in self.flags]


def _repeated(kind: Any) -> Any:
    """X of a repeatable field's type, ``tuple[X, ...]`` or ``Optional[tuple[X, ...]]``; None for any other."""
    if typing.get_origin(kind) is Union:
        kinds = [k for k in typing.get_args(kind) if k is not type(None)]
        kind = kinds[0] if len(kinds) == 1 else kind
    return typing.get_args(kind)[0] if typing.get_origin(kind) is tuple else None


def _default(field: dataclasses.Field) -> Any:
    """A config field's default (``...``: none, the flag is required)."""
    if field.default is not MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not MISSING else ...


def config_command(
    config_cls: type,
    *groups: Flags,
    extra: Sequence[Parameter] = (),
    prepare: Optional[Callable[[typer.Context, dict], dict]] = None,
) -> Callable:
    """Decorate a command whose one parameter is its config (a `config_cls`): its options
    are the flags of `groups` (and the `extra` ones), and it is called with the config they
    build (a config that refuses its values raises a ConfigError naming the flag). With
    `prepare`, the values given (the `extra` options' too) pass through
    ``prepare(ctx, values)`` first; the `extra` options go no further."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def command(ctx: typer.Context, **given: Any) -> Any:
            if prepare is not None:
                given = prepare(ctx, given)
            top: dict[str, Any] = {}
            for group in groups:
                values = {name: group.flag(name).value(given[name]) for name in group.flags}
                if group.section:
                    top[group.section] = group.cls(**values)
                else:
                    top.update(values)
            return fn(config_cls(**top))

        context = Parameter("ctx", Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        params = [context, *(p for group in groups for p in group.parameters()), *extra]
        command.__signature__ = Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(text.split(","))


def or_none(text: str) -> Optional[str]:
    return text or None
