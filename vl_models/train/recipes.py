"""Published pretraining recipes: named YAML files in `vl_models/recipes/` whose keys are
`vltrain pretrain` option names (underscores) and whose every number cites the paper or the
reference code it comes from. `vltrain pretrain --recipe NAME|FILE` uses them as defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from pipeline.io import named_config_path, read_named_json

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"


def load_recipe(name_or_path: Union[str, Path]) -> tuple[Path, dict]:
    """(the recipe's file, its values); a ConfigError names an unknown recipe or a bad file."""
    return (
        named_config_path(name_or_path, RECIPE_DIR, ".yaml"),
        read_named_json(name_or_path, RECIPE_DIR, "recipe", suffix=".yaml"),
    )
