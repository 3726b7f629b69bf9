"""`vltrain pretrain`: the training loop.

Model dims that come from the data are taken from it: region feature width and class /
attribute counts from the first feature store, the QA head from the mixture's answer
table. The run folder gets ``config.json`` (resolved), ``metrics.jsonl`` (rank 0) and
``checkpoints/`` (atomic, ``latest`` pointer). ``resume`` continues from ``latest`` with
model, optimizer, scaler, RNG states and the sampler position restored, so N steps
straight equal N/2 + resume + N/2.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import torch

from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json
from pipeline.store import FeatureStore
from vl_models.data.dataset import DataConfig, PretrainDataset
from vl_models.data.sampler import ResumableSampler
from vl_models.eval.evaluate import evaluate
from vl_models.models.configuration import LxmertConfig, ViLBERTConfig, load_config
from vl_models.models.modeling_lxmert import LxmertForPreTraining
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
from vl_models.models.weights import init_pretraining
from vl_models.tasks.pretrain import TaskConfig, pretrain_losses
from vl_models.train import checkpoint, distributed
from vl_models.train.optim import lr_at, make_optimizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    model: str  # a config name (lxmert-base, vilbert-tiny, ...) or a JSON path
    stores: tuple[str, ...]
    mixture: str
    out: str
    vocab: str
    steps: int = 1000
    batch_size: int = 32  # per rank, per micro-step
    grad_accum: int = 1
    lr: float = 1e-4
    optimizer: str = "adamw"  # adamw | sgd
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    seed: int = 0
    workers: int = 0
    device: str = "cpu"
    amp: str = "none"  # none | bf16 | fp16 (fp16 with a GradScaler, CUDA only)
    init: Optional[str] = None  # start from a checkpoint (see `weights.init_pretraining`); ignored on resume
    compile: bool = False  # torch.compile the backbone (the heads decode at data-dependent positions)
    checkpoint_every: int = 500
    eval_every: int = 0  # steps between validation passes (0: only at the end)
    log_every: int = 10
    resume: bool = False
    stop_at: Optional[int] = None  # end this invocation at this step (the schedule still spans `steps`)
    max_text: Optional[int] = None  # default per model: ViLBERT 36, LXMERT 20
    max_regions: int = 36
    task: TaskConfig = field(default_factory=TaskConfig)

    def to_json(self) -> dict:
        out = asdict(self)
        out["stores"] = list(self.stores)
        return out


def build_model(cfg: TrainConfig, answers: int):
    mcfg = load_config(cfg.model)
    layout = FeatureStore.open(cfg.stores[0]).layout
    if isinstance(mcfg, LxmertConfig):
        mcfg = replace(mcfg, visual_feat_dim=layout.feature_dim, num_qa_labels=max(answers, 1),
                       num_object_labels=(layout.cls_dim or mcfg.num_object_labels + 1) - 1,
                       num_attr_labels=(layout.attr_dim or mcfg.num_attr_labels + 1) - 1)
        return "lxmert", mcfg, LxmertForPreTraining(mcfg)
    if isinstance(mcfg, ViLBERTConfig):
        if layout.cls_dim is None:
            raise ConfigError(f"{cfg.stores[0]}: ViLBERT pretraining needs cls_prob in the feature store")
        mcfg = replace(mcfg, v_feature_size=layout.feature_dim, v_target_size=layout.cls_dim)
        return "vilbert", mcfg, ViLBERTForPreTraining(mcfg)
    raise ConfigError(f"unsupported model config {cfg.model!r}")


def run(cfg: TrainConfig, on_step: Optional[Callable[[int, dict], None]] = None) -> dict:
    """Train; returns the last logged metrics."""
    rank, world, local = distributed.world()
    device = f"cuda:{local}" if cfg.device == "cuda" else cfg.device
    distributed.init(device)
    out = Path(cfg.out)
    answers = json.loads((Path(cfg.mixture) / "answers.json").read_text())["answers"]
    torch.manual_seed(cfg.seed)
    kind, mcfg, model = build_model(cfg, len(answers))
    cfg.task.check(kind)
    if cfg.init and not cfg.resume:
        log.info("initialized from %s: %s", cfg.init, init_pretraining(model, Path(cfg.init)))
    model.to(device)
    data = PretrainDataset(Path(cfg.mixture), [Path(s) for s in cfg.stores], Path(cfg.vocab), DataConfig(
        model=kind, max_text=cfg.max_text or (36 if kind == "vilbert" else 20), max_regions=cfg.max_regions, seed=cfg.seed))
    sampler = ResumableSampler(len(data), rank, world, cfg.seed)
    try:
        val = PretrainDataset(Path(cfg.mixture), [Path(s) for s in cfg.stores], Path(cfg.vocab),
                              replace(data.cfg, split="val", mismatch_prob=0.5))
    except ConfigError:
        val = None
        log.info("%s has no val split: no validation", cfg.mixture)
    optimizer = make_optimizer(model, cfg.optimizer, cfg.lr, cfg.weight_decay)
    scaler = torch.amp.GradScaler("cuda", enabled=cfg.amp == "fp16")
    step = 0
    state = checkpoint.load_latest(out) if cfg.resume else None
    if state is not None:
        if type(mcfg).from_json(state["model_config"]) != mcfg:
            raise ConfigError(f"{out} holds a run of model {state['model_config'].get('name')!r}, not {mcfg.name!r}: "
                              "resume with the same model, or use another --out")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        sampler.load_state_dict(state["sampler"])
        step = state["step"]
        checkpoint.set_rng_state(state["rng"])
        log.info("resumed %s at step %d", out, step)
    if world > 1 or cfg.compile:  # DDP and the compiler expect sparse-flagged embeddings' grads sparse
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                module.sparse = False
    if cfg.compile:
        (model.lxmert if kind == "lxmert" else model.bert).compile()  # in place: checkpoint keys unchanged
    # ViLBERT's q_dense1/2 exist in its checkpoints but take no part in the forward pass.
    wrapped = (torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=kind == "vilbert")
               if world > 1 else model)
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out / "config.json", {"train": cfg.to_json(), "model": mcfg.to_json(), "kind": kind,
                                                "world_size": world})
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16 if cfg.amp == "bf16" else torch.float16,
                              enabled=cfg.amp != "none")
    consumed = {"position": sampler.position}  # items used this epoch (workers may have prefetched more)
    batches = _batches(data, sampler, cfg, consumed)
    metrics: dict = {}
    started, waited = time.perf_counter(), 0.0
    model.train()
    end = min(cfg.steps, cfg.stop_at or cfg.steps)
    while step < end:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg.lr, cfg.warmup, cfg.steps)
        sums: dict = {}
        for micro in range(cfg.grad_accum):
            t0 = time.perf_counter()
            batch = {k: v.to(device) for k, v in next(batches).items()}
            waited += time.perf_counter() - t0
            with autocast:
                loss, losses, task_metrics = pretrain_losses(kind, wrapped, batch, cfg.task, sampler.epoch, step)
            scaler.scale(loss / cfg.grad_accum).backward()
            for k, v in {**{f"loss_{k}": float(v.detach()) for k, v in losses.items()}, **task_metrics}.items():
                sums[k] = sums.get(k, 0.0) + v / cfg.grad_accum
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if distributed.is_main() and (step % cfg.log_every == 0 or step == cfg.steps):
            elapsed = time.perf_counter() - started
            metrics = {"step": step, "epoch": sampler.epoch, "lr": optimizer.param_groups[0]["lr"], **sums,
                       "samples_per_s": step * cfg.batch_size * cfg.grad_accum * world / max(elapsed, 1e-9),
                       "data_wait_fraction": waited / max(elapsed, 1e-9), **_memory(device)}
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
            if on_step:
                on_step(step, metrics)
        if val is not None and distributed.is_main() and ((cfg.eval_every and step % cfg.eval_every == 0) or step == end):
            scores = evaluate(kind, model, val, device)
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, **scores}) + "\n")
            metrics = {**metrics, **scores}
        if distributed.is_main() and (step % cfg.checkpoint_every == 0 or step == end):
            checkpoint.save(out, step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                        "scaler": scaler.state_dict(),
                                        "sampler": {**sampler.state_dict(), "position": consumed["position"]},
                                        "config": cfg.to_json(), "model_config": mcfg.to_json()})
    return metrics


def _memory(device: str) -> dict:
    """Peak resident memory of this process (MB), and peak allocated GPU memory on CUDA."""
    import resource

    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.startswith("cuda"):
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def _batches(data: PretrainDataset, sampler: ResumableSampler, cfg: TrainConfig, consumed: dict):
    """Endless batches; `consumed["position"]` counts the items handed to the loop."""
    while True:
        data.set_epoch(sampler.epoch)
        # Its own generator: creating a loader must not draw from the global RNG (resume exactness).
        generator = torch.Generator().manual_seed(cfg.seed * 1000 + sampler.epoch)
        loader = torch.utils.data.DataLoader(data, batch_size=cfg.batch_size, sampler=sampler, drop_last=True,
                                             num_workers=cfg.workers, generator=generator)
        for batch in loader:
            consumed["position"] += len(batch["input_ids"])
            yield batch
        sampler.set_epoch(sampler.epoch + 1)
        consumed["position"] = 0
