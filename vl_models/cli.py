"""The `vltrain` command line: flags -> a config -> run(cfg) (the flags and recipes:
`vl_models.flags`). Named errors become one line and an exit code (`pipeline.log.named_errors`)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import List, Literal

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from pipeline.cli_flags import config_command
from pipeline.errors import ConfigError
from pipeline.log import cli_app, named_errors
from vl_models.config import DEVICES, EvaluateConfig, FinetuneConfig, PreviewConfig, TrainConfig
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


PREDICT_CHUNK = 256  # --queries lines answered at a time (their images held in memory meanwhile)


@app.command()
@named_errors
def predict(
    checkpoint: str = typer.Option(
        ...,
        help="A fine-tuning or pretraining run folder (its latest checkpoint; --step best: the best) or checkpoint.",
    ),
    image: List[str] = typer.Option([], "--image", help="An image: a file or an http(s) URL (twice for --statement)."),
    images: List[str] = typer.Option(
        [], "--images", help="Images to rank for --caption: files, folders (their images) or URLs; repeatable."
    ),
    more_images: List[str] = typer.Argument(
        None, metavar="IMAGES", help="More images to rank for --caption (a shell glob: --images photos/*.jpg)."
    ),
    image_id: List[str] = typer.Option(
        [], "--image-id", help="An image of the feature store (--store, default the run's) by id, instead of --image."
    ),
    question: str = typer.Option(None, help="A question (VQA, GQA; with 4 --choice: VCR)."),
    statement: str = typer.Option(None, help="A statement about two images, true or false (NLVR2)."),
    expression: str = typer.Option(None, help="A referring expression: the box it names (RefCOCO+)."),
    caption: List[str] = typer.Option(
        [], "--caption", help="With --images: rank them for it; with one --image, several: rank them for the image."
    ),
    text: str = typer.Option(None, help="The pair head's probability that this text describes --image."),
    choice: List[str] = typer.Option([], "--choice", help="VCR: an answer choice (4 times)."),
    rationale: List[str] = typer.Option([], "--rationale", help="VCR: a rationale (4 times)."),
    answer: int = typer.Option(None, help="VCR QA->R: the answer (0-3) the rationales are conditioned on."),
    task: str = typer.Option(None, help="The head to ask where the run has several of a kind (e.g. vqa or gqa)."),
    top_k: int = typer.Option(None, "--top-k", help="Answers (default 5) or ranked images / captions (default all)."),
    queries: Path = typer.Option(
        None, help="A JSON-lines file of queries (fields as the flags: image, images, image_id, question, ...)."
    ),
    out: Path = typer.Option(None, help="Write the results here as JSON lines (default: standard output)."),
    show: Path = typer.Option(None, help="Draw the image, its regions and the answer into this PNG (one query)."),
    step: str = typer.Option(None, help="In a run folder: the checkpoint of this step, or best."),
    store: Path = typer.Option(None, help="The feature store whose detector runs on new images (default: the run's)."),
    weights: Path = typer.Option(
        None, help="The detector weights file, where the store's recorded one is not here (checked by its sha256)."
    ),
    detector: str = typer.Option(
        None, help="The detector config (a name or JSON), where the recorded one is not here."
    ),
    vocab: Path = typer.Option(None, help="Vocab (default: the run's)."),
    task_data: List[str] = typer.Option(
        [], "--task-data", help="TASK=FOLDER: a task dataset with the head's answer table, where the run's is not here."
    ),
    allow_private_network: bool = typer.Option(
        False, "--allow-private-network", help="Fetch image URLs on private networks too (refused by default)."
    ),
    device: Literal[DEVICES] = typer.Option("cpu", help="cpu or cuda."),
    batch_size: int = typer.Option(16, help="Examples per forward (queries of one task share them)."),
    detector_threads: int = typer.Option(
        None,
        help="CPU threads for the detector (default: the store's extract actors', for features bitwise equal to the "
        "store's; more is faster, equal to the last bits).",
    ),
) -> None:
    """Ask a trained model about your own images: an answer, a verdict, a box, a ranking, a choice.

    New images go through the detector of the store the model was trained on, exactly as
    `vlprep extract` extracted that store (same weights, preprocessing and box policy).

    Examples:

    vltrain predict --checkpoint runs/vqa --image photo.jpg --question "what is on the table?"

    vltrain predict --checkpoint runs/nlvr2 --image left.jpg --image right.jpg --statement "..."

    vltrain predict --checkpoint runs/refcoco+ --image photo.jpg --expression "the man on the left" --show box.png

    vltrain predict --checkpoint runs/f30k --caption "a dog in the snow" --images photos/*.jpg --top-k 10

    vltrain predict --checkpoint runs/vqa --queries queries.jsonl --out predictions.jsonl
    """
    import contextlib
    import json

    from pipeline.download.fetch import FetchConfig
    from pipeline.io import atomic_write_bytes, check_output, output_lock
    from vl_models.predict import (
        PredictError,
        StoreImage,
        load_predictor,
        local_images,
        picture,
        query_of,
        read_queries,
        recorded_inputs,
    )

    flagged = bool(caption) or any(v is not None for v in (question, statement, expression, text))
    images = [*images, *(more_images or [])]
    if more_images and not caption:
        raise ConfigError(f"{more_images[0]}: images after the flags are ranked for a --caption; there is none")
    if (queries is None) != flagged:
        raise ConfigError("ask with the flags (--question, --statement, ...) or with --queries FILE, one of them")
    if show is not None and queries is not None:
        raise ConfigError("--show draws one query: leave out --queries")
    for value, flag in ((batch_size, "--batch-size"), (detector_threads, "--detector-threads"), (top_k, "--top-k")):
        if value is not None and value < 1:
            raise ConfigError(
                f"{flag} must be >= 1, got {value}" + " (leave it out: 5 answers, whole rankings)" * (flag == "--top-k")
            )
    if show is not None and show.suffix.lower() != ".png":
        raise ConfigError(f"--show {show}: the picture is a PNG; give a .png path")
    folders = {}
    for entry in task_data:
        name, sep, folder = entry.partition("=")
        if not sep or not name or not folder:
            raise ConfigError(f"--task-data {entry!r}: TASK=FOLDER")
        folders[name] = folder
    if queries is None:
        asked = [
            query_of(
                [*image, *(StoreImage(i) for i in image_id)],
                images,
                question,
                statement,
                expression,
                caption,
                text,
                choice,
                rationale,
                answer,
                task,
            )
        ]
    outputs = [(path, flag) for path, flag in ((out, "--out"), (show, "--show")) if path is not None]
    if out is not None and show is not None and out.resolve() == show.resolve():
        raise ConfigError(f"--out and --show are the same file ({out}); give each its own")
    # every input of the command is an input of its outputs: none is written over
    inputs = [Path(checkpoint), *[Path(f) for f in folders.values()]]
    inputs += [Path(p) for p in (queries, weights, store, vocab) if p is not None]
    inputs += [Path(i) for i in (*image, *images) if "://" not in i]
    if queries is not None:
        inputs += [p for q in read_queries(queries) for p in local_images(q)]

    def check(extra=()) -> None:
        for path, flag in outputs:
            check_output(path, "predictions", inputs=[*inputs, *extra], flag=flag, folder=False)
            if not path.parent.is_dir():
                raise ConfigError(f"{flag} {path}: its folder {path.parent} does not exist")

    check(recorded_inputs(checkpoint))  # the run's own inputs too, as its config.json names them
    with contextlib.ExitStack() as held:
        for path, flag in outputs:  # a second predict writing the same file is turned away at once
            held.enter_context(output_lock(path, "predictions"))
        predictor = load_predictor(
            checkpoint,
            device,
            step,
            weights,
            detector,
            store,
            vocab,
            folders,
            FetchConfig(allow_private_network=allow_private_network),
            batch_size,
            detector_threads,
        )
        check(predictor.inputs)  # the run's own inputs, now known: its store, vocab, task datasets
        results = []
        stream = read_queries(queries) if queries is not None else iter(asked)
        with progress_bar("predict", disable=queries is None) as bar:
            job = bar.add_task("queries", total=None)
            while True:  # the images of a chunk are kept, not all of them
                chunk = list(itertools.islice(stream, PREDICT_CHUNK))
                if not chunk:
                    break
                answered = iter(predictor.ask([q for q in chunk if "_bad" not in q], top_k))
                results += [
                    {"id": q["id"], "error": "bad query", "detail": q["_bad"]} if "_bad" in q else next(answered)
                    for q in chunk
                ]
                bar.update(job, completed=len(results))
        if queries is None and "error" in results[0]:
            raise PredictError(results[0]["error"], results[0]["detail"])
        text_out = "".join(json.dumps(r) + "\n" for r in results)
        if out is not None:
            atomic_write_bytes(out, text_out.encode())
        else:
            sys.stdout.write(text_out)
        if show is not None:
            picture(predictor, asked[0], results[0]).save(show, format="PNG")
    failed = sum("error" in r for r in results)
    if failed:
        Console(stderr=True).print(f"{failed} of {len(results)} queries failed (their lines name the reason)")
        raise typer.Exit(2)


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
    from pipeline.records import pad_regions
    from pipeline.store import FeatureStore

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
        "num_regions",
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
    out.print(f"real slots per image: {batch.num_regions.tolist()}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
