"""Published recipes: named YAML files whose keys are `vltrain` option names (underscores)
and whose every value line cites the paper or the reference code it comes from —
pretraining recipes in `vl_models/recipes/` (`vltrain pretrain --recipe NAME|FILE`),
fine-tuning recipes in `vl_models/recipes/finetune/` (`vltrain finetune --recipe NAME|FILE`).
A command uses a recipe's values as the defaults of the options not given; `recipe_settings`
reads the data settings a fine-tuning recipe gives one task (the published checkpoints of its
code are scored with them: `vl_models.transfer.published`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

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


SETTINGS = ("max_text", "max_regions")  # the data settings `recipe_settings` reads


def recipe_settings(name: str, task: Optional[str] = None, folder: Path = FINETUNE_RECIPE_DIR) -> dict:
    """The data settings (`SETTINGS`) the recipe `name` of `folder` gives `task`: its per-task
    value (``task_max_text``) where it has one, else its value for all its tasks. {} where
    there is no such recipe or it does not train `task`; `task` None: the values it gives all
    its tasks alike."""
    path = folder / f"{name}.yaml"
    if not path.is_file():
        return {}
    _, values = load_recipe(path)
    trained = values.get("task")
    trained = [trained] if isinstance(trained, str) else list(trained or ())
    if task is not None and task not in trained:
        return {}
    out = {k: values[k] for k in SETTINGS if values.get(k) is not None}
    for key in SETTINGS:
        per_task = values.get(f"task_{key}") or {}
        if task is not None and task in per_task:
            out[key] = per_task[task]
        elif task is None and per_task:
            out.pop(key, None)  # not one value for all its tasks
    return out
