"""Where a transfer model comes from: a run of ours (`our_run`: a pretraining or fine-tuning
run folder or checkpoint, with the run record its checkpoints carry), the model config it
or ``--model`` gives (`model_of`), and a fine-tuned model loaded back for evaluation
(`load_transfer`)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.store import FeatureStore
from vl_models import families
from vl_models.config import DataSettings, flat_settings
from vl_models.train import checkpoint


def our_run(source: Optional[str], role: str = "--init") -> tuple[Optional[Path], Optional[dict]]:
    """(checkpoint file, run record) when `source` is a run folder or checkpoint of ours
    (its ``run``: training config, model config, family); (None, None) for anything else
    (an HF, vilbert-multi-task or BERT checkpoint) and for no source. A damaged checkpoint
    is a CheckpointError whose advice names `role`, the flag that gave `source`."""
    if not source:
        return None, None
    path = Path(source)
    if not ((path / checkpoint.FOLDER).is_dir() or (path.is_file() and checkpoint.step_of(path.name) is not None)):
        return None, None
    ckpt = checkpoint.resolve(path, role=role)
    run = checkpoint.load(ckpt, role).get("run")
    return (ckpt, run) if run else (None, None)


def model_of(model: Optional[str], run: Optional[dict], store: str, answers: int):
    """(family, model config) from --model (fitted to the store; `answers` QA rows) or the --init run's."""
    if model:
        mcfg = families.load_config(model)
        family = families.of_config(mcfg)
        return family, family.fit(mcfg, FeatureStore.open(store).layout, answers, store)
    if run is None:
        raise ConfigError("--model: name the model config (the --init is no run of ours to take it from)")
    family = families.from_run(run)
    return family, family.config_class.from_json(run["model"])


def is_finetuned(run: Optional[dict]) -> bool:
    """Whether a run record is a fine-tuning run's (its model has task heads)."""
    return bool(run and run.get("tasks"))


def backbone_state(ckpt: Path, heads: tuple[str, ...] = ()) -> dict:
    """A fine-tuning checkpoint's backbone tensors (``backbone.`` stripped), and with `heads`
    those tasks' head tensors too (keys kept: ``heads.<task>.``)."""
    state = checkpoint.load(ckpt)["model"]
    own = backbone_of(state)
    if not heads:
        return own
    return {
        **{f"backbone.{k}": v for k, v in own.items()},
        **{k: v for k, v in state.items() if any(k.startswith(f"heads.{t}.") for t in heads)},
    }


def backbone_of(model_state: dict) -> dict:
    """The backbone's tensors of a fine-tuning model's state dict (``backbone.`` stripped)."""
    return {k[len("backbone.") :]: v for k, v in model_state.items() if k.startswith("backbone.")}


def data_settings(run: dict, task: Optional[str] = None):
    """The data settings (`DataSettings`) a run was trained with (`task`'s text length where the
    run set one per task, --task-max-text): evaluation sees examples alike."""
    saved = flat_settings(run["train"])
    settings = {f.name: saved[f.name] for f in fields(DataSettings) if f.name in saved}
    if task in (saved.get("task_max_text") or {}):
        settings["max_text"] = saved["task_max_text"][task]
    return DataSettings(**settings)
