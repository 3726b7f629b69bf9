"""`vltrain predict`: its flags, generated from `PredictConfig`'s fields (`pipeline.cli_flags`)
in help panels, and the command: the query from the flags or a ``--queries`` file, answered
by `load_predictor`'s predictor a chunk at a time, written as JSON lines (and ``--show``'s
picture), never over one of its inputs. `vl_models.cli` attaches it (`register`)."""

from __future__ import annotations

import itertools
import sys
from inspect import Parameter
from pathlib import Path
from typing import List

import typer
from rich.console import Console

from pipeline.cli_flags import Flag, Flags, config_command
from pipeline.detect.backends import config_names_by_backend
from pipeline.errors import ConfigError
from pipeline.log import named_errors
from vl_models.flags import parse_device
from vl_models.predict.config import PredictConfig
from vl_models.progress import bar as progress_bar

PREDICT_CHUNK = 256  # --queries lines answered at a time (their images held in memory meanwhile)

PREDICT_FLAGS = (
    Flags(
        PredictConfig,
        "Model",
        {
            "checkpoint": "A fine-tuning or pretraining run folder (its latest checkpoint; --step best: the best) or "
            "checkpoint.",
            "step": "In a run folder: the checkpoint of this step, or best.",
            "vocab": "Vocab (default: the run's).",
            "task_data": Flag(
                "TASK=FOLDER: a task dataset with the head's answer table, where the run's is not here.", name="--data"
            ),
            "device": Flag(
                "auto (cuda when this process sees a CUDA device, else cpu), cpu, cuda or cuda:N (GPU N).",
                parse=parse_device,
            ),
            "batch_size": "Examples per forward (queries of one task share them).",
        },
    ),
    Flags(
        PredictConfig,
        "Query",
        {
            "image": "An image: a file or an http(s) URL (twice for --statement).",
            "images": "Images to rank for --caption: files, folders (their images) or URLs; repeatable.",
            "image_id": "An image of the feature store (--store, default the run's) by id, instead of --image.",
            "question": "A question (VQA, GQA; with 4 --choice: VCR).",
            "statement": "A statement about two images, true or false (NLVR2).",
            "expression": "A referring expression: the box it names (RefCOCO+).",
            "caption": "With --images: rank them for it; with one --image, several: rank them for the image.",
            "text": "The pair head's probability that this text describes --image.",
            "choice": "VCR: an answer choice (4 times).",
            "rationale": "VCR: a rationale (4 times).",
            "answer": "VCR QA->R: the answer (0-3) the rationales are conditioned on.",
            "task": "The head to ask where the run has several of a kind (e.g. vqa or gqa).",
            "top_k": "Answers (default 5) or ranked images / captions (default all).",
            "queries": "A JSON-lines file of queries (fields as the flags: image, images, image_id, question, ...).",
        },
    ),
    Flags(
        PredictConfig,
        "Output",
        {
            "out": "Write the results here as JSON lines (default: standard output).",
            "show": "Draw the image, its regions and the answer into this PNG (one query).",
        },
    ),
    Flags(
        PredictConfig,
        "Detector of new images",
        {
            "store": "The feature store whose detector runs on new images (default: the run's).",
            "weights": "The detector weights file, where the store's recorded one is not here (checked by its sha256).",
            "detector": "The detector config, by name or a JSON path, where the recorded one is not here: "
            f"{config_names_by_backend()}.",
            "detector_threads": "CPU threads for the detector (default: the store's extract actors', for features "
            "bitwise equal to the store's; more is faster, equal to the last bits).",
            "allow_private_network": Flag(
                "Fetch image URLs on private networks too (refused by default).", name="--allow-private-network"
            ),
        },
    ),
)

MORE_IMAGES = Parameter(  # the images a shell glob gives after the flags
    "more_images",
    Parameter.KEYWORD_ONLY,
    annotation=List[str],
    default=typer.Argument(
        None, metavar="IMAGES", help="More images to rank for --caption (a shell glob: --images photos/*.jpg)."
    ),
)


def _ranked_images(ctx: typer.Context, values: dict) -> dict:
    """The images after the flags join --images: they are ranked for a --caption."""
    more = values.pop("more_images") or []
    if more and not values["caption"]:
        raise ConfigError(f"{more[0]}: images after the flags are ranked for a --caption; there is none")
    values["images"] = [*values["images"], *more]
    return values


@named_errors
@config_command(PredictConfig, *PREDICT_FLAGS, extra=[MORE_IMAGES], prepare=_ranked_images)
def predict(cfg: PredictConfig) -> None:
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
    from vl_models.predict.draw import picture
    from vl_models.predict.load import load_predictor, recorded_inputs
    from vl_models.predict.queries import PredictError, local_images, read_queries

    asked = [_flags_query(cfg)] if cfg.queries is None else []
    outputs = [(path, flag) for path, flag in ((cfg.out, "--out"), (cfg.show, "--show")) if path is not None]
    # every input of the command is an input of its outputs: none is written over
    inputs = [Path(cfg.checkpoint), *[Path(f) for f in cfg.task_folders.values()]]
    inputs += [p for p in (cfg.queries, cfg.weights, cfg.store, cfg.vocab) if p is not None]
    inputs += [Path(i) for i in (*cfg.image, *cfg.images) if "://" not in i]
    if cfg.queries is not None:
        inputs += [p for q in read_queries(cfg.queries) for p in local_images(q)]

    def check(extra=()) -> None:
        for path, flag in outputs:
            check_output(path, "predictions", inputs=[*inputs, *extra], flag=flag, folder=False)
            if not path.parent.is_dir():
                raise ConfigError(f"{flag} {path}: its folder {path.parent} does not exist")

    check(recorded_inputs(cfg.checkpoint))  # the run's own inputs too, as its config.json names them
    with contextlib.ExitStack() as held:
        for path, flag in outputs:  # a second predict writing the same file is turned away at once
            held.enter_context(output_lock(path, "predictions"))
        predictor = load_predictor(
            cfg.checkpoint,
            device=cfg.device,
            step=cfg.step,
            weights=cfg.weights,
            detector=cfg.detector,
            store=cfg.store,
            vocab=cfg.vocab,
            task_data=cfg.task_folders,
            fetch=FetchConfig(allow_private_network=cfg.allow_private_network),
            batch_size=cfg.batch_size,
            detector_threads=cfg.detector_threads,
        )
        check(predictor.inputs)  # the run's own inputs, now known: its store, vocab, task datasets
        stream = read_queries(cfg.queries) if cfg.queries is not None else iter(asked)
        results = _answers(predictor, stream, cfg.top_k, shown=cfg.queries is not None)
        if cfg.queries is None and "error" in results[0]:
            raise PredictError(results[0]["error"], results[0]["detail"])
        text_out = "".join(json.dumps(r) + "\n" for r in results)
        if cfg.out is not None:
            atomic_write_bytes(cfg.out, text_out.encode())
        else:
            sys.stdout.write(text_out)
        if cfg.show is not None:
            picture(predictor, asked[0], results[0]).save(cfg.show, format="PNG")
    failed = sum("error" in r for r in results)
    if failed:
        Console(stderr=True).print(f"{failed} of {len(results)} queries failed (their lines name the reason)")
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    """Attach `vltrain predict` to the vltrain app."""
    app.command()(predict)


def _flags_query(cfg: PredictConfig) -> dict:
    """The one query the flags ask (no --queries file)."""
    from vl_models.predict.images import StoreImage
    from vl_models.predict.queries import query_of

    return query_of(
        images=[*cfg.image, *(StoreImage(i) for i in cfg.image_id)],
        rank_images=cfg.images,
        question=cfg.question,
        statement=cfg.statement,
        expression=cfg.expression,
        captions=cfg.caption,
        text=cfg.text,
        choices=cfg.choice,
        rationales=cfg.rationale,
        answer=cfg.answer,
        task=cfg.task,
    )


def _answers(predictor, stream, top_k, shown: bool) -> list[dict]:
    """Every query of `stream` answered, `PREDICT_CHUNK` at a time (the images of a chunk are
    kept, not all of them); a query the file reader refused (``_bad``) gets its error line. A
    progress bar where `shown` (a --queries file)."""
    results = []
    with progress_bar("predict", disable=not shown) as bar:
        job = bar.add_task("queries", total=None)
        while True:
            chunk = list(itertools.islice(stream, PREDICT_CHUNK))
            if not chunk:
                break
            answered = iter(predictor.ask([q for q in chunk if "_bad" not in q], top_k))
            results += [
                {"id": q["id"], "error": "bad query", "detail": q["_bad"]} if "_bad" in q else next(answered)
                for q in chunk
            ]
            bar.update(job, completed=len(results))
    return results
