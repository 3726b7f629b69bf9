"""`vltrain finetune`: the trainer's loop (`vl_models.train.trainer`: AMP, DDP, resume,
atomic checkpoints, validation, the best checkpoint) on downstream tasks.

The model is a `heads.TransferModel`: the family's pretraining model (from ``--init``: a
pretraining or fine-tuning run folder or checkpoint of ours — its model config and vocab come
with it —, a published fine-tuned checkpoint (`vl_models.transfer.published`: its encoder or
whole ViLBERT model, task tokens included, and its head for each task where one fits), an HF
LXMERT or vilbert-multi-task pretraining checkpoint with ``--model``, or none: from scratch)
and one head per task, new ones started as the references start theirs (`heads.build_head`;
retrieval's scorer per --retrieval-head, by default the family's: ViLBERT a new ``vil_logit`` as
12-in-1, LXMERT its pair head; RefCOCO, RefCOCO+ and RefCOCOg trained together share one
ViLBERT ``vision_logit``, `heads.build_transfer_model`). Answer heads start from the --init QA
head's rows where the answers match, the other rows zeroed (`weights.copy_answer_rows`,
LXMERT's fine-tuning; the QA table is the --init run's mixture's, or ``--init-answers``;
``--no-copy-answers``: new answer heads). ``--task-tokens`` adds 12-in-1's task-token table to a
ViLBERT whose --init has none (`ModelFamily.with_task_tokens`: 20 rows, started as the model
starts its embeddings; the rest of the model from --init); the run's model config records it,
so a resume, ``vltrain evaluate`` and ``vltrain export`` rebuild it.

Several tasks (``--task vqa --task gqa ...``) train one backbone with a head each, in
one-task batches ordered round-robin, in proportion to the tasks' sizes, or in 12-in-1's
rounds of every task (`TaskBatchSampler`); validation scores every task each epoch
(``eval_<task>_<metric>``) and the best checkpoint is kept by the first task's metric unless
--best-metric says otherwise. 12-in-1's per-task settings (`TransferSettings`: batch size, text
length, splits, and its per-task learning rate as a loss scale) apply per task; --head-lr runs
the heads 12-in-1 names ``vil_*`` at their own learning rate (an optimizer parameter group).
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from pipeline.errors import ConfigError
from pipeline.items.answers import read_answer_file
from pipeline.mixture import Mixture
from pipeline.store import FeatureStore
from pipeline.task_data import TaskData
from vl_models import distributed, transfer
from vl_models.config import FinetuneConfig
from vl_models.data.loader import loader_batches
from vl_models.data.sampler import TaskBatchSampler
from vl_models.families import ModelFamily
from vl_models.models.configuration import check_text_length
from vl_models.models.weights import copy_answer_rows, init_pretraining
from vl_models.train import run_folder, runlog
from vl_models.train.trainer import (
    BestMetric,
    Job,
    absolute_paths,
    check_init,
    check_out,
    check_vocab,
    launch,
    resolve_device,
)
from vl_models.transfer.dataset import TaskDataset, check_given_stores
from vl_models.transfer.evaluate import predict
from vl_models.transfer.heads import TransferModel, build_transfer_model, shared_heads
from vl_models.transfer.published import Published, read_published
from vl_models.transfer.retrieval import with_hard_negatives
from vl_models.transfer.runs import backbone_state, is_finetuned, model_of, our_run

log = logging.getLogger(__name__)


class _Tasks(torch.utils.data.ConcatDataset):
    """The tasks' training views end to end (the `TaskBatchSampler`'s offsets); a key is an
    index or an ``(epoch, index)`` draw (`vl_models.data.loader.EpochBatches`)."""

    def set_epoch(self, epoch: int) -> None:
        for view in self.datasets:
            view.set_epoch(epoch)

    def __getitem__(self, key) -> dict:
        if not isinstance(key, tuple):
            return super().__getitem__(key)
        epoch, index = key
        t = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[t][(epoch, index - (self.cumulative_sizes[t - 1] if t else 0))]


def run_finetune(cfg: FinetuneConfig, on_step: Optional[Callable[[int, dict, int], None]] = None) -> dict:
    """Fine-tune; returns the last logged metrics. Everything that can be wrong with the
    invocation is checked before the model is built and before the run folder is touched."""
    rank, world, local = distributed.world()
    device = resolve_device(cfg.run.device, local, cfg.run.amp)
    runlog.check_reporters(cfg.run.report_to)
    check_out(Path(cfg.out))
    check_init(cfg.init)
    cfg = absolute_paths(cfg)
    tasks = [transfer.get(name) for name in cfg.tasks]
    if cfg.transfer.hard_negatives:
        tasks = with_hard_negatives(tasks, Path(cfg.transfer.hard_negatives))
    datas = [TaskData.open(path, task=t.name) for t, path in zip(tasks, cfg.task_data)]
    start = _Start.of(cfg)
    family = start.family
    # recorded resolved: evaluate, predict and a later resume build the heads trained here (`heads.run_heads`)
    cfg = cfg.with_(retrieval_head=cfg.transfer.retrieval_head or family.retrieval_head)
    cfg = absolute_paths(cfg.with_(vocab=str(start.vocab)))  # recorded: a run fine-tuned from this one finds it
    check_given_stores(tasks, [Path(s) for s in cfg.given_stores], training=True)
    batch_sizes = [cfg.transfer.of_task("task_batch", t.name, cfg.optim.batch_size) for t in tasks]
    _check_text_lengths(cfg, tasks, start)
    views, vals = _views(cfg, tasks, datas, family, Path(start.vocab))
    _check_data(cfg, views, vals, batch_sizes, world)
    check_vocab(views[0].tokenizer, start.mcfg)
    sampler = TaskBatchSampler(
        [len(v) for v in views],
        batch_sizes,
        rank,
        world,
        cfg.run.seed,
        cfg.transfer.task_sampling,
        lengths=[v.text_lengths() for v in views] if cfg.data.group_by_length else None,
    )
    cfg = _schedule(cfg, len(sampler))
    known = {t.metric: "max" for t, v in zip(tasks, vals) if v is not None}
    spec = cfg.run.best_metric or next(iter(known), None)
    best_metric = (
        BestMetric.parse(spec, known, f"the tasks with a validation split ({', '.join(known) or 'none'})")
        if spec
        else None
    )
    torch.manual_seed(cfg.run.seed)  # every check passed: build the model
    model = build_transfer_model(
        family,
        start.mcfg,
        tasks,
        datas,
        pair_loss=cfg.transfer.nlvr2_loss or family.pair_loss,
        retrieval_head=cfg.transfer.retrieval_head,
    )
    # the new task-token table as initialized: filled in where the --init checkpoint has none
    fresh = (
        {family.task_token_table: model.backbone.state_dict()[family.task_token_table].clone()}
        if start.new_table
        else {}
    )
    job = _job(cfg, model, tasks, views, vals, sampler, device, validates=bool(known))
    resolved = _resolved(cfg, start, tasks, datas, views[0].tokenizer.path, world)
    init = _initializer(cfg, model, start, tasks, datas, fresh) if cfg.init else None
    return launch(cfg, model, resolved, job, device, best_metric, on_step, init)


@dataclass
class _Start:
    """What --init gives the run: the run folder or checkpoint of ours it names (`source`; its
    record: `run`) or the published checkpoint (`published`), the answer table of its QA head,
    the model family and config (with --task-tokens' table; `new_table`: --init has none) and
    the vocab (--vocab, else --init's)."""

    source: Optional[Path]
    run: Optional[dict]
    published: Optional[Published]
    old_answers: Optional[list[str]]
    family: ModelFamily
    mcfg: Any
    new_table: bool
    vocab: str

    @classmethod
    def of(cls, cfg: FinetuneConfig) -> "_Start":
        source, run = our_run(cfg.init)
        published = None if run else read_published(cfg.init, cfg.model)
        old_answers = _init_answers(cfg, run)
        if published is not None:
            published.check_store(FeatureStore.open(cfg.stores[0]).layout)
            family, mcfg = published.family, published.mcfg
        else:
            family, mcfg = model_of(cfg.model, run, cfg.stores[0], len(old_answers or ()))
        given_mcfg = mcfg
        if cfg.transfer.task_tokens:
            mcfg = family.with_task_tokens(mcfg)
        new_table = mcfg != given_mcfg  # not in the --init model: left as the model starts it
        vocab = cfg.vocab or (run and run["train"].get("vocab")) or (published and str(published.vocab))
        if not vocab:
            raise ConfigError("--vocab: name the vocab (there is no --init run of ours to take it from)")
        return cls(source, run, published, old_answers, family, mcfg, new_table, vocab)


def _check_text_lengths(cfg: FinetuneConfig, tasks, start: _Start) -> None:
    """Each task's text length (--task-max-text, else --max-text, the task's or the family's)
    fits the model."""
    for t in tasks:
        length = cfg.transfer.of_task("task_max_text", t.name, cfg.data.max_text) or t.max_text or start.family.max_text
        named = t.name in cfg.transfer.task_max_text
        check_text_length(start.mcfg, length, f"--task-max-text {t.name}={length}" if named else f"--max-text {length}")


def _views(
    cfg: FinetuneConfig, tasks, datas, family: ModelFamily, vocab: Path
) -> tuple[list[TaskDataset], list[Optional[TaskDataset]]]:
    """Each task's training view, and its validation view (None where its data has no such split)."""
    stores, given = [Path(s) for s in cfg.stores], [Path(s) for s in cfg.given_stores]
    per_task = cfg.transfer.of_task

    def view(t: int, split: str, train: bool) -> TaskDataset:
        data = replace(cfg.data, max_text=per_task("task_max_text", tasks[t].name, cfg.data.max_text))
        return TaskDataset(
            datas[t], tasks[t], stores, vocab, family, data, split, cfg.run.seed, train, t, given_stores=given
        )

    splits = [
        (
            per_task("task_train_split", t.name, cfg.transfer.train_split or t.train_split),
            per_task("task_val_split", t.name, cfg.transfer.val_split or t.val_split),
        )
        for t in tasks
    ]
    _check_val_splits(cfg, tasks, datas)
    views = [view(t, train, True) for t, (train, _) in enumerate(splits)]
    vals = [view(t, val, False) if val in datas[t].splits else None for t, (_, val) in enumerate(splits)]
    return views, vals


def _schedule(cfg: FinetuneConfig, batches: int) -> FinetuneConfig:
    """--epochs as steps, and --eval-every 0 as once an epoch, over an epoch of `batches`."""
    per_epoch = max(1, batches // cfg.optim.grad_accum)
    if cfg.optim.epochs is not None:
        cfg = cfg.with_(steps=max(1, math.ceil(cfg.optim.epochs * per_epoch)))
    if cfg.run.eval_every == 0:
        cfg = cfg.with_(eval_every=per_epoch)  # validation each epoch
    return cfg


def _job(cfg: FinetuneConfig, model: TransferModel, tasks, views, vals, sampler, device, validates: bool) -> Job:
    """The trainer's job: one-task batches of the tasks' views, each task's head's loss
    (scaled by --task-lr), validation of every task with a validation view."""
    family = model.family
    # --task-lr: 12-in-1 runs the optimizer at the lowest task lr and scales each task's loss
    lr = cfg.optim.lr
    loss_scale = {t.name: cfg.transfer.of_task("task_lr", t.name, lr) / lr if lr else 1.0 for t in tasks}

    def loss(wrapped, batch, epoch, step):
        name = tasks[int(batch["task_id"][0])].name
        value, metrics = model.heads[name].loss(wrapped(name, batch), batch)
        return value * loss_scale[name], {name: value}, {f"{name}_{k}": v for k, v in metrics.items()}

    def validate(m) -> dict:
        scores = {}
        for task, val in zip(tasks, vals):
            if val is not None:
                found = task.score(val.data, predict(m, val, device, cfg.optim.batch_size, cfg.transfer.eval_items))
                scores.update({f"eval_{task.name}_{k}": v for k, v in found.items()})
        return scores

    data = _Tasks(views)
    return Job(
        sampler=sampler,
        batches=lambda s, consumed, device: loader_batches(data, s, cfg, consumed, device, batched=True),
        loss=loss,
        checks=(*cfg.tasks, "total"),
        validate=validate if validates else None,
        compile_target=lambda m: family.backbone(m.backbone),
        lr_scale=_head_lr_scale(model, cfg),
    )


def _resolved(cfg: FinetuneConfig, start: _Start, tasks, datas, vocab_path, world: int) -> dict:
    """The run's record of its settings, model and inputs."""
    return {
        "train": cfg.to_json(),
        "model": start.mcfg.to_json(),
        "kind": start.family.name,
        "tasks": list(cfg.tasks),
        "answers": {t.name: run_folder.answers_digest(d) for t, d in zip(tasks, datas)},
        "world_size": world,
        "inputs": {
            **run_folder.input_digests(None, [Path(s) for s in cfg.stores], vocab_path),
            "task_data": [run_folder.content_digest(d) for d in datas],
        },
    }


def _initializer(cfg: FinetuneConfig, model: TransferModel, start: _Start, tasks, datas, fresh: dict):
    """What starts the model from --init (the trainer calls it on a new run, not on a resume):
    it loads the weights and says what it did."""
    family, published, source, old_answers = start.family, start.published, start.source, start.old_answers

    def init() -> str:
        copy = cfg.transfer.copy_answers
        if published is not None:
            filled = replace(published, encoder={**fresh, **published.encoder})
            said = _init_published(model, filled, tasks, datas, old_answers, copy)
        elif is_finetuned(start.run):  # a fine-tuned backbone (its heads stay behind)
            model.backbone.load_state_dict({**fresh, **backbone_state(source)})
            said = f"the backbone of fine-tuning run {source}"
        else:
            said = init_pretraining(
                model.backbone, source or Path(cfg.init), lambda m, state: family.load_checkpoint(m, {**fresh, **state})
            )
        if published is None and copy:
            said += _copy_answers(model, family, tasks, datas, old_answers)
        if fresh:
            said += f"; task tokens: a new table of {start.mcfg.task_tokens} rows (--task-tokens)"
        shared = [", ".join(names) for names in shared_heads(model).values()]
        return said + (f"; one scoring layer shared by {'; by '.join(shared)}" if shared else "")

    return init


def _head_lr_scale(model: TransferModel, cfg: FinetuneConfig) -> Optional[Callable[[str], float]]:
    """--head-lr: the learning rate of the heads 12-in-1 names ``vil_*`` over --lr, by parameter name."""
    if not cfg.transfer.head_lr or not cfg.optim.lr:
        return None
    fast = tuple(f"heads.{name}." for name, head in model.heads.items() if getattr(head, "vil", False))
    scale = cfg.transfer.head_lr / cfg.optim.lr
    return lambda name: scale if name.startswith(fast) else 1.0


def _check_val_splits(cfg: FinetuneConfig, tasks, datas) -> None:
    """ConfigError for a val split named by --val-split, --task-val-split (or a recipe) that
    the task's data lacks; only a task's own default val split may be missing (no validation)."""
    for task, data in zip(tasks, datas):
        own = task.name in cfg.transfer.task_val_split
        named = cfg.transfer.of_task("task_val_split", task.name, cfg.transfer.val_split)
        if named and named not in data.splits:
            flag = f"--task-val-split {task.name}={named}" if own else f"--val-split {named}"
            raise ConfigError(
                f"{flag}: {data.path} has no split {named!r} (its splits: {', '.join(data.splits)}); "
                "name one of them (a --recipe's value can be replaced by the flag)"
            )


def _check_data(cfg: FinetuneConfig, views, vals, batch_sizes: list[int], world: int) -> None:
    for v, size in zip(views, batch_sizes):
        if len(v) // world < size:
            raise ConfigError(
                f"{v.data.path}: {len(v)} {v.task.name} training examples in split {v.split!r}, fewer "
                f"than its batch size {size} per rank ({world} ranks): no full batch"
            )
    missing = sorted({k for v in [*views, *(x for x in vals if x is not None)] for k in v.missing_images()})
    if missing:
        raise ConfigError(
            f"{len(missing)} images of the task data are in no feature store ({', '.join(cfg.stores)}), "
            f"e.g. {', '.join(missing[:5])}: extract them (or map their names with build-task "
            "--image-map)"
        )


def _init_answers(cfg: FinetuneConfig, run: Optional[dict]) -> Optional[list[str]]:
    """The --init checkpoint's QA answer table: --init-answers, else its run's mixture's (if still there)."""
    if cfg.transfer.init_answers:
        return read_answer_file(Path(cfg.transfer.init_answers))
    mixture = run and run["train"].get("mixture")
    if mixture and Path(mixture).is_dir():
        return Mixture.open(mixture).answers
    return None


def _init_published(
    model: TransferModel, published, tasks, datas, old_answers: Optional[list[str]], copy_answers: bool = True
) -> str:
    """The published checkpoint's encoder into the backbone (a ViLBERT layout: the whole
    pretraining model); into each task head the checkpoint's head for that task
    (`Published.head_for`) when it is of the same shape: whole where the answer tables have the
    same length (the checkpoint's own table), else (with --init-answers, the checkpoint's table,
    and `copy_answers`) the hidden layers whole and the rows by answer string, as from a
    pretraining QA head. A scoring layer tasks share (12-in-1's ``vision_logit``) is the
    checkpoint's one head for all of them. Returns a note for the log."""
    published.load_encoder(model.backbone)
    notes = []
    for task, data in zip(tasks, datas):
        name = published.head_for(task)
        head = model.heads[task.name]
        state = published.heads.get(name, {})
        if name is None or sorted(state) != sorted(head.state_dict()):
            notes.append(f"{task.name}: a new {task.head} head (the checkpoint has none of its shape)")
        elif task.head != "answers" or len(data.answers) == published.answers_of(name):
            published.load_head(head, name)
            notes.append(f"{task.name}: the checkpoint's head {name}")
        elif old_answers and copy_answers:
            if len(old_answers) != published.answers_of(name):
                raise ConfigError(
                    f"--init-answers: {len(old_answers)} answers for the checkpoint's {published.answers_of(name)} "
                    "answer rows"
                )
            fc = {k[len("logit_fc.") :]: v for k, v in state.items()}
            copied = _answer_head_from(head.logit_fc, fc, old_answers, data.answers)
            notes.append(f"{task.name}: {copied} of {len(data.answers)} answer rows from the checkpoint's {name}")
        else:
            how = "--no-copy-answers" if old_answers else "--init-answers names its table to copy rows by answer"
            notes.append(
                f"{task.name}: a new answer head ({len(data.answers)} answers; the checkpoint's {name} has "
                f"{published.answers_of(name)}: {how})"
            )
    return f"{published.note(*tasks)}; {'; '.join(notes)}"


def _copy_answers(model: TransferModel, family, tasks, datas, old_answers: Optional[list[str]]) -> str:
    """Start each answer head from the pretraining QA head (LXMERT's fine-tuning): the hidden
    layers as they are, the output rows by answer string. Returns a note for the log."""
    qa = family.qa_head(model.backbone)
    if qa is None or not old_answers:
        return ""
    notes = []
    for task, data in zip(tasks, datas):
        if task.head != "answers" or qa[3].out_features != len(old_answers):
            continue
        copied = _answer_head_from(model.heads[task.name].logit_fc, qa.state_dict(), old_answers, data.answers)
        notes.append(f"{task.name}: {copied} of {len(data.answers)} answer rows from the QA head")
    return f"; {'; '.join(notes)}" if notes else ""


def _answer_head_from(head: torch.nn.Sequential, state: dict, old_answers: list[str], new_answers: list[str]) -> int:
    """An answer classifier started from a trained one's tensors (`state`: ``0.*``, ``2.*``,
    ``3.*``, its rows the entries of `old_answers`): the hidden layers whole, the output rows
    by answer string (`copy_answer_rows`). Returns how many rows were copied."""
    head[:3].load_state_dict({k: v for k, v in state.items() if not k.startswith("3.")})
    return copy_answer_rows(head[3], state["3.weight"], state["3.bias"], old_answers, new_answers)
