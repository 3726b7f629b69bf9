"""`vltrain pretrain`: the training loop.

Model dims that come from the data are taken from it: region feature width and class /
attribute counts from the first feature store, the QA head from the mixture's answer
table. What can be wrong with the invocation or the inputs is checked before any work
and any write: device, reporters, mixture, the model family's tasks (--loss-weight,
--task-from), --best-metric and --region-overlap, vocab, a batch the data can fill on every
rank, images missing from the stores; the model is built only once those pass, then the
run folder is checked (`run_folder.plan`: an earlier run there is continued only with
``resume``, replaced only with ``overwrite``).

The run folder gets ``config.json`` (resolved), ``metrics.jsonl`` (rank 0), with
``report_to`` TensorBoard events, and ``checkpoints/`` (atomic and checksummed; ``latest``
and, with ``best_metric``, ``best`` pointers; older ones pruned to ``keep_last``).
``resume`` continues from ``latest`` with model, optimizer, scaler, RNG states and the
sampler position restored, so N steps straight equal N/2 + resume + N/2, after a SIGKILL
too, and under torchrun with any number of ranks (DDP's gradient buckets never change:
`train_loop`). A non-finite loss stops the run on every rank before its optimizer step
(`DivergedError`); parameters are checked finite before every checkpoint.

Under torchrun (one node or several) rank 0 writes the run folder; every rank validates
its share of the val split (`Job.validate`), so no rank waits in a collective for the
whole of another's evaluation (``dist_timeout`` bounds every wait). With ``resume auto``
a restarted worker group (torchrun ``--max-restarts``) continues from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from pipeline.errors import ConfigError, DivergedError
from pipeline.io import exclusive_lock
from pipeline.mixture import Mixture
from pipeline.store import FeatureStore
from vl_models import distributed, families
from vl_models.config import TrainConfig, flat_settings
from vl_models.data.dataset import PretrainDataset
from vl_models.data.loader import Consumed, loader_batches, to_device
from vl_models.data.sampler import ResumableSampler
from vl_models.eval.evaluate import evaluate
from vl_models.families.base import ModelFamily
from vl_models.models.configuration import check_text_length
from vl_models.models.weights import init_pretraining
from vl_models.tasks.pretrain import pretrain_losses
from vl_models.train import checkpoint, run_folder, runlog
from vl_models.train.optim import lr_at, make_optimizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BestMetric:
    """`--best-metric NAME[:max|min]`: the validation score that picks the best checkpoint."""

    name: str
    mode: str  # max | min

    @classmethod
    def parse(cls, spec: str, known: dict[str, str], owner: str) -> "BestMetric":
        """`spec` among the validation scores `known` (name -> better direction) of `owner`."""
        name, _, mode = spec.partition(":")
        if name not in known:
            raise ConfigError(f"--best-metric {name!r} is not a validation score of {owner}; known: {', '.join(known)}")
        mode = mode or known[name]
        if mode not in ("max", "min"):
            raise ConfigError(f"--best-metric {spec!r}: the direction after ':' is max or min")
        return cls(name, mode)

    def better(self, value: Optional[float], than: Optional[float]) -> bool:
        if value is None or not math.isfinite(value):
            return False
        return than is None or (value > than if self.mode == "max" else value < than)


def resolve_device(name: str, local_rank: int, amp: str = "none") -> str:
    """The torch device of this rank for ``--device`` `name` (`pipeline.config.check_device`'s
    names): cpu; cuda, the local rank's GPU (one GPU per rank under torchrun); cuda:N, GPU N;
    auto, cuda when a CUDA device is visible, else cpu. ConfigError when CUDA is asked for and
    not there, or when `amp` is fp16 and the device is a CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        if amp == "fp16":
            raise ConfigError("--amp fp16 needs a CUDA device, and --device auto found none (use bf16 on CPU)")
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {name}: no CUDA device is visible to this process (torch.cuda.is_available() is "
            "False); use --device cpu, or check the driver and CUDA_VISIBLE_DEVICES"
        )
    count = torch.cuda.device_count()
    index = int(name.partition(":")[2] or local_rank)
    if name != "cuda" and local_rank > 0:
        raise ConfigError(
            f"--device {name}: every rank of this node would use GPU {index}; under torchrun give cuda "
            "(each rank its local rank's GPU)"
        )
    if index >= count:
        need = f"local rank {local_rank} needs GPU {index}" if name == "cuda" else f"GPU {index} asked for"
        advice = f"start at most {count} processes per node" if name == "cuda" else f"GPUs 0-{count - 1} are there"
        raise ConfigError(f"--device {name}: {need}, but {count} are visible: {advice}")
    return f"cuda:{index}"


def model_config(cfg: TrainConfig, answers: int) -> tuple[ModelFamily, object]:
    """(family, model config fitted to the data) for `cfg.model`: the feature width and label
    counts from the first store, the answer-table size from `answers`; every store's label ids
    checked against those counts (`check_label_ids`). Nothing is built."""
    mcfg = families.load_config(cfg.model)
    family = families.of_config(mcfg)
    layout = FeatureStore.open(cfg.stores[0]).layout
    family.check_labels(layout, cfg.task.weights, cfg.stores[0])
    fitted = family.fit(mcfg, layout, answers, cfg.stores[0])
    family.check_label_ids(fitted, cfg.stores)
    return family, fitted


def build_model(cfg: TrainConfig, answers: int) -> tuple[ModelFamily, object, torch.nn.Module]:
    """(family, fitted model config, model) of a run (`model_config`, then the family's builder)."""
    family, mcfg = model_config(cfg, answers)
    return family, mcfg, family.build(mcfg)


@dataclass
class Job:
    """What a run trains, for the loop (`train_loop`): pretraining (`run`) or fine-tuning
    (`vl_models.transfer.finetune`). `batches(sampler, consumed, device)` gives endless batches
    for `device` and keeps `consumed` (`vl_models.data.loader.Consumed`) at the epoch and position
    of the last one handed out; `loss(model, batch, epoch, step)` gives (total, per-part losses,
    metrics: tensors or numbers); `checks` are the parts whose finiteness
    all ranks agree on; `validate(model)` scores the model, called on every rank, each
    scoring its share and all returning the same scores (None: no validation);
    `compile_target(model)` is what --compile compiles; `lr_scale(name)`, where given, is a
    parameter's learning rate over the schedule's (fine-tuning's faster task heads)."""

    sampler: Any
    batches: Callable[[Any, dict], Iterator[dict]]
    loss: Callable[..., tuple]
    checks: tuple[str, ...]
    validate: Optional[Callable[[torch.nn.Module], dict]]
    compile_target: Callable[[torch.nn.Module], torch.nn.Module]
    lr_scale: Optional[Callable[[str], float]] = None


def check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")


def absolute_paths(cfg):
    """`cfg` (a TrainConfig or FinetuneConfig) with each input path (`run_folder.PATH_SETTINGS`)
    that exists from here made absolute: the run folder's config.json then names its inputs
    for a command started in any folder (`vltrain evaluate` of the run, a fine-tuning --init)."""
    saved = flat_settings(cfg.to_json())
    changed = {}
    for name in run_folder.PATH_SETTINGS:
        value = saved.get(name)
        if isinstance(value, str) and value and Path(value).exists():
            changed[name] = str(Path(value).absolute())
        elif isinstance(value, (list, tuple)):
            changed[name] = tuple(str(Path(v).absolute()) if Path(v).exists() else v for v in value)
    return cfg.with_(**changed) if changed else cfg


def check_init(init: Optional[str]) -> None:
    """ConfigError when --init names nothing that exists (before any other work)."""
    if init and not (Path(init).exists() or Path(init).is_symlink()):
        raise ConfigError(f"--init {init} does not exist: name a checkpoint file or folder")


def check_vocab(tokenizer, mcfg) -> None:
    """ConfigError when the vocab has more tokens than the model's embeddings."""
    if tokenizer.vocab_size > mcfg.vocab_size:
        raise ConfigError(
            f"{tokenizer.path}: {tokenizer.vocab_size} tokens, more than the model's "
            f"vocab_size {mcfg.vocab_size} ({mcfg.name}): use the model's vocab, or a model config "
            "with a larger vocab_size"
        )


def run(cfg: TrainConfig, on_step: Optional[Callable[[int, dict, int], None]] = None) -> dict:
    """Pretrain; returns the last logged metrics ({} when a resumed run was already at its end).
    `on_step(step, metrics, steps)` is called on rank 0 at every logged step; `steps` is the
    schedule's last step (from --epochs when given, so a progress bar knows its total)."""
    rank, world, local = distributed.world()
    device = resolve_device(cfg.run.device, local, cfg.run.amp)
    runlog.check_reporters(cfg.run.report_to)
    check_out(Path(cfg.out))
    check_init(cfg.init)
    cfg = absolute_paths(cfg)
    mixture = Mixture.open(cfg.mixture)
    family, mcfg = model_config(cfg, len(mixture.answers))
    cfg.task.check(family)
    length = cfg.data.max_text or family.max_text
    check_text_length(mcfg, length, f"--max-text {length}")
    best_metric = (
        BestMetric.parse(cfg.run.best_metric, family.eval_metrics, family.name) if cfg.run.best_metric else None
    )
    data, val = _datasets(cfg, mixture, family, world)
    cfg = cfg.scheduled(len(data), world)
    check_vocab(data.tokenizer, mcfg)
    if best_metric and val is None:
        raise ConfigError(f"--best-metric {cfg.run.best_metric}: {cfg.mixture} has no val split to score")
    torch.manual_seed(cfg.run.seed)  # every check passed: build the model
    model = family.build(mcfg)
    resolved = {
        "train": cfg.to_json(),
        "model": mcfg.to_json(),
        "kind": family.name,
        "world_size": world,
        "inputs": run_folder.input_digests(mixture, [Path(p) for p in cfg.stores], data.tokenizer.path),
    }

    def init() -> str:
        return init_pretraining(model, Path(cfg.init), family.load_checkpoint)

    job = Job(
        sampler=ResumableSampler(
            len(data),
            rank,
            world,
            cfg.run.seed,
            lengths=data.text_lengths if cfg.data.group_by_length else None,
            batch_size=cfg.optim.batch_size,
        ),
        batches=lambda sampler, consumed, device: loader_batches(data, sampler, cfg, consumed, device),
        loss=lambda wrapped, batch, epoch, step: pretrain_losses(family, wrapped, batch, cfg.task, epoch, step),
        checks=(*family.tasks, "total"),
        validate=(lambda m: evaluate(family, m, val, device, batch_size=cfg.optim.batch_size)) if val else None,
        compile_target=family.backbone,
    )
    return launch(cfg, model, resolved, job, device, best_metric, on_step, init if cfg.init else None)


def launch(
    cfg,
    model: torch.nn.Module,
    resolved: dict,
    job: Job,
    device: str,
    best_metric: Optional[BestMetric],
    on_step: Optional[Callable[[int, dict, int], None]],
    init: Optional[Callable[[], str]],
) -> dict:
    """Take the run folder (lock, `run_folder.plan`), initialize the model (`init`, not on a
    resume: before any write, so a bad --init leaves the folder as it was), start the process
    group, `begin` the run folder and train."""
    out = Path(cfg.out)
    with contextlib.ExitStack() as held:
        if distributed.is_main():  # a second writer of this folder is turned away at once
            held.enter_context(exclusive_lock(out, "training run"))
        start = run_folder.plan(out, cfg, resolved)
        if init and start.state is None:  # read before the first write: a bad --init leaves the folder as it was
            log.info("initialized from %s: %s", cfg.init, init())
        distributed.init(device, cfg.run.dist_timeout)
        distributed.barrier(device)  # every rank has planned (read the folder) before rank 0 writes to it
        if distributed.is_main():
            run_folder.begin(out, start, resolved)
        distributed.barrier(device)
        return train_loop(cfg, model, job, device, start, resolved, best_metric, on_step)


def split_data(cfg: TrainConfig, mixture: Mixture, family: ModelFamily, split: str) -> PretrainDataset:
    """A split of the run's mixture as the run's model sees it (the train split in training,
    the val split in validation and in any later evaluation of the run)."""
    return PretrainDataset(
        mixture, [Path(s) for s in cfg.stores], Path(cfg.vocab), cfg.data, family, split, seed=cfg.run.seed
    )


def _datasets(
    cfg: TrainConfig, mixture: Mixture, family: ModelFamily, world: int
) -> tuple[PretrainDataset, Optional[PretrainDataset]]:
    """The train split (checked to fill a batch on every rank) and the val split (None
    without one); ConfigError naming the images that no store holds."""
    data = split_data(cfg, mixture, family, "train")
    per_rank = len(data) // world
    if per_rank < cfg.optim.batch_size:
        ranks = f" ({per_rank} per rank over {world} ranks)" if world > 1 else ""
        raise ConfigError(
            f"the train split of {cfg.mixture} has {len(data)} items{ranks}, fewer than --batch-size "
            f"{cfg.optim.batch_size}: no full batch; lower --batch-size (or use fewer ranks)"
        )
    val = split_data(cfg, mixture, family, "val") if "val" in mixture.splits else None
    if val is None:
        log.info("%s has no val split: no validation", cfg.mixture)
    missing = sorted(set(data.missing_images()) | set(val.missing_images() if val is not None else ()))
    if missing:
        raise ConfigError(
            f"{len(missing)} images of {cfg.mixture} are in no feature store ({', '.join(cfg.stores)}), "
            f"e.g. {', '.join(missing[:5])}: extract them, or rebuild the mixture with --stores "
            "and --drop-missing"
        )
    return data, val


def train_loop(
    cfg,
    model,
    job: Job,
    device: str,
    start: run_folder.Plan,
    resolved: dict,
    best_metric: Optional[BestMetric],
    on_step: Optional[Callable[[int, dict, int], None]],
) -> dict:
    """The optimizer loop of a run (`cfg`: a TrainConfig or FinetuneConfig; its optim and run sections)."""
    _, world, _ = distributed.world()
    main = distributed.is_main()
    out = Path(cfg.out)
    model.to(device)
    sampler = job.sampler
    optimizer = make_optimizer(model, cfg.optim.optimizer, cfg.optim.lr, cfg.optim.weight_decay, scale_of=job.lr_scale)
    scales = [group["lr_scale"] for group in optimizer.param_groups]  # this run's (a resume keeps them)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.run.amp == "fp16")
    step, best = start.step, None
    if start.state is not None:
        state = start.state
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        sampler.load_state_dict(state["sampler"])
        checkpoint.set_rng_state(state["rng"])
        saved_best = state.get("best") or {}
        if best_metric and (saved_best.get("metric"), saved_best.get("mode")) == (best_metric.name, best_metric.mode):
            best = saved_best  # a changed --best-metric starts its own record
        log.info("resumed %s at step %d", out, step)
    if world > 1 or cfg.run.compile:  # DDP and the compiler expect sparse-flagged embeddings' grads sparse
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                module.sparse = False
    if cfg.run.compile:
        job.compile_target(model).compile()  # in place: checkpoint keys unchanged
    # DDP all-reduces the gradients bucket by bucket, and the all-reduce adds each element's
    # values from the ranks in an order set by where the element lies in its bucket: from
    # three ranks on, the order shows in the rounding. Without find_unused_parameters, DDP
    # reduces a process's first step in the buckets it was built with (torch 2.14: one of
    # every parameter) and rebuilds them after that step's backward, in the order the
    # gradients became ready; a restarted process (torchrun's restart, any resume) would
    # reduce the checkpoint's next step in other buckets than the uninterrupted run did.
    # With it DDP never rebuilds: every step of every process has the same buckets, and a
    # resume continues the run bit for bit. (torch warns once when it finds none unused.)
    wrapped = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True) if world > 1 else model
    metrics_log = runlog.RunLog(out, cfg.run.report_to, step) if main else None
    if metrics_log and start.notes:
        metrics_log.note(step, f"resumed at step {step} with changed settings: {'; '.join(start.notes)}")
        log.info("resumed with changed settings: %s", "; ".join(start.notes))
    autocast = torch.autocast(
        device.split(":")[0],
        enabled=cfg.run.amp != "none",
        dtype=torch.bfloat16 if cfg.run.amp == "bf16" else torch.float16,
    )
    consumed = Consumed(sampler.epoch, sampler.position)  # what the loop took (workers read ahead)
    batches = job.batches(sampler, consumed, device)
    checks = job.checks  # the losses whose finiteness all ranks agree on
    metrics: dict = {}
    started, waited, first, skipped = time.perf_counter(), 0.0, step, 0
    model.train()
    end = min(cfg.optim.steps, cfg.run.stop_at or cfg.optim.steps)
    per_step = cfg.optim.batch_size * cfg.optim.grad_accum * world  # examples per optimizer step
    try:
        while step < end:
            lr = lr_at(step, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.steps)
            for group, scale in zip(optimizer.param_groups, scales):
                group["lr"] = lr * scale
            parts: dict = {}  # per-part losses ("total" too) and metrics, averaged over the micro-steps, on the device
            for micro in range(cfg.optim.grad_accum):
                t0 = time.perf_counter()
                batch = to_device(next(batches), device)
                waited += time.perf_counter() - t0
                # DDP all-reduces the gradients on the last micro-step only (they accumulate locally before).
                last_micro = micro == cfg.optim.grad_accum - 1
                with wrapped.no_sync() if world > 1 and not last_micro else contextlib.nullcontext():
                    with autocast:
                        loss, losses, task_metrics = job.loss(wrapped, batch, consumed.epoch, step)
                    # on every rank, finite or not: DDP stays in step
                    scaler.scale(loss / cfg.optim.grad_accum).backward()
                named = {"total": loss, **{f"loss_{k}": v for k, v in losses.items()}, **task_metrics}
                for k, v in named.items():  # a sum is not finite where a micro-step's value is not
                    v = v.detach().float() if torch.is_tensor(v) else torch.tensor(float(v), device=device)
                    parts[k] = parts.get(k, 0.0) + v / cfg.optim.grad_accum
            diverged, sums = _step_values(parts, checks, device)
            if diverged:
                _diverged(cfg, step + 1, diverged)
            del sums["total"]
            scaler.unscale_(optimizer)
            if cfg.optim.clip:  # 0: no clipping
                clip_gradients(model, cfg.optim.clip, device)
            scale = scaler.get_scale() if scaler.is_enabled() else None
            scaler.step(optimizer)
            scaler.update()
            if scale is not None and scaler.get_scale() < scale:  # fp16: inf/NaN gradients, the step was skipped
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if main and (step % cfg.run.log_every == 0 or step == cfg.optim.steps):
                elapsed = max(time.perf_counter() - started, 1e-9)
                metrics = {
                    "step": step,
                    "epoch": consumed.epoch,
                    "lr": optimizer.param_groups[0]["lr"],
                    **sums,
                    "samples_per_s": (step - first) * per_step / elapsed,
                    "data_wait_fraction": waited / elapsed,
                    "eta_s": (end - step) * elapsed / (step - first),
                    **({"skipped_steps": skipped} if cfg.run.amp == "fp16" else {}),
                    **_memory(device),
                }
                metrics_log.write(metrics)
                if on_step:
                    on_step(step, metrics, cfg.optim.steps)
            improved = False
            every = cfg.run.eval_every
            if job.validate is not None and ((every and step % every == 0) or step == end):
                scores = job.validate(model)  # on every rank, each its share: the same scores on all
                if main:
                    metrics_log.write({"step": step, **scores})
                metrics = {**metrics, **scores}
                if best_metric and best_metric.better(scores.get(best_metric.name), best and best["value"]):
                    best = {
                        "metric": best_metric.name,
                        "mode": best_metric.mode,
                        "value": scores[best_metric.name],
                        "step": step,
                    }
                    improved = True
            if main and (step % cfg.run.checkpoint_every == 0 or step == end or improved):
                checkpoint.check_finite(model, step)
                checkpoint.save(
                    out,
                    step,
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(),
                        "sampler": {**sampler.state_dict(), "epoch": consumed.epoch, "position": consumed.position},
                        "best": best,
                        "run": resolved,
                    },
                    keep_last=cfg.run.keep_last,
                    best=checkpoint.file_name(best["step"]) if best else None,
                )
    finally:
        if metrics_log:
            metrics_log.close()
    return metrics


def _part(check: str) -> str:
    """The name of a checked part among a step's values."""
    return check if check == "total" else f"loss_{check}"


def _step_values(parts: dict, checks: tuple[str, ...], device: str) -> tuple[list[str], dict]:
    """(the `checks` not finite on some rank, the step's `parts` as numbers): the finiteness
    flags all-reduced over the ranks and every value brought to the host in one copy, the
    step's one wait for the device (the optimizer must not step on a non-finite loss)."""
    names = list(parts)
    false = torch.zeros((), dtype=torch.bool, device=device)
    flags = torch.stack([~torch.isfinite(parts[_part(c)]) if _part(c) in parts else false for c in checks])
    flags = distributed.any_rank(flags.float())
    host = torch.cat([flags, torch.stack([parts[n] for n in names]).to(flags.device)]).tolist()
    return [c for c, f in zip(checks, host) if f], dict(zip(names, host[len(checks) :]))


def clip_gradients(model: torch.nn.Module, max_norm: float, device: str) -> None:
    """Scale the gradients to a global norm of at most `max_norm`, as `clip_grad_norm_` does.
    On a CPU, where reading the norm costs no wait for a device, gradients within the norm are
    left as they are rather than multiplied by 1: the same bits, one pass over the gradients
    fewer (a tenth of a base model's step on 2 cores)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not device.startswith("cpu"):  # no host wait between the norm and the scaling
        torch.nn.utils.clip_grad_norm_(params, max_norm)
        return
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if not bool(max_norm / (norm + 1e-6) >= 1.0):  # clip_grad_norm_'s coefficient below 1 (or NaN)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)


def _diverged(cfg: TrainConfig, step: int, losses: list[str]) -> None:
    latest = Path(cfg.out) / checkpoint.FOLDER / checkpoint.LATEST
    last = latest.read_text().strip() if latest.exists() else "none"
    raise DivergedError(
        f"step {step}: the loss is not finite ({', '.join(losses)}); stopped before the optimizer "
        f"step, nothing non-finite was checkpointed (last checkpoint: {last}). Start again with a "
        f"lower --lr (now {cfg.optim.lr:g}) or more --warmup (--overwrite, or --init from that "
        "checkpoint into a new --out)"
    )


def _memory(device: str) -> dict:
    """Peak resident memory of this process (MB), and peak allocated GPU memory on CUDA."""
    import resource

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.startswith("cuda"):
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out
