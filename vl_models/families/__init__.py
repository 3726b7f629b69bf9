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
from pipeline.registry import Registry
from vl_models.families.base import ModelFamily
from vl_models.families.lxmert import FAMILY as LXMERT
from vl_models.families.vilbert import FAMILY as VILBERT
from vl_models.models.configuration import CONFIG_DIR

_FAMILIES: Registry[ModelFamily] = Registry("model family")
unregister, names, get = _FAMILIES.unregister, _FAMILIES.names, _FAMILIES.get


def register(family: ModelFamily) -> ModelFamily:
    """Make `family` known by its name (a second family of the same name is an error)."""
    if getattr(family.config_class, "model_type", None) != family.name:
        raise ConfigError(
            f"model family {family.name!r}: its config class {family.config_class.__name__} must have "
            f"model_type = {family.name!r} (the key a config file names its family with)"
        )
    return _FAMILIES.register(family)


def of_config(mcfg: Any) -> ModelFamily:
    """The family whose config class `mcfg` is."""
    for family in _FAMILIES:
        if isinstance(mcfg, family.config_class):
            return family
    raise ConfigError(f"no model family has config class {type(mcfg).__name__}")


def load_config(name_or_path: Union[str, Path]) -> Any:
    """A model config by name (``model_configs/NAME.json``) or JSON path, read into the
    config class of the family its ``model_type`` names."""
    obj = read_named_json(name_or_path, CONFIG_DIR, "model")
    if obj.get("model_type") not in names():
        raise ConfigError(
            f"{name_or_path}: model_type must be one of {', '.join(names())}, got {obj.get('model_type')!r}"
        )
    return get(obj["model_type"]).config_class.from_json(obj)


def from_run(run: dict) -> ModelFamily:
    """The family of a run record (a checkpoint's or config.json's ``kind``); records from
    before families were named carry only the model config: the family whose config reads it."""
    if run.get("kind"):
        return get(run["kind"])
    for family in _FAMILIES:
        try:
            family.config_class.from_json(run["model"])
            return family
        except (ConfigError, TypeError):
            continue
    raise ConfigError("the checkpoint's model config fits no known model family")


register(VILBERT)
register(LXMERT)
