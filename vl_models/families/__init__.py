"""The registry of model families (`base.ModelFamily`), found by name.

A model config JSON names its family in ``model_type``; `load_config` reads it into that
family's config class. Adding a model: one module that subclasses `ModelFamily` and calls
`register` (the built-in ones are registered here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from pipeline.errors import ConfigError
from pipeline.io import read_named_json
from vl_models.families.base import ModelFamily
from vl_models.families.lxmert import FAMILY as LXMERT
from vl_models.families.vilbert import FAMILY as VILBERT
from vl_models.models.configuration import CONFIG_DIR

_FAMILIES: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Make `family` known by its name (a second family of the same name is an error)."""
    if getattr(family.config_class, "model_type", None) != family.name:
        raise ConfigError(f"model family {family.name!r}: its config class {family.config_class.__name__} must have "
                          f"model_type = {family.name!r} (the key a config file names its family with)")
    known = _FAMILIES.get(family.name)
    if known is not None and known is not family:
        raise ConfigError(f"a model family named {family.name!r} is already registered ({known!r})")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    _FAMILIES.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_FAMILIES)


def get(name: str) -> ModelFamily:
    """The family called `name`; ConfigError listing the known ones."""
    if name not in _FAMILIES:
        raise ConfigError(f"unknown model family {name!r}; known: {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def of_config(mcfg: Any) -> ModelFamily:
    """The family whose config class `mcfg` is."""
    for family in _FAMILIES.values():
        if isinstance(mcfg, family.config_class):
            return family
    raise ConfigError(f"no model family has config class {type(mcfg).__name__}")


def load_config(name_or_path: Union[str, Path]) -> Any:
    """A model config by name (``model_configs/NAME.json``) or JSON path, read into the
    config class of the family its ``model_type`` names."""
    obj = read_named_json(name_or_path, CONFIG_DIR, "model")
    if obj.get("model_type") not in _FAMILIES:
        raise ConfigError(f"{name_or_path}: model_type must be one of {', '.join(_FAMILIES)}, "
                          f"got {obj.get('model_type')!r}")
    return _FAMILIES[obj["model_type"]].config_class.from_json(obj)


def from_run(run: dict) -> ModelFamily:
    """The family of a run record (a checkpoint's or config.json's ``kind``); records from
    before families were named carry only the model config: the family whose config reads it."""
    if run.get("kind"):
        return get(run["kind"])
    for family in _FAMILIES.values():
        try:
            family.config_class.from_json(run["model"])
            return family
        except (ConfigError, TypeError):
            continue
    raise ConfigError("the checkpoint's model config fits no known model family")


register(VILBERT)
register(LXMERT)
