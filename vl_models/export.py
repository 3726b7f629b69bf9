"""`vltrain export --to hf`: a run's checkpoint as a Hugging Face folder (`weights.export_hf`).

The source is a run folder (its `latest` checkpoint, a step, or its `best` one) or one
checkpoint file; of a fine-tuning run its backbone is exported (a pretraining model: the
task heads have no transformers format; the export's record names them as not exported),
built from the run's model config, so a task-token table (``vltrain finetune --task-tokens``,
or an --init that had one) is exported with it.
The tokenizer is the run's ``--vocab`` (or `vocab`, which must hold the same vocabulary when
the run recorded it). One export of an OUT at a time (`output_lock`); OUT is never a
symbolic link nor a folder holding the checkpoint or the vocab. The folder is built under a
temporary name (removed whatever happens) and renamed into place; an existing folder is
replaced only with ``overwrite`` and only if it is an export of ours, and then only the
files an export writes (a model card stays), file by file with config.json, the mark of an
export, last: a replace killed half-way is still an export, and rerunning it completes it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Optional, Union

from pipeline.errors import CheckpointError, ConfigError
from pipeline.io import clean_leftovers, commit_path, fsync_dir, fsync_tree, output_lock, remove_path, tmp_path_for
from vl_models import families
from vl_models.data.tokenize import WordPiece
from vl_models.models.weights import EXPORT_FILES, export_hf, exported_record
from vl_models.train import checkpoint
from vl_models.transfer.runs import backbone_of, is_finetuned

log = logging.getLogger(__name__)

FORMATS = ("hf",)


def export_run(
    source: Path, out: Path, step: Union[int, str, None] = None, vocab: Optional[Path] = None, overwrite: bool = False
) -> dict:
    """Export the checkpoint that `source` and `step` name into `out`; returns what was written."""
    path = checkpoint.resolve(source, step, role="SOURCE")
    _check_out(Path(out), overwrite, [path, *([Path(vocab)] if vocab else [])])
    state = checkpoint.load(path, "SOURCE")
    run = state.get("run") or {"train": state.get("config", {}), "model": state.get("model_config", {})}
    family = families.from_run(run)
    model = family.build(family.config_class.from_json(run["model"]))
    weights, provenance = state["model"], {"source": str(path), "step": state["step"]}
    if is_finetuned(run):  # its backbone, a pretraining model: the task heads have no export format
        weights = backbone_of(weights)
        provenance["heads_not_exported"] = list(run["tasks"])
        log.warning(
            "%s is a fine-tuning run: its backbone is exported, its task heads (%s) are not",
            path,
            ", ".join(run["tasks"]),
        )
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        raise CheckpointError(f"{path}: its tensors do not fit its own model config ({str(err).splitlines()[0]})")
    tokenizer = _tokenizer(run, vocab)
    with output_lock(Path(out), "export"):
        clean_leftovers(Path(out))  # temporary folders of killed exports
        _check_out(Path(out), overwrite)  # again, under the lock
        tmp = tmp_path_for(Path(out))
        try:
            export_hf(model, tmp, tokenizer, provenance)
            _commit(tmp, Path(out))
        finally:
            remove_path(tmp)
    log.info("exported %s (step %d) to %s", path, state["step"], out)
    return {
        "source": str(path),
        "step": state["step"],
        "kind": family.name,
        "out": str(out),
        "heads_not_exported": provenance.get("heads_not_exported", []),
    }


def _check_out(out: Path, overwrite: bool, inputs: tuple = ()) -> None:
    if out.is_symlink():
        raise ConfigError(f"{out} is a symbolic link; give the real path of a new or empty folder")
    for path in inputs:
        if out.resolve() == path.resolve() or out.resolve() in path.resolve().parents:
            raise ConfigError(f"{out} holds the input {path}; export elsewhere")
    cwd = Path.cwd().resolve()
    if out.resolve() == cwd or out.resolve() in cwd.parents:
        raise ConfigError(f"{out} is the current folder or a folder above it: export into a new folder")
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if not out.is_dir() or exported_record(out) is None:
        raise ConfigError(
            f"{out} exists and is not an export of vltrain (no config.json with a 'vltrain' record): "
            "export into a new or empty folder"
        )
    if not overwrite:
        raise ConfigError(
            f"{out} holds an export already: pass --overwrite to replace it (only the export's files are replaced)"
        )


def _tokenizer(run: dict, vocab: Optional[Path]) -> WordPiece:
    """The run's tokenizer: its recorded --vocab, or `vocab` if it holds the same file."""
    source = vocab or run.get("train", {}).get("vocab")
    if source is None:
        raise ConfigError("the checkpoint records no vocab: pass --vocab")
    try:
        tokenizer = WordPiece(source)
    except ConfigError as err:
        raise ConfigError(f"{err} (the run's vocab; pass --vocab where it is now)") from err
    recorded = run.get("inputs", {}).get("vocab")
    if recorded and hashlib.sha256(tokenizer.path.read_bytes()).hexdigest() != recorded:
        raise ConfigError(f"{tokenizer.path} is not the vocab this run was trained with (its sha256 differs)")
    return tokenizer


def _commit(tmp: Path, out: Path) -> None:
    """Move a finished export into place: a rename for a new folder; otherwise replace the
    export's own files one by one, then drop those the new export does not have, and
    config.json (the mark of an export) last, so the folder stays an export throughout."""
    if not out.exists() or not any(out.iterdir()):
        if out.exists():
            out.rmdir()
        commit_path(tmp, out)
        return
    fsync_tree(tmp)
    new = {child.name for child in tmp.iterdir()}
    for name in sorted(new - {"config.json"}):
        if (out / name).is_dir():
            remove_path(out / name)  # a folder (text_stream/) cannot be renamed over
        os.replace(tmp / name, out / name)
    for name in set(EXPORT_FILES) - new - {"config.json"}:
        remove_path(out / name)
    os.replace(tmp / "config.json", out / "config.json")
    fsync_dir(out)
