"""The trainer's settings: frozen dataclasses that check themselves when built, so a bad
value is a `ConfigError` naming its flag before any model, data or file is touched.

No torch here: the `vltrain` command line (`vl_models.flags`) reads its choices (`OPTIMIZERS`,
`AMP`, ...) from this module without loading the trainer. Every field of `TrainConfig` and
`TaskConfig` is a `vltrain pretrain` flag (checked by a test); the config and the CLI's help
have these sections:

* inputs and output (`TrainConfig` itself): model, stores (``--stores``), mixture, out,
  vocab, init;
* ``optim`` (`OptimConfig`): steps / epochs, batch_size, grad_accum, lr, optimizer, warmup,
  weight_decay, clip;
* ``data`` (`DataSettings`): max_text, max_regions, region_overlap, the masking and mismatch
  rates, workers, verify_shards;
* ``task`` (`TaskConfig`): per-task weights and start steps, LXMERT's visual weighting and QA epoch;
* ``run`` (`RunSettings`): seed, device, amp, compile, resume / overwrite / stop_at,
  checkpoint_every, eval_every, log_every, keep_last, best_metric, report_to, dist_timeout.

`FinetuneConfig` has the same sections but ``task`` (``transfer``: `TransferSettings`);
`EvaluateConfig` (`vltrain evaluate`) and `PreviewConfig` (`vltrain preview-batch`) are flat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import ClassVar, Optional

from pipeline.config import Config, at_least, check_device, flag, one_of
from pipeline.errors import ConfigError

OPTIMIZERS = ("adamw", "bertadam", "adamw-uncorrected", "sgd")
AMP = ("none", "bf16", "fp16")
REGION_OVERLAP = ("keep", "zero")
PAIR_TEXTS = ("all", "captions")
PADDINGS = ("batch", "max")  # DataSettings.padding (`vl_models.data.padding`)
RESUME = ("no", "yes", "auto")  # what `run_folder.plan` does with a run already in --out
VISUAL_WEIGHTING = ("confidence", "masked")


@dataclass(frozen=True)
class TaskConfig(Config):
    weights: dict = field(default_factory=dict)  # per-loss weight, default 1
    visual_weighting: str = "confidence"  # LXMERT obj/attr: "confidence" (reference) or "masked"
    qa_from_epoch: int = 0  # LXMERT QA switched on from this epoch (the paper: second half)
    # {task: N}: the task's loss is off (weight 0) for the first N optimizer steps. It is still
    # computed, so DDP ranks stay in step; weight decay still applies to its head meanwhile.
    # (Narrow models at BERT-base's init scale needed it for alignment / matching; at the
    # width-scaled init they do not: docs/fidelity.md.)
    from_step: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        one_of("visual_weighting", self.visual_weighting, VISUAL_WEIGHTING)
        at_least(self, {"qa_from_epoch": 0})

    def check(self, family) -> None:
        """ConfigError for a task `family` does not have, or a negative weight / start step."""
        unknown = (set(self.weights) | set(self.from_step)) - set(family.tasks)
        if unknown:
            raise ConfigError(f"{family.name} has no task(s) {sorted(unknown)}; its tasks: {', '.join(family.tasks)}")
        bad = {k: v for k, v in self.weights.items() if not math.isfinite(v) or v < 0}
        bad.update({k: v for k, v in self.from_step.items() if v < 0})
        if bad:
            raise ConfigError(f"task weights must be finite and >= 0 and start steps >= 0: {bad}")

    def weights_at(self, step: Optional[int]) -> dict:
        """Loss weights at optimizer step `step` (None: every task on, as in evaluation)."""
        off = {k: 0.0 for k, start in self.from_step.items() if step is not None and step < start}
        return {**self.weights, **off}


@dataclass(frozen=True)
class OptimConfig(Config):
    """Schedule and optimizer."""

    steps: int = 1000
    epochs: Optional[float] = None  # passes over the train split: sets `steps` when the data is known
    batch_size: int = 32  # per rank, per micro-step
    grad_accum: int = 1
    lr: float = 1e-4
    optimizer: str = "adamw"  # adamw | bertadam | adamw-uncorrected | sgd
    warmup: float = 100  # steps; below 1: a fraction of `steps`
    weight_decay: float = 0.01
    clip: float = 1.0  # global gradient norm; 0: no clipping (12-in-1's fine-tuning)

    def __post_init__(self) -> None:
        at_least(self, {"steps": 1, "batch_size": 1, "grad_accum": 1, "warmup": 0})
        one_of("optimizer", self.optimizer, OPTIMIZERS)
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            raise ConfigError(f"--epochs must be finite and > 0, got {self.epochs}")
        if not math.isfinite(self.warmup) or (self.warmup >= 1 and self.warmup != int(self.warmup)):
            raise ConfigError(f"--warmup must be a whole number of steps or a fraction below 1, got {self.warmup}")
        if not (math.isfinite(self.lr) and self.lr >= 0 and math.isfinite(self.clip) and self.clip >= 0):
            raise ConfigError(f"--lr and --clip must be finite and >= 0, got {self.lr}, {self.clip}")

    @property
    def warmup_steps(self) -> int:
        """`warmup` in steps (a fraction below 1 is of `steps`; it stays a fraction in the
        saved config, so a resume that grows the run keeps it)."""
        return round(self.warmup * self.steps) if 0 < self.warmup < 1 else int(self.warmup)


@dataclass(frozen=True)
class DataSettings(Config):
    """What the examples look like (`PretrainDataset`) and how they are loaded."""

    max_text: Optional[int] = None  # text tokens per item; None: the model family's default
    max_regions: int = 36  # region slots per image (ViLBERT adds its IMG token on top)
    # ViLBERT: "keep" leaves the regions overlapping a selected one (IoU > 0.4) as they are;
    # "zero" (12-in-1's variant, `image_feat[masked_label] = 0`) zeroes them and every selected
    # region (no 10 % left unaltered). The loss is on the selected regions either way.
    region_overlap: str = "keep"
    mlm_prob: float = 0.15  # words selected for masked LM (both papers)
    region_prob: float = 0.15  # regions selected for masked-region modelling (both papers)
    mismatch_prob: float = 0.5  # texts swapped for another image's (the pair task's negatives)
    # The pair task's texts: "all" items (both references: a question is a matching sentence
    # too) or "captions" only (a question item keeps its text and has no pair label; swapped-in
    # texts are captions).
    pair_texts: str = "all"
    # "batch": each batch padded to its own longest text and region count (`vl_models.data.padding`);
    # "max": to max_text / max_regions (fixed shapes).
    padding: str = "batch"
    # Batches of similar text length (`vl_models.data.sampler`, transformers' --group_by_length).
    group_by_length: bool = False
    # DataLoader worker processes per rank (None: the device's default, `vl_models.data.loader`)
    # and the batches each reads ahead
    workers: Optional[int] = None
    prefetch: int = 2
    verify_shards: bool = False  # check each store shard's sha256 on first use

    def __post_init__(self) -> None:
        at_least(self, {"max_regions": 1, "prefetch": 1, **({"workers": 0} if self.workers is not None else {})})
        if self.max_text is not None:
            at_least(self, {"max_text": 3})  # [CLS], one word, [SEP]
        one_of("region_overlap", self.region_overlap, REGION_OVERLAP)
        one_of("pair_texts", self.pair_texts, PAIR_TEXTS)
        one_of("padding", self.padding, PADDINGS)
        for name in ("mlm_prob", "region_prob", "mismatch_prob"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ConfigError(f"{flag(name)} must be between 0 and 1, got {value}")


@dataclass(frozen=True)
class RunSettings(Config):
    """Devices, checkpoints, logging, and how this invocation relates to an earlier run."""

    seed: int = 0
    # auto | cpu | cuda | cuda:N (`pipeline.config.check_device`; what each means: `trainer.resolve_device`)
    device: str = "cpu"
    amp: str = "none"  # none | bf16 | fp16 (fp16 with a GradScaler, CUDA only)
    compile: bool = False  # torch.compile the backbone (the heads decode at data-dependent positions)
    # An earlier run in `out`: "no" refuses it (see `overwrite`); "yes" continues it (a new run
    # if there is none; the settings `run_folder.RESUME_SAFE` names may change, noted);
    # "auto" continues it only with every setting the same, starts a new run if there is none,
    # and refuses anything else (job scripts, preempted jobs, torchrun's elastic restarts).
    resume: str = "no"
    overwrite: bool = False  # replace a run in `out` (removes only the trainer's files there)
    stop_at: Optional[int] = None  # end this invocation at this step (the schedule still spans `steps`)
    checkpoint_every: int = 500
    eval_every: int = 0  # steps between validation passes (0: only at the end)
    log_every: int = 10
    keep_last: int = 3  # checkpoints kept (0: all), besides the best one
    best_metric: Optional[str] = None  # a validation score, e.g. eval_qa_score or eval_region_kl:min
    report_to: tuple[str, ...] = ()  # "tensorboard"
    dist_timeout: Optional[float] = None  # seconds a collective waits for the other ranks (None: torch's default)

    def __post_init__(self) -> None:
        object.__setattr__(self, "report_to", tuple(self.report_to))
        if isinstance(self.resume, bool):  # the Python API's earlier bool: True continues a run
            object.__setattr__(self, "resume", "yes" if self.resume else "no")
        one_of("resume", self.resume, RESUME)
        if self.dist_timeout is not None and not (math.isfinite(self.dist_timeout) and self.dist_timeout > 0):
            raise ConfigError(f"--dist-timeout must be finite and > 0 seconds, got {self.dist_timeout}")
        at_least(self, {"log_every": 1, "checkpoint_every": 1, "eval_every": 0, "keep_last": 0})
        one_of("amp", self.amp, AMP)
        check_device("device", self.device)
        if self.amp == "fp16" and self.device == "cpu":  # auto: checked once the device is known
            raise ConfigError("--amp fp16 needs --device cuda (use bf16 on CPU)")


TASK_SAMPLING = ("round-robin", "proportional", "cycle")  # `vl_models.data.sampler.TaskBatchSampler`'s orders
PAIR_LOSSES = ("ce", "bce")  # NLVR2: LXMERT's cross-entropy, 12-in-1's BCE on one-hot targets
# Retrieval's fine-tuned scorer: "new" (12-in-1's vil_logit, a new Linear(H, 1) on the pooled pair vector) or
# "pretraining" (the pretraining pair head: alignment / matching), `heads.build_transfer_model`.
RETRIEVAL_HEADS = ("new", "pretraining")


@dataclass(frozen=True)
class TransferSettings(Config):
    """Fine-tuning specifics (`vltrain finetune`)."""

    task_sampling: str = "round-robin"  # several tasks: batches round-robin, or in proportion to their sizes
    train_split: Optional[str] = None  # split spec to train on (comma: union, hyphen: difference); None: the task's
    val_split: Optional[str] = None  # the split validated every epoch; None: the task's (if the data has it)
    eval_items: int = 0  # rows scored per validation (0: the whole split)
    init_answers: Optional[str] = None  # the --init checkpoint's QA answer table (for a checkpoint not of ours)
    # start answer heads from the --init model's answer rows, by answer string: its pretraining QA head's (LXMERT's),
    # or with --init-answers a published checkpoint's answer head of another table; False: new answer heads
    copy_answers: bool = True
    hard_negatives: Optional[str] = None  # retrieval: 12-in-1's hard_negative.pkl (the 4th training candidate's pool)
    head_lr: Optional[float] = None  # the heads 12-in-1 names vil_* at this peak lr (its 1e-4); None: --lr
    nlvr2_loss: Optional[str] = None  # "ce" | "bce"; None: the model family's own reference's
    # ViLBERT: a task-token table (12-in-1's --task_specific_tokens: 20 rows, new ones N(0, initializer_range)) where
    # the --init model has none; an --init that has one keeps it either way. LXMERT has none: ConfigError.
    task_tokens: bool = False
    retrieval_head: Optional[str] = None  # RETRIEVAL_HEADS; None: the model family's own (`ModelFamily.retrieval_head`)
    # Per task (task name -> value), 12-in-1's vilbert_tasks.yml entries; a task not named takes the run's value.
    task_lr: dict = field(default_factory=dict)  # the task's loss x its lr / --lr (12-in-1's loss_scale)
    task_batch: dict = field(default_factory=dict)  # examples per batch of that task
    task_max_text: dict = field(default_factory=dict)  # text tokens per candidate
    task_train_split: dict = field(default_factory=dict)  # split spec trained on
    task_val_split: dict = field(default_factory=dict)  # split validated

    def __post_init__(self) -> None:
        one_of("task_sampling", self.task_sampling, TASK_SAMPLING)
        at_least(self, {"eval_items": 0})
        if self.nlvr2_loss is not None:
            one_of("nlvr2_loss", self.nlvr2_loss, PAIR_LOSSES)
        if self.retrieval_head is not None:
            one_of("retrieval_head", self.retrieval_head, RETRIEVAL_HEADS)
        if self.head_lr is not None and not (math.isfinite(self.head_lr) and self.head_lr >= 0):
            raise ConfigError(f"--head-lr must be finite and >= 0, got {self.head_lr}")
        if not all(math.isfinite(v) and v >= 0 for v in self.task_lr.values()):
            raise ConfigError(f"--task-lr: learning rates must be finite and >= 0, got {self.task_lr}")
        for name, minimum in (("task_batch", 1), ("task_max_text", 3)):  # max_text: [CLS], a word, [SEP]
            if not all(isinstance(v, int) and v >= minimum for v in getattr(self, name).values()):
                raise ConfigError(f"--{name.replace('_', '-')}: whole numbers >= {minimum}, got {getattr(self, name)}")

    PER_TASK: ClassVar[tuple[str, ...]] = (
        "task_lr",
        "task_batch",
        "task_max_text",
        "task_train_split",
        "task_val_split",
    )

    def of_task(self, name: str, task: str, default):
        """Per-task setting `name` (e.g. "task_batch") of `task`, else `default`."""
        return getattr(self, name).get(task, default)


SECTIONS = {"optim": OptimConfig, "data": DataSettings, "task": TaskConfig, "run": RunSettings}
FINETUNE_SECTIONS = {"optim": OptimConfig, "data": DataSettings, "transfer": TransferSettings, "run": RunSettings}


class _Sectioned:
    """Settings named flat (`of`, `with_`), each put into its section (`sections`)."""

    sections: dict = {}

    @classmethod
    def of(cls, **settings):
        """A config from flat settings (``steps=4, lr=1e-3, resume="yes", ...``), each put
        into its section; ConfigError naming an unknown one."""
        own, sections = _sort(cls, settings)
        defaults = {f.name: f.default_factory() for f in fields(cls) if f.name in cls.sections}
        return cls(**own, **{name: replace(defaults[name], **values) for name, values in sections.items()})

    def with_(self, **settings):
        """This config with some settings changed, named flat as in `of`."""
        own, sections = _sort(type(self), settings)
        changed = {name: replace(getattr(self, name), **values) for name, values in sections.items()}
        return replace(self, **own, **changed)

    def scheduled(self, train_items: int, world: int):
        """This config with `steps` from `epochs` (whole optimizer steps over `train_items`
        on `world` ranks); unchanged without `epochs`."""
        optim = self.optim
        if optim.epochs is None:
            return self
        per_step = optim.batch_size * optim.grad_accum * world
        return self.with_(steps=max(1, math.ceil(optim.epochs * (train_items // per_step))))


@dataclass(frozen=True)
class TrainConfig(_Sectioned, Config):
    """A pretraining run: its inputs and output, and one section per concern (`SECTIONS`).
    Field names are unique across sections, so a setting is named by its field alone:
    `TrainConfig.of` and `with_` take them flat (as the command line does), and every
    section field is a flag of the same name."""

    sections = SECTIONS
    model: str  # a config name (lxmert-base, vilbert-tiny, ...) or a JSON path
    stores: tuple[str, ...]
    mixture: str
    out: str
    vocab: str  # a vocab.txt, a BERT WordPiece tokenizer.json, or a folder with either
    init: Optional[str] = None  # start from a checkpoint (`weights.init_pretraining`); not on resume
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataSettings = field(default_factory=DataSettings)
    task: TaskConfig = field(default_factory=TaskConfig)
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stores", tuple(str(s) for s in self.stores))


@dataclass(frozen=True)
class FinetuneConfig(_Sectioned, Config):
    """A fine-tuning run (`vltrain finetune`): tasks with their task datasets (aligned), the
    feature stores, where the model comes from, and the sections of `FINETUNE_SECTIONS`."""

    sections = FINETUNE_SECTIONS
    tasks: tuple[str, ...]
    task_data: tuple[str, ...]  # one task dataset folder per task (`vlprep build-task`)
    stores: tuple[str, ...]
    out: str
    given_stores: tuple[str, ...] = ()  # ground-truth boxes' features (RefCOCO training, VCR), beside the detections
    init: Optional[str] = None  # a pretraining run folder or checkpoint, HF LXMERT, vilbert-multi-task; None: scratch
    model: Optional[str] = None  # a model config; None: the --init run's
    vocab: Optional[str] = None  # None: the --init run's
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5, warmup=0.1, epochs=4))
    data: DataSettings = field(default_factory=DataSettings)
    transfer: TransferSettings = field(default_factory=TransferSettings)
    run: RunSettings = field(default_factory=RunSettings)

    def __post_init__(self) -> None:
        for name in ("tasks", "task_data", "stores", "given_stores"):
            object.__setattr__(self, name, tuple(str(v) for v in getattr(self, name)))
        if not self.tasks:
            raise ConfigError("--task: name at least one task")
        if len(self.task_data) != len(self.tasks):
            raise ConfigError(
                f"--data: one task dataset per --task ({len(self.tasks)} tasks, {len(self.task_data)} --data)"
            )
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"--task: a task is named twice ({', '.join(self.tasks)})")
        if not self.stores:
            raise ConfigError("--stores: name the feature store(s) of the tasks' images")
        for name in self.transfer.PER_TASK:
            unknown = sorted(set(getattr(self.transfer, name)) - set(self.tasks))
            if unknown:
                raise ConfigError(
                    f"--{name.replace('_', '-')}: {', '.join(unknown)} is no --task of this run "
                    f"({', '.join(self.tasks)})"
                )


NLVR2_PACKINGS = ("per-image", "mt")  # NLVR2's two images in rows of region slots (`vl_models.transfer.dataset`)


@dataclass(frozen=True)
class EvaluateConfig(Config):
    """A checkpoint scored on a task split (`vltrain evaluate`,
    `vl_models.transfer.evaluate.evaluate_checkpoint`). The stores, given stores, vocab and
    data settings left out are the run's (a published checkpoint's: its code's)."""

    task: str
    checkpoint: str  # a run folder (its latest checkpoint, or `step`'s) or a checkpoint
    data: Path  # the task dataset
    split: str
    stores: tuple[Path, ...] = ()  # (): the run's
    given_stores: Optional[tuple[Path, ...]] = None  # ground-truth boxes' stores; None: the run's, (): none
    vocab: Optional[Path] = None
    out: Optional[Path] = None  # None: RUN/eval/TASK-SPLIT
    zero_shot: bool = False  # retrieval with the pretraining pair head
    model: Optional[str] = None  # a model config, for a checkpoint that holds none
    step: Optional[str] = None  # in a run folder: the checkpoint of this step, or best
    device: str = "cpu"  # auto | cpu | cuda | cuda:N
    batch_size: int = 64
    limit: int = 0  # score the first N rows (retrieval: images) only; 0: all
    max_regions: Optional[int] = None  # region slots per image, the IMG token not counted
    max_text: Optional[int] = None  # text tokens per example
    nlvr2_packing: Optional[str] = None  # NLVR2_PACKINGS; None: per-image

    def __post_init__(self) -> None:
        for name in ("data", "vocab", "out"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        object.__setattr__(self, "stores", tuple(Path(s) for s in self.stores))
        if self.given_stores is not None:
            object.__setattr__(self, "given_stores", tuple(Path(s) for s in self.given_stores))
        check_device("device", self.device)
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size}: give 1 or more")
        if self.limit < 0:
            raise ConfigError(f"--limit {self.limit}: the rows (retrieval: images) to score, 1 or more (0: all)")
        if self.max_regions is not None and self.max_regions < 1:
            raise ConfigError(f"--max-regions {self.max_regions}: region slots per image, 1 or more")
        if self.max_text is not None and self.max_text < 3:
            raise ConfigError(f"--max-text {self.max_text}: text tokens, 3 or more ([CLS], a word, [SEP])")
        if self.nlvr2_packing not in (None, *NLVR2_PACKINGS):
            raise ConfigError(f"--nlvr2-packing {self.nlvr2_packing}: one of {', '.join(NLVR2_PACKINGS)}")


POSITIONS = ("5d", "4d")  # box encodings: ViLBERT's, LXMERT's (`pipeline.records.box_positions`)


@dataclass(frozen=True)
class PreviewConfig(Config):
    """`vltrain preview-batch`: the first images of a feature store as the padded batch a model receives."""

    store: Path
    batch_size: int = 4  # images in the batch
    max_regions: int = 36  # region slots per image (the IMG token not counted)
    position: str = "5d"  # POSITIONS
    img_token: bool = False  # prepend ViLBERT's IMG token

    def __post_init__(self) -> None:
        object.__setattr__(self, "store", Path(self.store))
        at_least(self, {"batch_size": 1, "max_regions": 1})
        one_of("position", self.position, POSITIONS)


def flat_settings(saved: dict) -> dict:
    """A saved training config (`TrainConfig.to_json`, as in a run's config.json) with its
    sections opened: every setting by its field name, as `TrainConfig.of` takes them.
    Configs saved before the sections come back the same way (their ``task`` was a
    section already)."""
    out = {}
    for key, value in saved.items():
        if key in (SECTIONS.keys() | FINETUNE_SECTIONS.keys()) and isinstance(value, dict):
            out.update(value)
        else:
            out[key] = value
    return out


def section_fields(config: type = None) -> dict[str, str]:
    """Every section field's name -> its section (of `config`, default TrainConfig)."""
    return {f.name: name for name, cls in (config or TrainConfig).sections.items() for f in fields(cls)}


def _sort(config: type, settings: dict) -> tuple[dict, dict]:
    where = section_fields(config)
    own_names = {f.name for f in fields(config)} - set(config.sections)
    own, sections = {}, {}
    for key, value in settings.items():
        if key in own_names:
            own[key] = value
        elif key in where:
            sections.setdefault(where[key], {})[key] = value
        else:
            raise ConfigError(f"unknown training setting {key!r}")
    return own, sections
