"""The `vltrain` command line: flags -> a config -> run(cfg). Named errors become one
line and an exit code (`pipeline.log.named_errors`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import List, Literal, Optional

import typer
from rich.console import Console
from rich.table import Table

from pipeline.errors import ConfigError
from pipeline.log import cli_app, named_errors
from vl_models.config import AMP, DEVICES, OPTIMIZERS, REGION_OVERLAP, VISUAL_WEIGHTING, TrainConfig

app = cli_app("vltrain", "Train ViLBERT- and LXMERT-style models on vlprep feature stores.")
out = Console()


# What a recipe may set: the options that shape the run, not where its inputs and outputs are.
_NOT_IN_RECIPES = {"recipe", "shards", "mixture", "out", "vocab", "init", "resume", "overwrite", "stop_at"}


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was set by the user (command line or environment), not by default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _with_recipe(ctx: typer.Context, recipe: Optional[str]) -> dict:
    """The command's option values, with `recipe`'s values in place of the defaults of the
    options not given. Each recipe value goes through its option's own type check; a
    ``{TASK: N}`` mapping is read as repeated ``TASK=N`` (--weight, --task-from)."""
    from vl_models.train.recipes import load_recipe

    values = dict(ctx.params)
    if not recipe:
        return values
    path, obj = load_recipe(recipe)
    options = {p.name: p for p in ctx.command.params}
    unknown = sorted(set(obj) - (set(options) - _NOT_IN_RECIPES))
    if unknown:
        raise ConfigError(f"{path}: unknown or not settable by a recipe: {', '.join(unknown)} (settable: "
                          f"{', '.join(sorted(set(options) - _NOT_IN_RECIPES))})")
    for name, value in obj.items():
        if _given(ctx, name):
            continue
        if isinstance(value, dict):
            value = [f"{k}={v}" for k, v in value.items()]
        if options[name].multiple and not isinstance(value, list):
            value = [value]
        try:
            values[name] = options[name].process_value(ctx, value)
        except typer.BadParameter as err:
            raise ConfigError(f"{path}: {name}: {err.message}") from err
    return values


@app.command()
@named_errors
def pretrain(
    ctx: typer.Context,
    model: str = typer.Option(None, help="Model config (required unless --recipe gives one): lxmert-base, lxmert-small, lxmert-tiny, vilbert-base[-2|4|8coattn], vilbert-small, vilbert-tiny, or a JSON path (small: 64 wide, the demo's; tiny: 32 wide, for tests).", rich_help_panel="Inputs and output"),
    shards: List[Path] = typer.Option(..., "--shards", help="Feature store(s) with the images' region features (repeatable).", rich_help_panel="Inputs and output"),
    mixture: Path = typer.Option(..., help="Mixture folder from `vlprep build-mixture`.", rich_help_panel="Inputs and output"),
    out: Path = typer.Option(..., help="Run folder: config.json, metrics.jsonl, checkpoints/.", rich_help_panel="Inputs and output"),
    vocab: Path = typer.Option(..., help="BERT WordPiece vocab: a vocab.txt (uncased), a tokenizer.json, or a model folder with either.", rich_help_panel="Inputs and output"),
    recipe: str = typer.Option(None, help="A published recipe: lxmert-paper or vilbert-paper (every number cited in the file, see vl_models/recipes/), or a YAML file of the same keys (option names with underscores). Its values replace the defaults of the options not given on the command line.", rich_help_panel="Inputs and output"),
    steps: int = typer.Option(1000, help="Optimizer steps.", rich_help_panel="Schedule and optimizer"),
    epochs: float = typer.Option(0, help="Passes over the train split; sets --steps from the split's size, the batch size and the rank count (0: use --steps).", rich_help_panel="Schedule and optimizer"),
    batch_size: int = typer.Option(32, help="Examples per rank per micro-step.", rich_help_panel="Schedule and optimizer"),
    grad_accum: int = typer.Option(1, help="Micro-steps per optimizer step.", rich_help_panel="Schedule and optimizer"),
    lr: float = typer.Option(1e-4, help="Peak learning rate (linear warmup, then linear decay).", rich_help_panel="Schedule and optimizer"),
    optimizer: Literal[OPTIMIZERS] = typer.Option("adamw", help="adamw (default, fused; no decay on bias/LayerNorm), bertadam (LXMERT's: no bias correction, decay on all parameters) or sgd (momentum 0.9).", rich_help_panel="Schedule and optimizer"),
    warmup: float = typer.Option(100, help="Warmup: steps, or a fraction of all steps when below 1 (e.g. 0.1).", rich_help_panel="Schedule and optimizer"),
    weight_decay: float = typer.Option(0.01, help="AdamW weight decay (none on biases and LayerNorms).", rich_help_panel="Schedule and optimizer"),
    device: Literal[DEVICES] = typer.Option("cpu", help="cpu or cuda (under torchrun: one GPU per rank).", rich_help_panel="Run: devices, checkpoints, logging"),
    amp: Literal[AMP] = typer.Option("none", help="Mixed precision: none, bf16, or fp16 (CUDA, with a GradScaler).", rich_help_panel="Run: devices, checkpoints, logging"),
    workers: int = typer.Option(0, help="DataLoader worker processes.", rich_help_panel="Data"),
    init: Path = typer.Option(None, help="Start from a checkpoint (file or folder): LXMERT (HF or original .pth), vilbert-multi-task, or a BERT (BertForPreTraining such as bert-base-uncased/, or a BertModel; pytorch_model.bin or model.safetensors) for the text side and LM head of either model.", rich_help_panel="Inputs and output"),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the backbone (slow first steps; faster after).", rich_help_panel="Run: devices, checkpoints, logging"),
    checkpoint_every: int = typer.Option(500, help="Steps between checkpoints.", rich_help_panel="Run: devices, checkpoints, logging"),
    eval_every: int = typer.Option(0, help="Steps between validation passes on the mixture's val split (0: at the end).", rich_help_panel="Run: devices, checkpoints, logging"),
    seed: int = typer.Option(0, help="Seed of initialization, sampling and masking.", rich_help_panel="Run: devices, checkpoints, logging"),
    resume: bool = typer.Option(False, help="Continue the run in OUT from checkpoints/latest (a new run if OUT holds none). Settings that change what the run computes must stay the same (refused, named); --steps or --epochs may grow (noted in metrics.jsonl).", rich_help_panel="Run: devices, checkpoints, logging"),
    overwrite: bool = typer.Option(False, "--overwrite", help="Start again in an OUT that holds a run: removes only the trainer's files there (config.json, metrics.jsonl, checkpoints/, tensorboard/, curves.png).", rich_help_panel="Run: devices, checkpoints, logging"),
    stop_at: int = typer.Option(0, help="End this invocation at this step (0: run to --steps); resume later.", rich_help_panel="Run: devices, checkpoints, logging"),
    keep_last: int = typer.Option(3, help="Checkpoints kept (0: all), besides the best one (--best-metric).", rich_help_panel="Run: devices, checkpoints, logging"),
    best_metric: str = typer.Option(None, help="Keep the best checkpoint by this validation score (checkpoints/best), e.g. eval_qa_score, eval_retrieval_R@1, eval_region_kl; NAME:max or NAME:min to set the direction.", rich_help_panel="Run: devices, checkpoints, logging"),
    log_every: int = typer.Option(10, help="Steps between metrics rows (and progress lines when stderr is not a terminal).", rich_help_panel="Run: devices, checkpoints, logging"),
    report_to: List[str] = typer.Option([], "--report-to", help="Also report to: tensorboard (events in OUT/tensorboard; pip install tensorboard).", rich_help_panel="Run: devices, checkpoints, logging"),
    max_text: int = typer.Option(0, help="Text tokens per item (0: the model's default, ViLBERT 36, LXMERT 20).", rich_help_panel="Data"),
    max_regions: int = typer.Option(36, help="Regions per image (ViLBERT adds its IMG token).", rich_help_panel="Data"),
    region_overlap: Literal[REGION_OVERLAP] = typer.Option("keep", help="ViLBERT region masking: keep (the paper: only the 15 % selected regions are masked) or zero (12-in-1: every selected region and every region overlapping one by IoU > 0.4 are zeroed, none left unaltered). The loss is on the selected regions either way.", rich_help_panel="Data"),
    mlm_prob: float = typer.Option(0.15, help="Share of words selected for masked LM (both papers: 0.15).", rich_help_panel="Data"),
    region_prob: float = typer.Option(0.15, help="Share of regions selected for masked-region modelling (both papers: 0.15).", rich_help_panel="Data"),
    mismatch_prob: float = typer.Option(0.5, help="Share of items whose text is swapped for another image's: the negatives of the alignment / matching task (both papers: 0.5).", rich_help_panel="Data"),
    clip: float = typer.Option(1.0, help="Gradient clipping (global norm).", rich_help_panel="Schedule and optimizer"),
    verify_shards: bool = typer.Option(False, "--verify-shards", help="Check each feature-store shard's sha256 on first use (also: VLPREP_VERIFY_SHARDS=1).", rich_help_panel="Data"),
    visual_weighting: Literal[VISUAL_WEIGHTING] = typer.Option("confidence", help="LXMERT obj/attr losses: confidence (reference) or masked.", rich_help_panel="Tasks"),
    qa_from_epoch: int = typer.Option(0, help="LXMERT: train image QA from this epoch on.", rich_help_panel="Tasks"),
    weight: List[str] = typer.Option([], "--weight", help="TASK=W: a task's loss weight (default 1; repeatable). Tasks: ViLBERT mlm, region, alignment; LXMERT mlm, matching, obj, attr, feat, qa.", rich_help_panel="Tasks"),
    task_from: List[str] = typer.Option([], "--task-from", help="TASK=N: a task's loss is off for the first N optimizer steps (repeatable), e.g. alignment=1000 to let the streams learn before the pair head trains.", rich_help_panel="Tasks"),
) -> None:
    """Pretrain ViLBERT or LXMERT on feature stores and a mixture, with all of the
    model's pretraining tasks. Runs on one CPU, or with torchrun on many processes/GPUs.

    Example: vltrain pretrain --model lxmert-base --shards coco_feats --shards vg_feats --mixture lxmert_mix --vocab vocab.txt --out runs/lxmert
    """
    from vl_models.train.trainer import run

    o = _with_recipe(ctx, recipe)
    if not o["model"]:
        raise ConfigError("--model is required (or a --recipe that names one)")
    if _given(ctx, "steps") and _given(ctx, "epochs"):
        raise ConfigError("give --steps or --epochs, not both")
    if _given(ctx, "steps"):  # over a recipe's epochs
        o["epochs"] = 0
    # Every other option is a training setting of the same name (a test checks both ways).
    settings = {k: v for k, v in o.items() if k not in ("recipe", "shards", "weight", "task_from")}
    settings.update(stores=tuple(str(s) for s in shards), mixture=str(mixture), out=str(out), vocab=str(vocab),
                    init=str(init) if init else None, epochs=o["epochs"] or None, stop_at=stop_at or None,
                    max_text=o["max_text"] or None, weights=_pairs(o["weight"], "--weight", float),
                    from_step=_pairs(o["task_from"], "--task-from", int))
    cfg = TrainConfig.of(**settings)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from vl_models.train.runlog import progress_line

    stderr = Console(stderr=True)
    if not stderr.is_terminal:  # a batch job: a log line per logged step instead of a bar
        last = run(cfg, on_step=lambda step, metrics, total: logging.getLogger("vltrain").info(
            progress_line(metrics, total)))
    else:
        columns = [TextColumn("pretraining"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn()]
        with Progress(*columns, console=stderr, transient=True) as bar:
            task = bar.add_task("steps", total=None, info="")  # the total comes with the first step

            def update(step: int, metrics: dict, total: int) -> None:
                loss = sum(v for k, v in metrics.items() if k.startswith("loss_"))
                bar.update(task, completed=step, total=total, info=f"loss {loss:.3f}, {metrics['samples_per_s']:.1f} samples/s")

            last = run(cfg, on_step=update)
    shown = {k: round(v, 4) for k, v in last.items() if k.startswith(("loss_", "eval_"))}
    Console().print(f"done: step {last.get('step', 'unchanged: the run was at its end')} -> {out}")
    Console().print(shown)


@app.command()
@named_errors
def plot(
    run_dir: Path = typer.Argument(..., help="Run folder with metrics.jsonl."),
    output: Path = typer.Option(None, "-o", "--output", help="PNG to write (default RUN/curves.png)."),
) -> None:
    """Plot a run's training losses, accuracies and validation metrics to a PNG."""
    from vl_models.train.plot import plot_run

    if not (run_dir / "metrics.jsonl").exists():
        Console(stderr=True).print(f"[red]error:[/red] {run_dir} has no metrics.jsonl")
        raise typer.Exit(2)
    path = plot_run(run_dir, output or run_dir / "curves.png")
    Console().print(f"wrote {path}")


@app.command()
@named_errors
def export(
    source: Path = typer.Argument(..., help="A run folder (its latest checkpoint, or --step) or a checkpoint file."),
    output: Path = typer.Argument(..., help="Folder to write (new or empty; an earlier export with --overwrite)."),
    to: str = typer.Option("hf", "--to", help="hf: a Hugging Face folder (model.safetensors, config.json, tokenizer files)."),
    step: str = typer.Option(None, "--step", help="In a run folder: the checkpoint of step N, or best (default: latest)."),
    vocab: Path = typer.Option(None, help="The run's vocab, if it moved since training (default: the run's --vocab)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier export in OUTPUT (its files only)."),
) -> None:
    """Export a checkpoint for `transformers`. LXMERT: `LxmertForPreTraining.from_pretrained(OUTPUT)`
    and `AutoTokenizer.from_pretrained(OUTPUT)`. ViLBERT (no transformers class):
    `vl_models.models.weights.load_exported(OUTPUT)`; its text stream alone (without
    co-attention) loads as `BertModel.from_pretrained(OUTPUT/text_stream, add_pooling_layer=False)`.

    Example: vltrain export --to hf runs/lxmert lxmert-hf --step best
    """
    from vl_models.export import FORMATS, export_run

    if to not in FORMATS:
        raise ConfigError(f"--to {to!r}: known formats: {', '.join(FORMATS)}")
    if step is not None and step not in ("best", "latest") and not step.isdigit():
        raise ConfigError(f"--step {step!r}: a step number, best or latest")
    done = export_run(source, output, int(step) if step and step.isdigit() else step, vocab, overwrite)
    Console().print(f"exported {done['kind']} step {done['step']} ({done['source']}) -> {output}")


@app.command("preview-batch")
@named_errors
def preview_batch(
    store: Path = typer.Argument(..., help="Feature store directory."),
    batch_size: int = typer.Option(4, help="Images in the batch."),
    max_boxes: int = typer.Option(36, help="Region slots per image (excluding the IMG token)."),
    position: Literal["5d", "4d"] = typer.Option("5d", help="Box encoding: 5d (ViLBERT) or 4d (LXMERT)."),
    img_token: bool = typer.Option(False, help="Prepend ViLBERT's IMG token (mean feature, whole-image box)."),
) -> None:
    """Read the first images of a store and show the padded batch a model receives:
    tensor shapes, dtypes and how many slots are real."""
    from pipeline.records import pad_regions
    from pipeline.store import FeatureStore

    with FeatureStore.open(store) as store_obj:
        count = min(batch_size, len(store_obj))
        if count == 0:
            Console(stderr=True).print(f"[red]error:[/red] {store} holds no records")
            raise typer.Exit(1)
        batch = pad_regions([store_obj.record_at(i) for i in range(count)], max_boxes, position=position, img_token=img_token)
    table = Table("input", "shape", "dtype", title=f"padded batch of {count} from {store}")
    for name in ("features", "positions", "mask", "num_boxes", "objects_id", "objects_conf", "attrs_id",
                 "attrs_conf", "cls_prob", "attr_prob"):
        value = getattr(batch, name)
        if value is not None:
            table.add_row(name, str(tuple(value.shape)), str(value.dtype))
    out.print(table)
    out.print(f"real slots per image: {batch.num_boxes.tolist()}")


def _pairs(items: List[str], flag: str, convert) -> dict:
    """["alignment=1000", ...] -> {"alignment": 1000, ...}; a malformed item is a usage error."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip() or key.strip() in out:
                raise ValueError
            out[key.strip()] = convert(value)
        except ValueError:
            raise typer.BadParameter(f"{item!r}: expected TASK={convert.__name__.upper()}, each task once",
                                     param_hint=flag) from None
    return out


def main() -> None:
    app()


if __name__ == "__main__":
    main()
