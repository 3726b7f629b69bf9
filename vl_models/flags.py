"""`vltrain`'s options: which config field each sets (the flag tables `config_command`
turns into a command's options: pretraining's and fine-tuning's sections, `evaluate`'s and
`preview-batch`'s), recipes as the defaults of the options not given (`pretrain_values`,
`finetune_values`), and the former spellings of renamed flags (`RENAMED`, `command_args`).

No torch here: the command line's help and checks read this module and `vl_models.config`
only."""

from __future__ import annotations

from inspect import Parameter
from pathlib import Path
from typing import Callable, Collection, Optional

import typer

from pipeline.cli_flags import Flag, Flags, or_none
from pipeline.config import flag, is_device
from pipeline.errors import ConfigError
from vl_models.config import (
    AMP,
    NLVR2_PACKINGS,
    OPTIMIZERS,
    PADDINGS,
    PAIR_TEXTS,
    POSITIONS,
    REGION_OVERLAP,
    RESUME,
    TASK_SAMPLING,
    VISUAL_WEIGHTING,
    DataSettings,
    EvaluateConfig,
    FinetuneConfig,
    OptimConfig,
    PreviewConfig,
    RunSettings,
    TaskConfig,
    TrainConfig,
    TransferSettings,
)

# What a recipe may set: the options that shape the run, not where its inputs and outputs are.
_NOT_IN_RECIPES = {
    "recipe",
    "stores",
    "mixture",
    "out",
    "vocab",
    "init",
    "resume",
    "overwrite",
    "stop_at",
    "dist_timeout",
}
RESUME_HELP = (
    "An earlier run in OUT: no (refused; see --overwrite); yes (also a bare --resume): continue it bit-exactly from "
    "checkpoints/latest (a new run if OUT holds none), settings that change what the run computes must "
    "stay the same (refused, named), --steps, --epochs and how it checkpoints, evaluates and logs may "
    "change (noted in metrics.jsonl); auto: continue it only when every setting is the same, start a new "
    "run when OUT holds none (or a run of the same settings without a checkpoint), refuse anything else: "
    "for job scripts, resubmitted preempted jobs and torchrun restarts (--max-restarts)."
)
DIST_TIMEOUT_HELP = (
    "Under torchrun: seconds a collective waits for the other ranks before the run fails (0: "
    "torch's default, 30 min on gloo, 10 min on NCCL)."
)
_RUN = "Run: devices, checkpoints, logging"


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was set by the user (command line or environment), not by default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _option_name(param) -> str:
    """An option's name as a recipe writes it: the flag with underscores (--task-from: task_from)."""
    return param.opts[0].lstrip("-").replace("-", "_")


def _with_recipe(ctx: typer.Context, values: dict, folder: Optional[Path] = None) -> dict:
    """The command's option values, with the values of ``values["recipe"]`` (a recipe of
    `folder`, default the pretraining ones, or a YAML path) in place of the defaults of the
    options not given. A recipe names options as the command line does (underscores); each
    value goes through its option's own type check, and a ``{TASK: N}`` mapping is read as
    repeated ``TASK=N`` (--loss-weight, --task-from, --task-lr, ...). A former spelling of an option
    (`RENAMED`) is read as the option, with a line on stderr. A value of the wrong YAML
    type is refused first: a flag takes only true/false, another option a number or a text
    (never a boolean, null or a collection), a repeated option also a list or a mapping of
    those."""
    from vl_models.train.recipes import RECIPE_DIR, load_recipe

    values = dict(values)
    if not values.get("recipe"):
        return values
    path, obj = load_recipe(values["recipe"], folder or RECIPE_DIR)
    options = {_option_name(p): p for p in ctx.command.params if p.param_type_name == "option" and p.name != "help"}
    obj = _current_keys(path, obj, options)
    settable = set(options) - _NOT_IN_RECIPES
    unknown = sorted(set(obj) - settable)
    if unknown:
        raise ConfigError(
            f"{path}: unknown or not settable by a recipe: {', '.join(unknown)} "
            f"(settable: {', '.join(sorted(settable))})"
        )
    scalars = (str, int, float)

    def refuse(name: str, value: object, wanted: str) -> ConfigError:
        return ConfigError(f"{path}: {name}: {wanted}, got {type(value).__name__} {value!r:.80}")

    for name, value in obj.items():
        param = options[name]
        if _given(ctx, param.name):
            continue
        # YAML types first: click would read `steps: true` as 1 and a nested list as its text
        if param.is_flag:
            if not isinstance(value, bool):
                raise refuse(name, value, "expected true or false")
        elif param.multiple:
            items = list(value.items()) if isinstance(value, dict) else value if isinstance(value, list) else [value]
            for item in items:
                parts = item if isinstance(value, dict) else (item,)
                if any(isinstance(v, bool) or not isinstance(v, scalars) for v in parts):
                    raise refuse(name, value, "expected a value, a list of values or a {TASK: value} mapping")
        elif isinstance(value, bool) or not isinstance(value, scalars):
            raise refuse(name, value, "expected a number or a text")
        if isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        if param.multiple and not isinstance(value, list):
            value = [value]
        try:
            values[param.name] = param.process_value(ctx, value)
        except typer.BadParameter as err:
            raise ConfigError(f"{path}: {name}: {err.message}") from err
    return values


def _pairs(flag: str, convert) -> Callable[[list[str]], dict]:
    """A parser of repeated TASK=VALUE flags: ["alignment=1000", ...] -> {"alignment": 1000, ...};
    a malformed item is a usage error."""

    def parse(items: list[str]) -> dict:
        out = {}
        for item in items:
            key, sep, value = item.partition("=")
            try:
                if not sep or not key.strip() or key.strip() in out:
                    raise ValueError
                out[key.strip()] = convert(value)
            except ValueError:
                raise typer.BadParameter(
                    f"{item!r}: expected TASK={convert.__name__.upper()}, each task once", param_hint=flag
                ) from None
        return out

    return parse


def _per_task(help: str, name: str, convert) -> Flag:
    """A repeatable TASK=VALUE flag `name`: its items become {task: convert(value)} (`_pairs`)."""
    return Flag(help, name=name, parse=_pairs(name, convert), many=True)


def _count_or_auto(text: str) -> Optional[int]:
    """A count, or "auto" (None: the default's own rule)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"a count or auto, not {text!r}") from None


def _zero_is_none(convert) -> dict:
    """Keyword arguments of a Flag whose 0 means "none" (the field's None)."""
    return {"parse": lambda text: convert(text) or None, "show": lambda v: str(v or 0)}


def parse_device(text: str) -> str:
    """A --device's text, checked as a choice is (auto, cpu, cuda or cuda:N)."""
    if not is_device(text):
        raise typer.BadParameter(f"{text!r} is not one of 'auto', 'cpu', 'cuda', 'cuda:N'", param_hint="'--device'")
    return text


DEVICE_FLAG = Flag(
    "auto (cuda when this process sees a CUDA device, else cpu), cpu, cuda or cuda:N (GPU N); under torchrun, "
    "cuda is one GPU per rank (the local rank's).",
    parse=parse_device,
)

# The flags of the sections pretraining and fine-tuning share; `finetune` overrides a few texts.
OPTIM_FLAGS = {
    "steps": "Optimizer steps.",
    "epochs": Flag(
        "Passes over the train split; sets --steps from the split's size, the batch size and the rank count "
        "(0: use --steps).",
        **_zero_is_none(float),
    ),
    "batch_size": "Examples per rank per micro-step.",
    "grad_accum": "Micro-steps per optimizer step.",
    "lr": "Peak learning rate (linear warmup, then linear decay).",
    "optimizer": Flag(
        "adamw (default, fused; no decay on bias/LayerNorm), bertadam (LXMERT's: no bias correction, decay on all "
        "parameters), adamw-uncorrected (12-in-1's AdamW(correct_bias=False): no bias correction, no decay on "
        "bias/LayerNorm) or sgd (momentum 0.9).",
        choices=OPTIMIZERS,
    ),
    "warmup": "Warmup: steps, or a fraction of all steps when below 1 (e.g. 0.1).",
    "weight_decay": "AdamW weight decay (none on biases and LayerNorms).",
    "clip": "Gradient clipping (global norm; 0: none).",
}
DATA_FLAGS = {
    "max_text": Flag("Text tokens per item (0: the model's default, ViLBERT 36, LXMERT 20).", **_zero_is_none(int)),
    "max_regions": "Regions per image (ViLBERT adds its IMG token).",
    "padding": Flag(
        "batch: each batch padded to its own longest text and largest region count (the same outputs, less "
        "arithmetic); max: every batch padded to the text length and region slots above (fixed shapes).",
        choices=PADDINGS,
    ),
    "group_by_length": "Batches of items of similar text length (less padding; the order stays seeded and "
    "resumable, the same on every rank).",
    "workers": Flag(
        "DataLoader worker processes per rank, building the next batches while the model steps (auto: on CUDA "
        "the rank's CPUs less one, at most 8; on a CPU none below 8 cores, the model's threads need them). "
        "The batches are the same with any number.",
        parse=_count_or_auto,
        show=lambda v: "auto" if v is None else str(v),
        default="auto",
    ),
    "prefetch": "Batches each worker reads ahead.",
    "verify_shards": "Check each feature-store shard's sha256 on first use (also: VLPREP_VERIFY_SHARDS=1).",
}
RUN_FLAGS = {
    "seed": "Seed of initialization, sampling and masking.",
    "device": DEVICE_FLAG,
    "amp": Flag("Mixed precision: none, bf16, or fp16 (CUDA, with a GradScaler).", choices=AMP),
    "compile": "torch.compile the backbone (slow first steps; faster after).",
    "resume": Flag(RESUME_HELP, choices=RESUME),
    "overwrite": "Start again in an OUT that holds a run: removes only the trainer's files there (config.json, "
    "metrics.jsonl, checkpoints/, tensorboard/, curves.png).",
    "stop_at": Flag("End this invocation at this step (0: run to --steps); resume later.", **_zero_is_none(int)),
    "checkpoint_every": "Steps between checkpoints.",
    "eval_every": "Steps between validation passes on the mixture's val split (0: at the end).",
    "log_every": "Steps between metrics rows (and progress lines when stderr is not a terminal).",
    "keep_last": "Checkpoints kept (0: all), besides the best one (--best-metric).",
    "best_metric": Flag(
        "Keep the best checkpoint by this validation score (checkpoints/best), e.g. eval_qa_score, "
        "eval_retrieval_R@1, eval_region_kl; NAME:max or NAME:min to set the direction.",
        parse=or_none,
    ),
    "report_to": "Also report to: tensorboard (events in OUT/tensorboard; pip install tensorboard).",
    "dist_timeout": Flag(DIST_TIMEOUT_HELP, **_zero_is_none(float)),
}

PRETRAIN_FLAGS = (
    Flags(
        TrainConfig,
        "Inputs and output",
        {
            "model": Flag(
                "Model config (required unless --recipe gives one): lxmert-base, lxmert-small, lxmert-tiny, "
                "vilbert-base[-2|4|8coattn], vilbert-small, vilbert-tiny, or a JSON path (small: 64 wide, the "
                "demo's; tiny: 32 wide, for tests).",
                default=None,
            ),
            "stores": "Feature store(s) with the images' region features (repeatable).",
            "mixture": "Mixture folder from `vlprep build-mixture`.",
            "out": "Run folder: config.json, metrics.jsonl, checkpoints/.",
            "vocab": "BERT WordPiece vocab: a vocab.txt (uncased), a tokenizer.json, or a model folder with either.",
            "init": Flag(
                "Start from a checkpoint (file or folder): LXMERT (HF or original .pth), vilbert-multi-task, or a "
                "BERT (BertForPreTraining such as bert-base-uncased/, or a BertModel; pytorch_model.bin or "
                "model.safetensors) for the text side and LM head of either model.",
                parse=or_none,
            ),
        },
    ),
    Flags(OptimConfig, "Schedule and optimizer", OPTIM_FLAGS, section="optim"),
    Flags(
        DataSettings,
        "Data",
        {
            **DATA_FLAGS,
            "region_overlap": Flag(
                "ViLBERT region masking: keep (the paper: only the 15 % selected regions are masked) or zero "
                "(12-in-1: every selected region and every region overlapping one by IoU > 0.4 are zeroed, none "
                "left unaltered). The loss is on the selected regions either way.",
                choices=REGION_OVERLAP,
            ),
            "mlm_prob": "Share of words selected for masked LM (both papers: 0.15).",
            "region_prob": "Share of regions selected for masked-region modelling (both papers: 0.15).",
            "mismatch_prob": "Share of items whose text is swapped for another image's: the negatives of the "
            "alignment / matching task (both papers: 0.5).",
            "pair_texts": Flag(
                "The alignment / matching task's texts: all (both references: a question is a matching sentence "
                "too) or captions (a question keeps its text and has no pair label; swapped-in texts are "
                "captions).",
                choices=PAIR_TEXTS,
            ),
        },
        section="data",
    ),
    Flags(
        TaskConfig,
        "Tasks",
        {
            "weights": _per_task(
                "TASK=W: a task's loss weight (default 1; repeatable). Tasks: ViLBERT mlm, region, alignment; "
                "LXMERT mlm, matching, obj, attr, feat, qa.",
                "--loss-weight",
                float,
            ),
            "from_step": _per_task(
                "TASK=N: a task's loss is off for the first N optimizer steps (repeatable), e.g. alignment=1000 "
                "to let the streams learn before the pair head trains.",
                "--task-from",
                int,
            ),
            "visual_weighting": Flag(
                "LXMERT obj/attr losses: confidence (reference) or masked.", choices=VISUAL_WEIGHTING
            ),
            "qa_from_epoch": "LXMERT: train image QA from this epoch on.",
        },
        section="task",
    ),
    Flags(RunSettings, _RUN, RUN_FLAGS, section="run"),
)


def _recipe_option(text: str) -> Parameter:
    """A command's --recipe option (`text`: which recipes it takes)."""
    return Parameter(
        "recipe",
        Parameter.KEYWORD_ONLY,
        annotation=Optional[str],
        default=typer.Option(None, help=text, rich_help_panel="Inputs and output"),
    )


RECIPE_OPTION = _recipe_option(
    "A published recipe: lxmert-paper or vilbert-paper (every number cited in the file, see "
    "vl_models/recipes/), or a YAML file of the same keys (option names with underscores). Its values "
    "replace the defaults of the options not given on the command line."
)


def _steps_or_epochs(ctx: typer.Context, values: dict) -> dict:
    """--steps given: it wins over the epochs of a recipe or a default; not both given
    (``--epochs 0`` says: use --steps)."""
    if _given(ctx, "steps") and _given(ctx, "epochs") and float(values["epochs"] or 0):
        raise ConfigError("give --steps or --epochs, not both")
    if _given(ctx, "steps"):
        values["epochs"] = "0"
    values.pop("recipe")
    return values


def pretrain_values(ctx: typer.Context, values: dict) -> dict:
    """The recipe's values under the options given; --model required; --steps or --epochs."""
    values = _with_recipe(ctx, values)
    if not values["model"]:
        raise ConfigError("--model is required (or a --recipe that names one)")
    return _steps_or_epochs(ctx, values)


_FT = FinetuneConfig(tasks=("vqa",), task_data=(".",), stores=(".",), out=".")  # the sections' defaults
FINETUNE_FLAGS = (
    Flags(
        FinetuneConfig,
        "Inputs and output",
        {
            "tasks": Flag(
                "Task(s) to fine-tune, repeatable (one backbone, a head each): vqa, gqa, nlvr2, flickr30k, "
                "coco-retrieval, refcoco+, refcoco, refcocog, vcr (Q->A and QA->R, scored Q->AR), vcr-q2a, vcr-qa2r "
                "(required unless --recipe names them).",
                name="--task",
                default=(),  # checked once the recipe is read: a recipe names its tasks
            ),
            "task_data": Flag(
                "The task dataset of each --task, in the same order (`vlprep build-task`).", name="--data"
            ),
            "stores": "Feature store(s) with the tasks' images (repeatable).",
            "given_stores": "Feature store(s) of ground-truth boxes (`vlprep extract --given-boxes`), beside the "
            "detections of --stores, merged as 12-in-1 does: RefCOCO trains on detections + ground truth and is "
            "scored on detections alone; VCR keeps every ground-truth box (repeatable).",
            "out": "Run folder: config.json, metrics.jsonl, checkpoints/ (best: by the first task's metric).",
            "init": Flag(
                "Start from: a pretraining run folder or checkpoint of ours (model config and vocab come with "
                "it), a fine-tuning run (its backbone), an HF LXMERT or vilbert-multi-task checkpoint (with "
                "--model), or a BERT; none: from scratch (with --model).",
                parse=or_none,
            ),
            "model": Flag(
                "Model config (when --init is no run of ours): lxmert-base, vilbert-base, ..., or a JSON path.",
                parse=or_none,
            ),
            "vocab": Flag("BERT WordPiece vocab (default: the --init run's).", parse=or_none),
        },
    ),
    Flags(
        OptimConfig,
        "Schedule and optimizer",
        {
            **OPTIM_FLAGS,
            "epochs": Flag(
                "Passes over the tasks' training examples; sets --steps (0: use --steps).", **_zero_is_none(float)
            ),
            "batch_size": "Examples per rank per micro-step (all of one task).",
        },
        section="optim",
        defaults=_FT.optim,
    ),
    Flags(
        DataSettings,
        "Data",
        {
            **DATA_FLAGS,
            "max_text": Flag("Text tokens per candidate (0: the task's, else the model's).", **_zero_is_none(int)),
        },
        section="data",
    ),
    Flags(
        TransferSettings,
        "Tasks",
        {
            "task_sampling": Flag(
                "Several tasks: one-task batches round-robin (a task out of batches drops out), in proportion to the "
                "tasks' sizes, or cycle (12-in-1's: a batch of every task each round, as many rounds as the longest "
                "task has, short tasks restarted).",
                choices=TASK_SAMPLING,
            ),
            "train_split": Flag(
                "Split(s) to train on: a comma joins splits, a hyphen subtracts one (default: the task's, e.g. "
                "train; VQA as ViLBERT: train-test_images,val-minval-test_images; as LXMERT, built with --minival: "
                "train,nominival).",
                parse=or_none,
            ),
            "val_split": Flag("Split validated each epoch (default: the task's: val; NLVR2 dev).", parse=or_none),
            "eval_items": "Rows scored per validation (0: the whole split).",
            "init_answers": Flag(
                "The --init checkpoint's QA answer table (LXMERT's all_ans.json), when it is no run "
                "of ours: answer heads start from its rows.",
                parse=or_none,
            ),
            "copy_answers": "Start answer heads from the --init model's answer rows, row by answer string: its "
            "pretraining QA head's (LXMERT's), or with --init-answers a published answer head of another table "
            "(--no-copy-answers: new answer heads).",
            "hard_negatives": Flag(
                "Retrieval: 12-in-1's hard_negative.pkl (train_image_list, train_hard_pool; read with the restricted "
                "unpickler): each training example's 4th candidate is a caption of an image from its pool row, not "
                "a random one.",
                parse=or_none,
            ),
            "head_lr": Flag(
                "Peak learning rate of the heads 12-in-1 names vil_* (answers, NLVR2 pair, VCR choice, retrieval's "
                "new scorer; not RefCOCO's region scorer), on the same schedule (12-in-1: 1e-4; 0: --lr).",
                **_zero_is_none(float),
            ),
            "nlvr2_loss": Flag(
                "NLVR2's loss: ce (LXMERT's cross-entropy) or bce (12-in-1's BCE on one-hot targets); default: the "
                "model family's own reference's (LXMERT ce, ViLBERT bce).",
                parse=or_none,
            ),
            "task_tokens": "ViLBERT: a task-token table (12-in-1's --task_specific_tokens: 20 rows, a task's token "
            "after [CLS]), new where the --init model has none (an --init with one keeps it either way).",
            "retrieval_head": Flag(
                "Retrieval's fine-tuned scorer: new (12-in-1's vil_logit, a new Linear(H, 1) on the pooled pair, "
                "trained at --head-lr) or pretraining (the pretraining pair head: alignment / matching); default: "
                "the model family's own (ViLBERT new, LXMERT pretraining). --zero-shot evaluation always uses the "
                "pair head.",
                parse=or_none,
            ),
            **{  # repeatable TASK=VALUE flags: 12-in-1's per-task settings
                field: _per_task(f"TASK={value} (repeatable): that task's {what}.", flag(field), convert)
                for field, convert, value, what in (
                    (
                        "task_lr",
                        float,
                        "LR",
                        "loss x LR / --lr: 12-in-1's per-task learning rate (it runs the optimizer at the lowest "
                        "and scales each task's loss)",
                    ),
                    ("task_batch", int, "N", "batch size (default --batch-size)"),
                    ("task_max_text", int, "N", "text tokens per candidate (default --max-text)"),
                    ("task_train_split", str, "SPLITS", "training split spec (default --train-split)"),
                    ("task_val_split", str, "SPLIT", "validation split (default --val-split)"),
                )
            },
        },
        section="transfer",
    ),
    Flags(
        RunSettings,
        _RUN,
        {
            **RUN_FLAGS,
            "seed": "Seed of initialization and sampling.",
            "eval_every": "Steps between validations (0: every epoch).",
            "best_metric": Flag(
                "The validation score that picks checkpoints/best (default: the first task's, e.g. eval_vqa_accuracy).",
                parse=or_none,
            ),
        },
        section="run",
    ),
)


FINETUNE_RECIPE_OPTION = _recipe_option(
    "A published fine-tuning recipe: lxmert-vqa, lxmert-gqa, lxmert-nlvr2 (airsplay/lxmert's run scripts), "
    "vilbert-vqa, vilbert-gqa, vilbert-nlvr2, vilbert-refcoco+, vilbert-flickr30k, vilbert-vcr-q2a, "
    "vilbert-vcr-qa2r (vilbert-multi-task's vilbert_tasks.yml), vilbert-12in1 (its multi-task schedule); "
    "every value cited in vl_models/recipes/finetune/. Or a YAML file of the same keys. Its values replace "
    "the defaults of the options not given; its per-task values for tasks not run are dropped."
)


def finetune_values(ctx: typer.Context, values: dict) -> dict:
    """The recipe's values under the options given (its per-task entries kept for the
    tasks run); --steps or --epochs."""
    from vl_models.train.recipes import FINETUNE_RECIPE_DIR

    recipe = values.get("recipe")
    values = _with_recipe(ctx, values, FINETUNE_RECIPE_DIR)
    if recipe:
        tasks = set(values["tasks"])
        for name in TransferSettings.PER_TASK:
            if not _given(ctx, name):
                values[name] = [item for item in values[name] if item.partition("=")[0].strip() in tasks]
    return _steps_or_epochs(ctx, values)


EVALUATE_FLAGS = (
    Flags(
        EvaluateConfig,
        "Inputs and output",
        {
            "task": "The task: vqa, gqa, nlvr2, flickr30k, coco-retrieval, refcoco+, refcoco, refcocog, vcr.",
            "checkpoint": "A fine-tuning run folder (its latest checkpoint; --step best: the best) or checkpoint file; "
            "a published fine-tuned checkpoint (a transformers LxmertForQuestionAnswering folder such as "
            "unc-nlp/lxmert-vqa-uncased, an airsplay/lxmert BEST.pth); with --zero-shot a pretraining run or "
            "checkpoint.",
            "step": "In a run folder: the checkpoint of this step, or best.",
            "model": "Model config, when --checkpoint is no run of ours and holds none (an airsplay/lxmert BEST.pth: "
            "lxmert-base; with --zero-shot an HF LXMERT or vilbert-multi-task pretraining checkpoint).",
            "data": "The task dataset (`vlprep build-task`).",
            "split": "The split to score (e.g. val, minval, test-dev, dev, test1, testA, test).",
            "stores": "Feature store(s) (default: the run's; a published checkpoint needs them named).",
            "given_stores": "Feature store(s) of ground-truth boxes (`vlprep extract --given-boxes`) beside the "
            "detections (default: the run's --given-stores): VCR keeps every ground-truth box, as 12-in-1; RefCOCO is "
            "scored on detections alone.",
            "vocab": "Vocab (default: the run's; a published checkpoint's own, else bert-base-uncased's).",
            "out": "Folder for metrics.json and the submission file (default: RUN/eval/TASK-SPLIT).",
        },
    ),
    Flags(
        EvaluateConfig,
        "Scoring",
        {
            "zero_shot": Flag(
                "Retrieval with the pretraining pair head (alignment / matching), no fine-tuning: ViLBERT's zero-shot "
                "Flickr30k.",
                name="--zero-shot",
            ),
            "device": DEVICE_FLAG,
            "batch_size": "Examples (retrieval: captions) per forward.",
            "limit": "Score only the first N rows (retrieval: images) of the split (0: all).",
            "max_regions": "Region slots per image, ViLBERT's IMG token not counted (default: the run's; a published "
            "checkpoint's code's: 12-in-1 100, vilbert_beta 99, LXMERT 36).",
            "max_text": "Text tokens per example (default: the run's; a published checkpoint's code's for the task: "
            "12-in-1 VQA 23, GQA 26, NLVR2 40, RefCOCO 20, retrieval 30, VCR 60 / 80; LXMERT 20).",
            "nlvr2_packing": Flag(
                "NLVR2: per-image (default: each image its own row of region slots) or mt (vilbert-multi-task's: both "
                "images' IMG tokens and regions packed in order into two rows, which differs where an image has "
                "fewer regions than its slots).",
                choices=NLVR2_PACKINGS,
            ),
        },
    ),
)

PREVIEW_FLAGS = (
    Flags(
        PreviewConfig,
        "Batch",
        {
            "store": Flag("Feature store directory.", argument=True),
            "batch_size": "Images in the batch.",
            "max_regions": "Region slots per image (excluding the IMG token).",
            "position": Flag("Box encoding: 5d (ViLBERT) or 4d (LXMERT).", choices=POSITIONS),
            "img_token": "Prepend ViLBERT's IMG token (mean feature, whole-image box).",
        },
    ),
)


# A renamed flag's former spelling -> its name: still taken, with one line on stderr, by the
# commands that have the flag (and in their recipes, with underscores).
RENAMED = {
    "--shards": "--stores",
    "--given-shards": "--given-stores",
    "--weight": "--loss-weight",
    "--task-data": "--data",
}


def _deprecated(old: str, new: str) -> None:
    typer.echo(f"{old} is deprecated: use {new}", err=True)


def _current_keys(path: Path, obj: dict, options: Collection[str]) -> dict:
    """A recipe's values with each former spelling of an option in `options` (`RENAMED`, with
    underscores) under the option's name, said on stderr."""
    obj = dict(obj)
    for old, new in RENAMED.items():
        old, new = (name.lstrip("-").replace("-", "_") for name in (old, new))
        if old in obj and new in options:
            if new in obj:
                raise ConfigError(f"{path}: {old} and {new} are one option; give {new}")
            _deprecated(f"{path}: {old}", new)
            obj[new] = obj.pop(old)
    return obj


def bare_resume(args: list[str]) -> list[str]:
    """`--resume` written without a value (last, or before another option) means `--resume
    yes`, as before it took one (typer gives no option an optional value, so the command line
    is completed before parsing; a word after it is its value, checked as a choice)."""
    out = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg == "--resume" and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append("yes")
    return out


def command_args(flags: Collection[str], args: list[str]) -> list[str]:
    """A command's arguments as it parses them: a bare --resume completed (`bare_resume`), and
    each former spelling (`RENAMED`, also as ``--old=VALUE``) of one of its `flags` written as
    the flag, said once on stderr. Nothing after ``--`` (the end of the options) is changed."""
    out, said = [], set()
    args = bare_resume(args)
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        old, eq, value = arg.partition("=")
        new = RENAMED.get(old)
        if new in flags:
            if old not in said:
                _deprecated(old, new)
                said.add(old)
            arg = new + eq + value
        out.append(arg)
    return out
