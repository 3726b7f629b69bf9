"""Published recipes: named YAML files whose keys are `vltrain` option names (underscores)
and whose every value line cites the paper or the reference code it comes from —
pretraining recipes in `vl_models/recipes/` (`vltrain pretrain --recipe NAME|FILE`),
fine-tuning recipes in `vl_models/recipes/finetune/` (`vltrain finetune --recipe NAME|FILE`).
A command uses a recipe's values as the defaults of the options not given."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from pipeline.io import named_config_path, read_named_json

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"
FINETUNE_RECIPE_DIR = RECIPE_DIR / "finetune"


def load_recipe(name_or_path: Union[str, Path], folder: Path = RECIPE_DIR) -> tuple[Path, dict]:
    """(the recipe's file, its values) of a recipe in `folder` or a YAML path; a ConfigError
    names an unknown recipe or a bad file."""
    return (
        named_config_path(name_or_path, folder, ".yaml"),
        read_named_json(name_or_path, folder, "recipe", suffix=".yaml"),
    )
