"""The `vlprep demo` command (its flags make a `DemoConfig`; the run's report shown on the
terminal) and `register`, which attaches it to the `vlprep` app as a plugin command."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from pipeline.log import named_errors
from vl_models.demo.config import MODELS, DemoConfig
from vl_models.demo.run import run_demo


def demo(
    out: Path = typer.Option(
        Path("vlprep_demo"), help="Folder for everything the demo writes (a rerun with the same settings resumes)."
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help=(
            "About 3.5 minutes on 2 cores, the transfer stage included: 400 scenes, 1,200 steps per model (what "
            "CI runs)."
        ),
    ),
    seed: int = typer.Option(0, help="Seed of the world, the sampling and the models."),
    n_images: int = typer.Option(None, help="Scenes in the world (default 2000; --quick 400)."),
    steps: int = typer.Option(None, help="Pretraining steps per model (default 2500; --quick 1200)."),
    vocab: Path = typer.Option(None, help="WordPiece vocab (default: bert-base-uncased's, shipped with vlprep)."),
    weights: Path = typer.Option(
        None,
        help=(
            "Detector weights for the extract stage (default: the committed shapes detector; another must be trained "
            "on the shapes world)."
        ),
    ),
    detector: str = typer.Option(
        "shapes-tiny",
        help="Detector config of --weights, by name (shapes-tiny: the committed detector's; or any name "
        "`vlprep extract --detector` lists) or a JSON path.",
    ),
    transfer: bool = typer.Option(
        True,
        "--transfer/--no-transfer",
        help=(
            "Fine-tune both models on the world's VQA, NLVR2, Flickr30k, RefCOCO+ and VCR, pretrained vs from scratch "
            "(--no-transfer: skip the stage)."
        ),
    ),
    transfer_seeds: int = typer.Option(
        1,
        help=(
            "Fine-tuning seeds per task and model (each adds a run from pretraining and one from scratch per task and "
            "model)."
        ),
    ),
    models: str = typer.Option(
        ",".join(MODELS),
        help="The model families to pretrain, evaluate and fine-tune, comma-separated: vilbert, lxmert or both.",
    ),
    jobs: int = typer.Option(
        None,
        help=(
            "Model families trained side by side, each in a process of its own with its share of the torch threads "
            "(default: one per family, up to the cores; 1: one after the other)."
        ),
    ),
) -> None:
    """The whole pipeline on the embedded shapes world, offline, on CPU: write a synthetic
    world and serve it on 127.0.0.1, `vlprep extract` through the real download path with the
    committed tiny shapes detector, `vlprep build-mixture` (captions + questions for LXMERT,
    captions alone for ViLBERT), `vltrain pretrain` of small ViLBERT and LXMERT from scratch,
    then zero-shot caption -> image retrieval on held-out scenes for the pretrained and the
    untrained models, and LXMERT's QA score; last, `vlprep build-task` and `vltrain finetune`
    of both models on the world's VQA, NLVR2, Flickr30k, RefCOCO+ and VCR, from their
    pretraining and from scratch with the same budget (--no-transfer skips it).

    Writes OUT/report.md and report.json (the numbers), OUT/scenes.png (detections) and the
    training curves; docs/demo.md shows a run and its timings. --models vilbert (or lxmert)
    runs one model family alone.

    Example:

        vlprep demo --quick --out vlprep_demo
    """
    stdout = Console()
    cfg = DemoConfig(
        out=out,
        quick=quick,
        seed=seed,
        n_images=n_images,
        steps=steps,
        vocab=vocab,
        weights=weights,
        detector=detector,
        transfer=transfer,
        transfer_seeds=transfer_seeds,
        models=tuple(m.strip() for m in models.split(",") if m.strip()),
        jobs=jobs,
    )
    report = run_demo(cfg, say=stdout.print)
    _show_report(stdout, out, report)


def _show_report(stdout: Console, out: Path, report: dict) -> None:
    """The report's tables on the terminal, where the report and pictures are, and the `vlprep serve` line."""
    from rich.markdown import Markdown

    stdout.print()
    stdout.print(Markdown((out / "report.md").read_text().split("![")[0]))
    stdout.print(
        f"report: {out / 'report.md'} ({report['total_seconds']:.0f} s); pictures: "
        + ", ".join(str(out / p) for p in report["pictures"].values())
    )
    stdout.print(  # its stores, task datasets, mixtures and runs on a local page (pip install 'vlprep[serve]')
        f"look at it all and ask the models in a browser: vlprep serve {out / 'features'} --tasks {out} "
        f"--runs {out} --images {out / 'world'}",
        soft_wrap=True,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Attach `vlprep demo` to the vlprep app (the ``vlprep.commands`` entry point)."""
    app.command("demo")(named_errors(demo))
