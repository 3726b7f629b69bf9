"""`vlprep serve`: attached to the vlprep command line through the ``vlprep.commands`` entry
point (pipeline never imports vl_models); the page is `vl_models.serve.app`'s. Importing this
module loads neither Starlette nor torch: `vlprep --help` stays light, and without the
``serve`` extra the command says what to install."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from pipeline.errors import ConfigError
from pipeline.log import named_errors

EXTRA = "pip install 'vlprep[serve]'"


def host_warning(host: str) -> Optional[str]:
    """The warning `vlprep serve` prints for a bind beyond this machine's loopback, else None."""
    from vl_models.serve.site import is_loopback

    if is_loopback(host):
        return None
    where = "every network interface" if host in ("0.0.0.0", "::", "") else host
    return (
        f"--host {host}: the page listens on {where}: anyone who can reach this machine can browse the "
        "stores, tasks and runs served and run the models, with no password; keep the default 127.0.0.1 "
        "unless the network is yours"
    )


def serve(
    stores: List[Path] = typer.Argument(None, help="Feature stores, or folders holding them (searched 3 levels down)."),
    tasks: List[Path] = typer.Option(
        [],
        "--tasks",
        help="Task datasets (vlprep build-task) and mixtures (vlprep build-mixture), or folders holding them "
        "(repeatable).",
    ),
    runs: List[Path] = typer.Option(
        [], "--runs", help="Runs of vltrain (pretraining or fine-tuning), or folders holding them (repeatable)."
    ),
    images: List[Path] = typer.Option(
        [],
        "--images",
        help="Where the images are (repeatable): a folder of image files, image shards of vlprep download, or "
        "the folder the store's dataset files name by URL path (the demo's world). No file outside these "
        "roots is ever served.",
    ),
    port: int = typer.Option(8000, help="TCP port to listen on (0: a free one, printed)."),
    host: str = typer.Option(
        "127.0.0.1", help="Address to listen on: this machine only by default (0.0.0.0 prints a warning)."
    ),
    device: str = typer.Option("cpu", help="Where the models answer: cpu, cuda or cuda:N."),
    objects_vocab: Optional[Path] = typer.Option(
        None, help="objects_vocab.txt: the object names (default: the store's label map, if it has one)."
    ),
    attributes_vocab: Optional[Path] = typer.Option(
        None, help="attributes_vocab.txt: the attribute names (default: the store's label map)."
    ),
) -> None:
    """A local web page to look at feature stores, task datasets, mixtures and runs, and to ask a
    run's model: a gallery of a store's images with their regions (filtered by object or
    attribute label, confidence, image id), an image's regions (box, labels, confidences, 5-d
    and 6-d positions; hover to highlight) and its captions, questions, answers and referring
    expressions in the tasks and mixtures, the store's dataset card; a run's curves, validation
    metrics, checkpoints and config; and "ask": a question, expression, statement, caption or
    text about a store's image or an uploaded one, answered as `vltrain predict` answers (the
    answers with their scores, the grounded box, a ranking).

    Pages read only what they show (a store of a million records pages as fast as a small
    one) and nothing is written. Listens on 127.0.0.1 unless --host says otherwise. Needs the
    serve extra (pip install 'vlprep[serve]').

    Example:

        vlprep serve vlprep_demo/features --tasks vlprep_demo --runs vlprep_demo --images vlprep_demo/world
    """
    try:
        import jinja2  # noqa: F401
        import python_multipart  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ConfigError(f"vlprep serve needs the serve extra ({err.name} is not installed): {EXTRA}") from None
    from vl_models.serve.app import listen, make_app, server_for, url_of
    from vl_models.serve.site import open_site

    console = Console(stderr=True)
    warning = host_warning(host)
    if warning:
        console.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: a TCP port is 0 to 65535")
    site = open_site(list(stores or []), list(tasks), list(runs), list(images), objects_vocab, attributes_vocab)
    app = make_app(site, device, host)
    try:
        sock = listen(host, port)
    except OSError as err:
        raise ConfigError(f"--host {host} --port {port}: cannot listen there ({err.strerror or err})") from None
    counts = (
        f"{len(site.stores)} store{'s' * (len(site.stores) != 1)}, "
        f"{len(site.items)} task dataset{'s' * (len(site.items) != 1)} and mixture{'s' * (len(site.items) != 1)}, "
        f"{len(site.runs)} run{'s' * (len(site.runs) != 1)}"
    )
    Console().print(f"serving {counts} at {url_of(sock)} (Ctrl-C stops)", soft_wrap=True, highlight=False)
    server_for(app, sock).run(sockets=[sock])


def register(app: typer.Typer) -> None:
    """Attach `vlprep serve` to the vlprep app (the ``vlprep.commands`` entry point)."""
    app.command("serve")(named_errors(serve))
