"""Loading a run as a `Predictor` (`load_predictor`): its checkpoint, its heads (a fine-tuning
run's task heads with their answer tables, checked by digest; a pretraining run's zero-shot
heads), its vocab and store, and the checks that what is loaded is what the run was trained
with (another ``--store`` must come from the same detector as the run's). `recorded_inputs`:
what a run reads, from its config.json alone."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Optional, Sequence, Union

from torch import nn

from pipeline.detect.like_store import ProvenanceError, StoreDetector
from pipeline.download.fetch import FetchConfig
from pipeline.errors import ConfigError
from pipeline.mixture import Mixture
from pipeline.store import FeatureStore
from pipeline.store.manifest import IDENTITY_KEYS
from pipeline.task_data import TaskData
from vl_models import distributed, families, transfer
from vl_models.data.tokenize import WordPiece
from vl_models.models.weights import init_pretraining
from vl_models.predict.heads import PAIR_HEAD, PretrainingAnswers, TaskHead
from vl_models.predict.predictor import Predictor
from vl_models.train import checkpoint
from vl_models.train.run_folder import answers_digest
from vl_models.train.trainer import resolve_device
from vl_models.transfer.heads import RetrievalHead, TransferModel, build_transfer_model, run_heads
from vl_models.transfer.retrieval import FLICKR30K
from vl_models.transfer.runs import backbone_state, data_settings, is_finetuned
from vl_models.transfer.vqa import TASK as VQA

log = logging.getLogger(__name__)


def load_predictor(
    source: Union[str, Path],
    *,
    device: str = "cpu",
    step: Union[int, str, None] = None,
    weights: Optional[Union[str, Path]] = None,
    detector: Optional[str] = None,
    store: Optional[Union[str, Path]] = None,
    vocab: Optional[Union[str, Path]] = None,
    task_data: Optional[dict] = None,
    fetch: FetchConfig = FetchConfig(),
    batch_size: int = 16,
    detector_threads: Optional[int] = None,
) -> Predictor:
    """A `Predictor` for a run of ours (its ``latest`` checkpoint, or `step`: a number, ``best``):
    a fine-tuning run's task heads, or a pretraining run's zero-shot heads (the pair head;
    LXMERT's QA head over its mixture's answers). New images go through the detector of the
    run's store (or `store`'s) as `StoreDetector` finds it (`weights` / `detector` where the
    recorded ones are not at hand; `detector_threads`: CPU threads for it, default every CPU for
    the region detectors, whose features are the same at any thread count, and the store's run's
    for the others, for bitwise-equal features). `task_data`: task name -> task dataset folder, where the
    run's recorded one is not there (its answer table)."""
    device = resolve_device(device, distributed.world()[2])
    path = Path(source)
    if not path.exists():  # a broken symbolic link, or a loop of them, too
        link = " (a symbolic link to nothing, or a loop of links)" if path.is_symlink() else ""
        raise ConfigError(f"--checkpoint {source} does not exist{link}")
    ckpt = checkpoint.resolve(path, step, role="--checkpoint")
    state = checkpoint.load(ckpt, "--checkpoint")
    run = state.get("run")
    if not run:
        raise ConfigError(f"{source}: not a run of vltrain (its checkpoint records no run)")
    family = families.from_run(run)
    mcfg = family.config_class.from_json(run["model"])
    train = run["train"]
    store_path = Path(store or _recorded(train.get("stores"), "feature store", "--store"))
    if store:
        _check_same_detector(store_path, train.get("stores") or ())
    vocab_path = Path(vocab or _recorded(train.get("vocab"), "vocab", "--vocab"))
    heads: dict[str, TaskHead] = {}
    unknown = sorted(set(task_data or {}) - set(run.get("tasks") or ()))
    if unknown:
        raise ConfigError(
            f"--data {', '.join(unknown)}: {source} has no such head "
            f"(its heads: {', '.join(run.get('tasks') or ()) or 'none: a pretraining run'})"
        )
    if is_finetuned(run):
        tasks = [transfer.get(name) for name in run["tasks"]]
        folders = dict(zip(run["tasks"], train.get("task_data") or ()))
        folders.update(task_data or {})
        tables = {t.name: _answer_table(t, folders.get(t.name), run) for t in tasks}
        model = build_transfer_model(family, mcfg, tasks, [_Table(tables[t.name]) for t in tasks], **run_heads(run))
        model.load_state_dict(backbone_state(ckpt, heads=tuple(run["tasks"])))
        for t in tasks:
            folder = folders.get(t.name)
            heads[t.name] = TaskHead(
                task=t,
                answers=tables[t.name],
                settings=data_settings(run, t.name),
                path=Path(folder) if folder else None,
            )
    else:
        backbone = family.build(mcfg)
        init_pretraining(backbone, ckpt, family.load_checkpoint)
        modules: dict[str, nn.Module] = {PAIR_HEAD: RetrievalHead(1)}
        settings = data_settings(run)
        pair_task = copy.copy(FLICKR30K)
        pair_task.name = PAIR_HEAD
        heads[PAIR_HEAD] = TaskHead(task=pair_task, answers=[], settings=settings, zero_shot=True)
        mixture = train.get("mixture")
        if family.answers and mixture and Path(mixture).is_dir():
            modules[VQA.name] = PretrainingAnswers(family.qa_head(backbone))
            heads[VQA.name] = TaskHead(
                task=VQA, answers=Mixture.open(mixture).answers, settings=settings, zero_shot=True
            )
        model = TransferModel(family, backbone, modules)
    opened = FeatureStore.open(store_path, dtype="float32") if store_path.exists() else None
    inputs = [Path(source), store_path, vocab_path, *(h.path for h in heads.values() if h.path is not None)]
    if weights is not None:
        inputs.append(Path(weights))
    predictor = Predictor(
        model=model,
        heads=heads,
        tokenizer=WordPiece(vocab_path),
        store=opened,
        detector_of=lambda: StoreDetector.of(
            store_path,
            weights=weights,
            detector=detector,
            device=device,
            fetch_cfg=fetch,
            threads=detector_threads,
        ),
        device=device,
        batch_size=batch_size,
        source=str(source),
    )
    predictor.inputs = inputs
    return predictor


class _Table:
    """An answer table where `build_transfer_model` expects a task dataset."""

    def __init__(self, answers: list):
        self.answers = answers


def _answer_table(task, folder: Optional[str], run: dict) -> list:
    """A classifier task's answer table (the task dataset's the run was trained on, checked by
    its digest); [] for the other heads."""
    if task.head != "answers":
        return []
    if not folder or not Path(folder).is_dir():
        raise ConfigError(
            f"the {task.name} head's answer table is in its task dataset {folder}, which is not there: "
            f"name it with --data {task.name}=FOLDER"
        )
    data = TaskData.open(folder, task=task.name)
    if answers_digest(data) != run["answers"][task.name]:
        raise ConfigError(f"{folder}: its answer table is not the one the {task.name} head was trained on")
    return list(data.answers)


def _check_same_detector(store: Path, recorded: Sequence[str]) -> None:
    """`--store`'s detector is the one the run's recorded store was extracted with (its
    provenance's detector, weights, box policy and preprocessing); unknown when that store is
    not on this machine (said in the log)."""
    here = [Path(p) for p in recorded if Path(p).exists()]
    if not here:
        log.warning("--store %s: the run's own store is not here to check that the detector is the same", store)
        return
    keys = (*IDENTITY_KEYS, "preprocess")
    theirs = {k: FeatureStore.open(here[0]).manifest.provenance.get(k) for k in keys}
    ours = {k: FeatureStore.open(store).manifest.provenance.get(k) for k in keys}
    differ = [k for k in keys if theirs[k] != ours[k]]
    if differ:
        raise ProvenanceError(
            f"--store {store}: its features come from another detector than the run's store {here[0]} "
            f"({', '.join(f'{k} {ours[k]!r}, not {theirs[k]!r}' for k in differ)})"
        )


def _recorded(value, what: str, flag: str) -> str:
    value = value[0] if isinstance(value, (list, tuple)) and value else value
    if not value:
        raise ConfigError(f"{flag}: the run records no {what}; name it")
    if not Path(value).exists():
        raise ConfigError(f"the run's {what} {value} is not there: name it with {flag}")
    return str(value)


def recorded_inputs(source: Union[str, Path]) -> list[Path]:
    """What a run folder's config.json says its model reads (its stores, vocab, task datasets),
    read without loading the checkpoint: what `vltrain predict` keeps its outputs off before it
    takes their locks ([] for a checkpoint file outside a run folder; `load_predictor` knows)."""
    config = Path(source) / "config.json"
    try:
        train = json.loads(config.read_text(encoding="utf-8")).get("train", {}) if config.is_file() else {}
    except (OSError, ValueError, RecursionError, AttributeError):
        return []
    named = [*(train.get("stores") or ()), train.get("vocab"), *(train.get("task_data") or ())]
    return [Path(p) for p in named if isinstance(p, str) and p]
