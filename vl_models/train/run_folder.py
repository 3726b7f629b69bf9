"""The run folder of `vltrain pretrain` and `vltrain finetune`: which files are the trainer's, whether a run may
start, resume or overwrite there, and what a resume may change.

`plan` decides, reading only; `begin` then does the writes (rank 0). So a refused start
or resume leaves the folder as it was, config.json included.

A resume compares the run's resolved config (what config.json holds: the training flags,
the model config, the world size and the content digests of mixture, stores and vocab)
with the one it was saved with. With ``--resume yes`` fields in `RESUME_SAFE` may change,
each noted in metrics.jsonl; any other difference would make the continued run something
else than the run it continues, and is refused with the fields named. ``--resume auto``
(a job script's every launch, a preempted job resubmitted, torchrun restarting its
workers) continues only the same run: any difference is refused, even an allowed one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from pipeline.errors import ConfigError, DataError
from pipeline.io import atomic_write_bytes, atomic_write_json, remove_path
from pipeline.items import ANSWERS_FILE, ITEMS_FILE
from pipeline.mixture import Mixture
from pipeline.store import FeatureStore
from vl_models.config import flat_settings
from vl_models.train import checkpoint

log = logging.getLogger(__name__)

CONFIG = "config.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
# Everything the trainer (and `vltrain plot`'s default) writes into a run folder: what
# --overwrite removes (in checkpoints/ and tensorboard/ only the files the trainer names so).
# Nothing else there is touched, nor the folder itself. A folder holds a run when its
# config.json is a vltrain one; these names in a folder without one are someone else's.
OUTPUTS = (CONFIG, METRICS, checkpoint.FOLDER, TENSORBOARD, "curves.png")
_RUN_KEYS = ("train", "model", "kind")  # what every vltrain config.json holds
_TENSORBOARD_EVENTS = "events.out.tfevents."

# Training settings (fields of TrainConfig and its sections) a resume may change. They decide how the run is carried
# out, kept or reported, not what it computes: where it is (out; the paths of mixture, stores and vocab,
# whose contents are compared instead), when it stops, evaluates, checkpoints and logs,
# loader workers and read-ahead (examples do not depend on them), retention, reporting, shard
# verification, the device and torch.compile (same math; bit-exactness holds on one device
# kind). `steps` is allowed: it moves the end of the lr schedule, so the
# remaining steps' lr changes; the note in metrics.jsonl records it.
RESUME_SAFE = frozenset(
    {
        "out",
        "resume",
        "overwrite",
        "init",
        "mixture",
        "stores",
        "vocab",
        "steps",
        "epochs",
        "stop_at",
        "eval_every",
        "checkpoint_every",
        "log_every",
        "workers",
        "prefetch",
        "padding",
        "keep_last",
        "best_metric",
        "report_to",
        "verify_shards",
        "device",
        "compile",
        "task_data",
        "eval_items",
        "dist_timeout",
    }
)
_NOT_NOTED = frozenset({"out", "resume", "overwrite", "init", "stop_at"})  # they change at every split run
# Settings that are input paths: recorded absolute (`trainer.absolute_paths`), compared as
# absolute paths (a run recorded relative paths before: the same inputs seen from here).
PATH_SETTINGS = ("mixture", "stores", "task_data", "given_stores", "vocab", "init", "hard_negatives", "init_answers")


@dataclass
class Plan:
    """How a run starts: at `step`, from checkpoint `state` (None: from scratch)."""

    step: int = 0
    state: Optional[dict] = None
    overwrite: bool = False  # remove the trainer's files of the earlier run first
    notes: list[str] = field(default_factory=list)  # the resume's allowed changes, for metrics.jsonl


def content_digest(data) -> str:
    """sha256 over the items and answer table of a mixture or task dataset (`Mixture`,
    `TaskData`: both name them ``items.arrow`` and ``answers.json``)."""
    h = hashlib.sha256()
    for name in (ITEMS_FILE, ANSWERS_FILE):
        with open(data.file(name), "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def answers_digest(data) -> str:
    """sha256 of an answer table (a classifier head's rows mean these answers, in this order)."""
    return hashlib.sha256(json.dumps(data.answers).encode()).hexdigest()


def input_digests(mixture: Optional[Mixture], stores: Sequence[Path], vocab: Path) -> dict:
    """Content identities of a run's inputs: the mixture's items and answer table (for a
    fine-tuning run, each task dataset's: the caller puts them in); each store's identity
    (`Manifest.identity`: layout and detector) and shards (names, rows and checksums: a
    re-extracted, re-imported or extended store is another input); the vocab file."""

    def store_identity(path: Path) -> str:
        manifest = FeatureStore.open(path).manifest
        content = {**manifest.identity(), "shards": manifest.shards_digest()}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()

    return {
        **({"mixture": content_digest(mixture)} if mixture is not None else {}),
        "stores": [store_identity(Path(p)) for p in stores],
        "vocab": hashlib.sha256(Path(vocab).read_bytes()).hexdigest(),
    }


def plan(out: Path, cfg, resolved: dict) -> Plan:
    """Decide how `cfg` (a TrainConfig or FinetuneConfig) starts in `out`; reads only.
    ConfigError: a run is there and neither --resume nor --overwrite was given, or the
    resume changes what it must keep (with ``--resume auto``: anything); CheckpointError:
    the checkpoint to resume from is missing or damaged."""
    resume = cfg.run.resume
    if resume != "no" and cfg.run.overwrite:
        raise ConfigError(f"pass either --resume {resume} or --overwrite, not both")
    if not _holds_run(out):
        foreign = _present(out)
        if foreign:
            raise ConfigError(
                f"{out} holds {', '.join(foreign)} but no run of vltrain (its config.json would say "
                "so): they are not the trainer's to reuse or remove; choose another --out"
            )
        if resume != "no":
            log.info("%s: no run to resume: starting a new one", out)
        return Plan()
    if cfg.run.overwrite:
        log.info("--overwrite: removing %s from %s", ", ".join(_present(out)), out)
        return Plan(overwrite=True)
    if resume == "no":
        try:
            step = checkpoint.step_of(checkpoint.pointer_name(out / checkpoint.FOLDER) or "")
        except DataError:  # an unreadable pointer: refused all the same, without its step
            step = None
        where = f"last checkpoint: step {step}" if step is not None else "no checkpoint yet"
        raise ConfigError(
            f"{out} holds a run ({where}): pass --resume yes (or auto) to continue it, or --overwrite "
            f"to start again (removes {', '.join(_present(out))}; other files there are kept), or "
            "choose another --out"
        )
    latest = checkpoint.pointed(out)
    folder = out / checkpoint.FOLDER
    if latest is None and checkpoint.steps_in(folder):  # killed between a checkpoint and its pointer
        latest = checkpoint.newest_verified(folder)
        log.warning(
            "%s is missing: resuming from %s, the newest checkpoint whose checksum verifies",
            folder / checkpoint.LATEST,
            latest.name,
        )
    state = checkpoint.load(latest) if latest else None
    if state is not None:
        saved, step = state.get("run") or {"train": state["config"], "model": state["model_config"]}, state["step"]
    else:  # stopped before its first checkpoint: step 0 of the same run
        saved, step = _read_config(out / CONFIG), 0
        log.info("%s has no checkpoint yet: the run starts again from step 0", out)
    notes = compare(saved, resolved, out)
    if resume == "auto" and notes:
        raise ConfigError(
            f"{out}: --resume auto continues a run only with its own settings, and these differ: "
            f"{'; '.join(notes)}. Continue it with them changed: --resume yes; or start a new run "
            "(another --out, or --overwrite)"
        )
    if cfg.optim.steps < step:
        raise ConfigError(f"{out} is already at step {step}: --steps {cfg.optim.steps} ends before it")
    return Plan(step=step, state=state, notes=notes)


def begin(out: Path, plan: Plan, resolved: dict) -> None:
    """The writes of a planned start (rank 0): remove an overwritten run's files, stale
    temporary checkpoints and the metrics rows after the resumed step; write config.json."""
    out.mkdir(parents=True, exist_ok=True)
    if plan.overwrite:
        _remove_run(out)
    checkpoint.remove_stale(out)
    truncate_metrics(out / METRICS, plan.step)
    atomic_write_json(out / CONFIG, resolved)


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of steps after `step` (logged after the checkpoint a resume starts
    from, by the killed run) and a torn last line; rewritten atomically. Returns how many."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    kept = [line for line in lines if _row_step(line) is not None and _row_step(line) <= step]
    if len(kept) != len(lines):
        atomic_write_bytes(path, "".join(line + "\n" for line in kept).encode())
        log.info("%s: dropped %d row(s) logged after step %d", path, len(lines) - len(kept), step)
    return len(lines) - len(kept)


def compare(saved: dict, new: dict, out: Path) -> list[str]:
    """The allowed differences between a run's saved resolved config and a resume's, as
    notes; ConfigError listing the others. Fields the saved config lacks (an older vltrain
    did not record them) are not compared."""
    old_model, new_model = saved.get("model", {}).get("name"), new["model"]["name"]
    if old_model and old_model != new_model:
        raise ConfigError(
            f"{out} holds a run of model {old_model!r}, not {new_model!r}: resume with the same model, "
            "or use another --out"
        )
    a, b = _fields(saved), _fields(new)
    changed = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    unsafe = [k for k in changed if not (k.startswith("train.") and k[len("train.") :] in RESUME_SAFE)]
    if unsafe:
        raise ConfigError(
            f"{out}: a resume keeps the run's settings, and these differ: "
            f"{'; '.join(_change(k, a[k], b[k]) for k in unsafe)}. Resume with the run's settings "
            f"(see {out / CONFIG}), or start a new run (another --out, or --overwrite)"
        )
    return [_change(k, a[k], b[k]) for k in changed if k[len("train.") :] not in _NOT_NOTED]


def _fields(resolved: dict) -> dict:
    """{"train.lr": ..., "model.hidden_size": ..., "inputs.mixture": ..., "world_size": ...}
    with JSON values (tuples as lists), one level into each part; the training config's
    sections are opened too (`flat_settings`), so a setting is named by its field alone, as
    in configs saved before the sections; input paths (`PATH_SETTINGS`) made absolute."""
    obj = json.loads(json.dumps(resolved))
    out = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in (flat_settings(value) if key == "train" else value).items()})
        else:
            out[key] = value
    for name in PATH_SETTINGS:
        value = out.get(f"train.{name}")
        if isinstance(value, str) and value:
            out[f"train.{name}"] = os.path.abspath(value)
        elif isinstance(value, list):
            out[f"train.{name}"] = [os.path.abspath(v) if isinstance(v, str) else v for v in value]
    return out


def _change(key: str, old, new) -> str:
    name = key[len("train.") :] if key.startswith("train.") else key
    if key.startswith("inputs."):
        name = f"{key[len('inputs.') :]} (content)"

    def show(value) -> str:
        if isinstance(value, str) and len(value) == 64:  # a sha256
            return value[:12]
        if isinstance(value, list) and all(isinstance(v, str) and len(v) == 64 for v in value):
            return "[" + ", ".join(v[:12] for v in value) + "]"
        return repr(value)

    return f"{name}: {show(old)} -> {show(new)}"


def _present(out: Path) -> list[str]:
    return [name + ("/" if (out / name).is_dir() else "") for name in OUTPUTS if (out / name).exists()]


def _holds_run(out: Path) -> bool:
    """Whether `out` holds a run of the trainer: a config.json with the keys vltrain writes."""
    try:
        obj = json.loads((out / CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and all(key in obj for key in _RUN_KEYS)


def _remove_run(out: Path) -> None:
    """The files of the run in `out` (--overwrite): config.json, metrics.jsonl, curves.png;
    in checkpoints/ and tensorboard/ only what the trainer names so (a folder is removed
    when nothing else is left in it)."""
    for name in (CONFIG, METRICS, "curves.png"):
        remove_path(out / name)
    for folder, ours in (
        (out / checkpoint.FOLDER, checkpoint.is_own_file),
        (out / TENSORBOARD, lambda name: name.startswith(_TENSORBOARD_EVENTS)),
    ):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if ours(path.name):
                remove_path(path)
        if not any(folder.iterdir()):
            folder.rmdir()


def _read_config(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise DataError(f"{path}: unreadable ({err}); start again with --overwrite") from err


def _row_step(line: str) -> Optional[int]:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, TypeError, AttributeError):
        return None
