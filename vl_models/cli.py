"""The `vltrain` command line: flags -> a config -> run(cfg) (the flags and recipes:
`vl_models.flags`). Named errors become one line and an exit code (`pipeline.log.named_errors`)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from pipeline.cli_flags import config_command
from pipeline.errors import ConfigError
from pipeline.log import cli_app, named_errors
from vl_models.config import EvaluateConfig, FinetuneConfig, PreviewConfig, TrainConfig
from vl_models.flags import (
    EVALUATE_FLAGS,
    FINETUNE_FLAGS,
    FINETUNE_RECIPE_OPTION,
    PRETRAIN_FLAGS,
    PREVIEW_FLAGS,
    RECIPE_OPTION,
    command_args,
    finetune_values,
    pretrain_values,
)
from vl_models.predict import command as predict_command
from vl_models.progress import bar as progress_bar
from vl_models.progress import train_with_progress


class _Commands(TyperGroup):
    """vltrain's commands, each handed its arguments as `vl_models.flags.command_args` completes
    them (a bare --resume, the former spellings of renamed flags)."""

    def resolve_command(self, ctx, args):
        name, command, rest = super().resolve_command(ctx, args)
        flags = {opt for param in command.params for opt in param.opts} if command else set()
        return name, command, command_args(flags, rest)


app = cli_app("vltrain", "Train ViLBERT- and LXMERT-style models on vlprep feature stores.", cls=_Commands)
out = Console()


@app.command()
@named_errors
@config_command(TrainConfig, *PRETRAIN_FLAGS, extra=[RECIPE_OPTION], prepare=pretrain_values)
def pretrain(cfg: TrainConfig) -> None:
    """Pretrain ViLBERT or LXMERT on feature stores and a mixture, with all of the
    model's pretraining tasks.

    Runs on one CPU, or with torchrun on many processes/GPUs; --recipe lxmert-paper or
    vilbert-paper sets the published schedule.

    Example:

        vltrain pretrain --model lxmert-base --stores coco_feats --stores vg_feats --mixture lxmert_mix \\
            --vocab vocab.txt --out runs/lxmert
    """
    from vl_models.train.trainer import run

    train_with_progress(run, cfg, "pretraining")


@app.command()
@named_errors
@config_command(FinetuneConfig, *FINETUNE_FLAGS, extra=[FINETUNE_RECIPE_OPTION], prepare=finetune_values)
def finetune(cfg: FinetuneConfig) -> None:
    """Fine-tune a pretrained (or untrained) model on downstream tasks.

    The pretraining trainer runs it (AMP, DDP under torchrun, resume, checkpoints), with a
    validation each epoch by the task's official metric and the best checkpoint kept;
    --recipe sets a published schedule (LXMERT's, ViLBERT / 12-in-1's).

    Example:

        vltrain finetune --recipe lxmert-vqa --data tasks/vqa --stores coco_feats --init runs/lxmert \\
            --out runs/vqa
    """
    from vl_models.transfer.finetune import run_finetune

    train_with_progress(run_finetune, cfg, "fine-tuning")


@app.command()
@named_errors
@config_command(EvaluateConfig, *EVALUATE_FLAGS)
def evaluate(cfg: EvaluateConfig) -> None:
    """Score a checkpoint on a task split with the task's official metric and write the
    predictions in the official submission format (VQA / GQA results JSON, NLVR2 CSV, VCR CSV).
    A published checkpoint is scored with its code's text length and region slots (--max-text,
    --max-regions: others); the settings used are logged and written into metrics.json.

    Example: vltrain evaluate --task vqa --checkpoint runs/vqa --step best --data tasks/vqa --split test-dev

    A published model (its answer table in the task dataset: build-task --answers-from trainval_label2ans.json):
    vltrain evaluate --task vqa --checkpoint lxmert-vqa-uncased/ --data tasks/vqa --split minival --stores coco_feats
    --out eval/lxmert-vqa
    """
    from vl_models import distributed
    from vl_models.transfer.evaluate import evaluate_checkpoint

    task, split = cfg.task, cfg.split
    main = distributed.is_main()  # under torchrun: the ranks share the scoring, rank 0 reports
    with progress_bar(f"{task} {split}", disable=not main) as bar:
        job = bar.add_task("scoring", total=None)
        result = evaluate_checkpoint(cfg, progress=lambda done, total: bar.update(job, completed=done, total=total))
    if not main:
        return
    table = Table(title=f"{task} {split}: {result['examples']} rows")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in result["metrics"].items():
        table.add_row(name, f"{value:.2f}")
    out_console = Console()
    out_console.print(table)
    out_console.print("wrote " + ", ".join(result["files"]))


predict_command.register(app)  # `vltrain predict`: vl_models/predict/command.py


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
    to: str = typer.Option(
        "hf", "--to", help="hf: a Hugging Face folder (model.safetensors, config.json, tokenizer files)."
    ),
    step: str = typer.Option(
        None, "--step", help="In a run folder: the checkpoint of step N, or best (default: latest)."
    ),
    vocab: Path = typer.Option(None, help="The run's vocab, if it moved since training (default: the run's --vocab)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier export in OUTPUT (its files only)."),
) -> None:
    """Export a checkpoint for `transformers`. LXMERT: `LxmertForPreTraining.from_pretrained(OUTPUT)`
    and `AutoTokenizer.from_pretrained(OUTPUT)`. ViLBERT (no transformers class):
    `vl_models.models.weights.load_exported(OUTPUT)`; its text stream alone (without
    co-attention) loads as `BertModel.from_pretrained(OUTPUT/text_stream, add_pooling_layer=False)`.
    A fine-tuning run exports its backbone (its task heads have no such format and are left out, said so).

    Example: vltrain export --to hf runs/lxmert lxmert-hf --step best
    """
    from vl_models.export import FORMATS, export_run

    if to not in FORMATS:
        raise ConfigError(f"--to {to!r}: known formats: {', '.join(FORMATS)}")
    done = export_run(source, output, step, vocab, overwrite)
    left = f"; its task heads ({', '.join(done['heads_not_exported'])}) are not exported" * bool(
        done["heads_not_exported"]
    )
    Console().print(f"exported {done['kind']} step {done['step']} ({done['source']}) -> {output}{left}")


@app.command("preview-batch")
@named_errors
@config_command(PreviewConfig, *PREVIEW_FLAGS)
def preview_batch(cfg: PreviewConfig) -> None:
    """Read the first images of a store and show the padded batch a model receives:
    tensor shapes, dtypes and how many slots are real."""
    from pipeline.store import FeatureStore
    from pipeline.store.buffer import pad_regions

    store = cfg.store
    with FeatureStore.open(store) as store_obj:
        count = min(cfg.batch_size, len(store_obj))
        if count == 0:
            Console(stderr=True).print(f"[red]error:[/red] {store} holds no records")
            raise typer.Exit(1)
        batch = pad_regions(
            [store_obj.record_at(i) for i in range(count)],
            cfg.max_regions,
            position=cfg.position,
            img_token=cfg.img_token,
        )
    table = Table("input", "shape", "dtype", title=f"padded batch of {count} from {store}")
    for name in (
        "features",
        "positions",
        "mask",
        "regions",
        "objects_id",
        "objects_conf",
        "attrs_id",
        "attrs_conf",
        "cls_prob",
        "attr_prob",
    ):
        value = getattr(batch, name)
        if value is not None:
            table.add_row(name, str(tuple(value.shape)), str(value.dtype))
    out.print(table)
    out.print(f"real slots per image: {batch.slots_used.tolist()}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
