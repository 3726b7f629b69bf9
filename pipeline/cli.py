"""The `vlprep` command line: flags -> a config -> run(cfg). No logic lives here.

`download` and `extract` take their flags from their configs (`pipeline.cli_flags`): each
config field is one `Flag` in a group (`Flags`, one help panel per config section), and
the groups of the sections both commands have (shards and Ray, reader, fetching, images)
are declared once here and shared.

Plugins add commands: an installed package declares an entry point in the group
``vlprep.commands`` whose object is a `register(app)` function (the entry point's name is
the command's), and `main` attaches them all before it runs (`load_plugins`). `vlprep demo`
comes this way from `vl_models.demo`, so this package never imports `vl_models`; importing
this module attaches no plugin.

Commands import their stage's modules inside the function: `vlprep --help` and the light
commands start without loading torch, Ray or the store backends.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from pipeline import __version__
from pipeline.cli_flags import Flag, Flags, comma_list, config_command, or_none
from pipeline.datasets import READERS, ReaderOptions
from pipeline.detect.backends import config_names_by_backend
from pipeline.detect.config import POLICIES, PREPROCESS_MODES, BoxCount, ExtractConfig, GridPool, SelectionConfig
from pipeline.distribute import DistributeConfig
from pipeline.download.fetch import FetchConfig
from pipeline.download.run import DownloadConfig, run_download
from pipeline.errors import ConfigError, RunFailedError
from pipeline.formats import FORMATS, exportable, importable
from pipeline.images import ENCODE_FORMATS, RESAMPLE, ImageConfig
from pipeline.log import cli_app, named_errors
from pipeline.log import console as err_console
from pipeline.store.layout import BACKENDS, FLOAT_DTYPES

DETECTOR_NAMES = config_names_by_backend()  # every named config, by backend

app = cli_app(
    "vlprep",
    "Prepare vision-and-language pretraining data: image downloads, region-feature stores "
    "(Arrow IPC or LMDB shards with a manifest), conversion to and from other codebases' formats, and more.\n\n"
    "A feature store is a directory with manifest.json, index.arrow and shards/. "
    "See docs/store-format.md.",
)
stdout = Console()


@contextmanager
def _progress(description: str, total: Optional[int] = None) -> Iterator:
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(show_speed=True),
        TimeElapsedColumn(),
    ]
    if total is not None:
        columns.append(TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n=1: progress.advance(task, n)


@app.command()
@named_errors
def inspect(
    store: Path = typer.Argument(..., help="Feature store directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    card: bool = typer.Option(
        False,
        "--card",
        help="Print the store's dataset card instead (README.md with the YAML header the Hugging Face Hub reads, "
        "and the provenance: detector, weights sha256, preprocessing, box policy, counts, the command); "
        "vlprep export writes the same card into its folders.",
    ),
) -> None:
    """Summarize a feature store: counts, dims, dtypes, backend, bytes on disk and per
    image, provenance, and one sample record; or, with --card, print its dataset card. Exits 3
    naming the shard when one is missing or truncated (every shard's size is checked against the
    manifest)."""
    from pipeline.store import describe_store

    if card:
        from pipeline.formats.card import count_regions, render_card
        from pipeline.store import FeatureStore

        with FeatureStore.open(store) as fs:
            fs.check_shards()
            text = render_card(fs.manifest, name=store.resolve().name, counts=count_regions(fs))
        typer.echo(text, nl=False)
        return
    info = describe_store(store)
    if as_json:
        stdout.print_json(json.dumps(info))
        return
    table = Table(title=f"feature store {store}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("backend", info["backend"]),
        ("schema version", str(info["schema_version"])),
        ("records", f"{info['records']:,} in {info['shards']} shards"),
        ("dims", ", ".join(f"{k}={v}" for k, v in info["dims"].items() if v is not None)),
        ("dtypes", ", ".join(f"{k}={v}" for k, v in info["dtypes"].items())),
        ("probability storage", ", ".join(f"{k}={v}" for k, v in info["probability_storage"].items())),
        ("bytes on disk", f"{info['bytes_on_disk']:,}"),
        ("bytes per image", "-" if info["bytes_per_image"] is None else f"{info['bytes_per_image']:,.0f}"),
        ("provenance", json.dumps({k: v for k, v in info["provenance"].items() if k != "config"})),
        ("writing runs", str(info["runs"])),
        ("updated", info["updated"]),
    ]
    for key, value in rows:
        table.add_row(key, value)
    stdout.print(table)
    if info["sample"]:
        sample = Table(title="sample record", show_header=False, title_justify="left")
        sample.add_column(style="bold")
        sample.add_column()
        for key, value in info["sample"].items():
            sample.add_row(key, value if isinstance(value, str) else json.dumps(value))
        stdout.print(sample)


@app.command()
@named_errors
def verify(
    store: Path = typer.Argument(..., help="Feature store directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    sample: Optional[str] = typer.Option(
        None,
        help="Check only a random sample of records, for huge stores: a count (1000) or a fraction "
        "(0.01) of the records; the cheap checks (manifest, every shard's size, index size) still "
        "cover the whole store, sha256s are skipped.",
    ),
    seed: int = typer.Option(0, help="Seed of --sample's draw (the same seed checks the same records)."),
) -> None:
    """Check a store completely: every shard's size and sha256, its schema, every
    record's shapes, finiteness, boxes and probabilities, id uniqueness and the id
    index (or, with --sample, a seeded random subset of the records). Prints what it
    checked. Exits 1 naming each bad shard or record. Warnings (exit 0): an index that
    readers must rebuild, leftovers of a killed writer; the write lock file is neither."""
    from pipeline.store import verify_store
    from pipeline.store.manifest import Manifest
    from pipeline.store.verify import check_seed

    if sample is not None:
        check_seed(seed)  # before the store is read: an invocation error is exit 2
    total = Manifest.read(store).num_records
    count = None if sample is None else _sample_size(sample, total)
    with _progress("verifying", total if count is None else count) as advance:
        report = verify_store(store, on_record=advance, sample=count, seed=seed)
    if as_json:
        stdout.print_json(
            json.dumps(
                {
                    "ok": report.ok,
                    "records_checked": report.records_checked,
                    "shards_checked": report.shards_checked,
                    "checked": report.checked,
                    "problems": report.problems,
                    "warnings": report.warnings,
                }
            )
        )
    else:
        for line in report.checked:
            stdout.print(f"checked: {line}")
        for warning in report.warnings:
            stdout.print(f"[yellow]warning:[/yellow] {warning}")
        for problem in report.problems:
            stdout.print(f"[red]problem:[/red] {problem}")
        status = "[green]OK[/green]" if report.ok else f"[red]FAILED ({len(report.problems)} problems)[/red]"
        stdout.print(
            f"{status}: {report.records_checked:,} of {total:,} records and "
            f"{report.shards_checked} shards checked in {store}"
        )
    if not report.ok:
        raise typer.Exit(1)


def _sample_size(text: str, total: int) -> int:
    """--sample's record count: a positive integer, or a fraction in (0, 1] of `total` (at least 1)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if text.strip().isdigit() and int(text) > 0:
        return int(text)
    if 0 < value <= 1:
        return max(1, round(value * total))
    raise ConfigError(f"--sample must be a record count (e.g. 1000) or a fraction in (0, 1] (e.g. 0.01), got {text!r}")


def option_help(example: str) -> str:
    return (
        f"A format's option, KEY=VALUE (repeatable), e.g. {example}; `vlprep formats` lists each format's options, "
        "an unknown one is refused."
    )


@app.command("import")
@named_errors
def import_(
    paths: List[Path] = typer.Argument(
        ..., metavar="SRC... DEST", help="Source files/folders, then the store to write."
    ),
    fmt: str = typer.Option(..., "--from", help=f"Source format: {', '.join(importable())} (vlprep formats)."),
    backend: Optional[str] = typer.Option(
        None, help="Store backend: arrow (memory-mapped IPC files) or lmdb (default: the source's card's, else arrow)."
    ),
    shard_size: int = typer.Option(1000, help="Records per shard."),
    dtype: Optional[str] = typer.Option(
        None,
        help="Stored dtype of features and probability tables: float16 or float32 (default: what the source says, "
        "as an hf-dataset or webdataset export does; else float16).",
    ),
    feature_dim: Optional[int] = typer.Option(
        None, help="Region feature width the store holds (default: what the source says, else 2048)."
    ),
    cls_prob: Optional[str] = typer.Option(
        None, help="How to keep cls_prob: full, topk:K or none (default: the source's card's, else full)."
    ),
    attr_prob: Optional[str] = typer.Option(
        None, help="How to keep attr_prob: full, topk:K or none (default: the source's card's, else full)."
    ),
    allow_skips: bool = typer.Option(False, help="Exit 0 even if some rows were skipped."),
    trust_pickle: bool = typer.Option(
        False,
        help="Allow pickled inputs (vilbert-lmdb, mmf-npy, butd-npz's info); loaded through a restricted unpickler.",
    ),
    options: List[str] = typer.Option([], "--option", "-O", help=option_help("cls-background=last")),
) -> None:
    """Import another codebase's region-feature files into a store (streaming; resumes an
    existing store, skipping ids already in it).

    Every row is checked (field count, base64, array lengths against num_boxes, finite values,
    sizes and ids within int32, boxes inside the image, probabilities in [0,1]); bad rows, and an
    id a source repeats, are skipped and listed with file:row and reason in
    DEST/import_report.json, the good rows are committed, and the command exits 1 if any row was
    skipped unless --allow-skips. A source of the wrong schema exits 2, a damaged one (a truncated
    shard, a dataset card that disagrees with its data) exits 3, before anything is written where
    the format can tell. Another process writing DEST: exit 75 at once; disk full: exit 74, the
    committed shards are kept and a rerun resumes.

    vinvl-tsv reads a folder of predictions.tsv, predictions.hw.tsv (the image sizes) and the
    label map (labelmap.json); oscar-tsv one of feature.tsv, label.tsv and the label map;
    grid-pth one of `<id>.pth` maps and grid_sizes.json (store it with --feature-dim of the maps);
    hf-dataset and webdataset an export's folder (its card is checked against the data).

    Example: vlprep import --from lxmert-tsv train2014_obj36.tsv val2014_obj36.tsv coco_feats
    """
    from pipeline.formats.convert import ImportConfig, run_import

    if len(paths) < 2:
        raise ConfigError("give one or more sources followed by the destination store")
    cfg = ImportConfig(
        fmt=fmt,
        sources=tuple(paths[:-1]),
        dest=paths[-1],
        backend=backend,
        shard_size=shard_size,
        dtype=dtype,
        feature_dim=feature_dim,
        cls_prob=cls_prob,
        attr_prob=attr_prob,
        allow_skips=allow_skips,
        trust_pickle=trust_pickle,
        options=tuple(options),
    )
    with _progress(f"importing {fmt}") as advance:
        report = run_import(cfg, progress=advance)
    stdout.print(
        f"read {report.rows_read:,} rows: imported {report.imported:,}, already present {report.already_present:,}, "
        f"skipped {report.skipped:,} -> {cfg.dest}"
    )
    for kind, count in report.skipped_by_kind.most_common():
        stdout.print(f"  [yellow]skipped[/yellow] {count:,} x {kind}")
    for line in report.skipped_rows[:10]:
        stdout.print(f"    {line}")
    if report.skipped and not cfg.allow_skips:
        raise RunFailedError(
            f"{report.skipped} rows skipped (see {cfg.dest}/import_report.json); "
            "rerun with --allow-skips to accept that"
        )


@app.command("export")
@named_errors
def export(
    store: Path = typer.Argument(..., help="Feature store directory."),
    dest: Path = typer.Argument(
        ...,
        help="Output file ("
        + ", ".join(n for n, f in FORMATS.items() if f.exportable and f.output == "file")
        + ") or folder (the other formats).",
    ),
    fmt: str = typer.Option(..., "--to", help=f"Target format: {', '.join(exportable())} (vlprep formats)."),
    overwrite: bool = typer.Option(False, help="Replace DEST if it exists."),
    options: List[str] = typer.Option([], "--option", "-O", help=option_help("shard-bytes=200MB")),
) -> None:
    """Export a store to a format another codebase reads (the reference formats in float32, same
    field order and encoding as the original extractors; hf-dataset and webdataset keep the
    store's dtype). vilbert-lmdb is the LMDB that vilbert-multi-task's
    script/convert_to_lmdb.py writes. Image ids the format cannot hold (mmf-npy: ids whose files
    collide, such as `img` and `img_info`; vilbert-lmdb: an id `keys`) are refused with exit 2
    before anything is written. vinvl-tsv and oscar-tsv name classes, so they need a store
    extracted with --labelmap; grid-pth a grid store. A folder export gets the store's dataset
    card as README.md (vlprep inspect --card prints it).

    Example: vlprep export --to lxmert-tsv coco_feats val2014_obj36.tsv

    Example: vlprep export --to hf-dataset --option shard-bytes=200MB coco_feats coco_feats_hf
    """
    from pipeline.formats.convert import ExportConfig, run_export
    from pipeline.store.manifest import Manifest

    cfg = ExportConfig(fmt=fmt, store=store, dest=dest, overwrite=overwrite, options=tuple(options))
    with _progress(f"exporting {fmt}", Manifest.read(store).num_records) as advance:
        count = run_export(cfg, progress=advance)
    stdout.print(f"wrote {count:,} records to {dest} ({fmt})")


def _rate(value: float, unit: str = "") -> str:
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f} {prefix}{unit}"
    return f"{value:.1f} {unit}"


def _print_outcomes(summary: dict) -> None:
    """Failure counts per reason and malformed inputs; exit 1 (`RunFailedError`) when the
    summary's verdict is "failed" (shards failed for good, every item failed, or more than
    --max-failure-rate of them)."""
    for kind, count in list(summary["failures"].items())[:15]:
        stdout.print(f"  [yellow]failed[/yellow] {count:,} x {kind}")
    if summary.get("malformed_rows"):
        stdout.print(
            f"  [yellow]malformed input rows:[/yellow] {summary['malformed_rows']:,} "
            f"(e.g. {summary['malformed_examples'][0]})"
        )
    for shard, reason in summary["shards_failed"].items():
        err_console.print(f"[red]shard {shard} failed:[/red] {reason}")
    if summary["verdict"] != "ok":
        raise RunFailedError(summary["verdict_reason"])


DISTRIBUTE_FLAGS = Flags(
    DistributeConfig,
    "Shards and Ray",
    section="distribute",
    flags={
        "shard_size": "Items per shard (the unit of work, retry and resume).",
        "workers": "CPUs of the local Ray cluster (ignored with --ray-address).",
        "ray_address": "Join this Ray cluster instead of starting one (--out and every input path must be on storage "
        "every node sees).",
        "shard_retries": "Retries of a shard whose task failed, before it is reported.",
        "retry_failed": "Re-attempt the failed items of finished shards: transient failures, internal (and detector) "
        "errors, and refusals the changed options now allow (e.g. private address with "
        "--allow-private-network, too large with a larger --max-bytes).",
        "max_failure_rate": "Exit 1 when more than this fraction of the output's items failed (or all did).",
        "download_resource": "Custom Ray resource each download task takes one unit of: downloads run only on "
        "the nodes whose `ray start --resources` offer it (e.g. download, as the CPU nodes of "
        "workflows/cluster/ray-cluster.yaml do).",
        "capacity_timeout": "With --ray-address: seconds to wait while the cluster's live nodes lack the resources the "
        "run needs (a node was lost, or has not joined yet) before exiting 75, and how long a shard whose node or "
        "detector actor was lost waits for Ray to restart its work elsewhere before the loss counts as a failed "
        "attempt (a local cluster: at once); finished shards are kept: rerun the same command to resume.",
    },
)
READER_FLAGS = Flags(
    ReaderOptions,
    "Reader (--dataset)",
    section="reader",
    flags={
        "split": "Split name for the items (default: from the file names).",
        "url_col": "url_list: URL column.",
        "caption_col": Flag("url_list: caption column ('' for none).", parse=or_none),
        "id_col": "url_list: id column (default: FILE_STEM-ROW).",
        "images_root": "flickr30k: folder of the images.",
    },
)
FETCH_FLAGS = Flags(
    FetchConfig,
    "Fetching",
    section="fetch",
    flags={
        "threads": "Fetch threads inside each shard task: 16, as docs/benchmarks.md measured (they only wait on "
        "the network, and --per-host caps one host at 16 anyway).",
        "connect_timeout": "Seconds to connect.",
        "read_timeout": "Seconds without data before a read fails.",
        "deadline": "Seconds for a whole request, redirects included.",
        "max_bytes": "Largest download accepted (bytes); streamed and cut off beyond.",
        "max_redirects": "Redirects followed per request.",
        "retries": "Extra attempts for transient failures (timeouts, resets, 429, 5xx).",
        "backoff": "Seconds before the first retry of a request; doubles per attempt, with jitter.",
        "max_retry_wait": "Longest wait before a retry (Retry-After or backoff), in seconds.",
        "per_host": "Concurrent requests to one host, per worker process.",
        "user_agent_token": "Token added to the User-Agent (and honoured in X-Robots-Tag).",
        "disallowed_directives": Flag(
            "X-Robots-Tag directives that opt an image out, comma-separated ('' to ignore).",
            name="--opt-out-directives",
            parse=comma_list,
            show=",".join,
        ),
        "allow_private_network": "Allow URLs resolving to loopback/private/link-local addresses.",
        "allowed_networks": Flag(
            "A CIDR allowed even when private addresses are refused (repeatable).", name="--allow-network"
        ),
    },
)
IMAGE_FLAGS = Flags(
    ImageConfig,
    "Downloaded images",
    section="image",
    flags={
        "max_side": "Downscale so the longer side is at most this (0: keep size).",
        "min_side": "Drop images whose shorter side is below this.",
        "max_aspect_ratio": "Drop images more elongated than this (long/short; 0: off).",
        "max_pixels": "Refuse images with more pixels (checked before decoding).",
        "encode_format": Flag("Format of re-encoded images.", choices=ENCODE_FORMATS),
        "quality": "JPEG quality of re-encoded images (1-100).",
        "resample": Flag("Downscale filter (area: like OpenCV INTER_AREA).", choices=RESAMPLE),
    },
)


@app.command()
@named_errors
@config_command(
    DownloadConfig,
    Flags(
        DownloadConfig,
        "Input and output",
        flags={
            "dataset": Flag("Reader of the --input files (`vlprep datasets` describes them).", choices=READERS),
            "inputs": Flag("Input file or folder (repeatable).", name="--input"),
            "out": "Output folder of image shards (NNNNN.parquet + NNNNN_stats.json).",
        },
    ),
    DISTRIBUTE_FLAGS,
    READER_FLAGS,
    FETCH_FLAGS,
    IMAGE_FLAGS,
)
def download(cfg: DownloadConfig) -> None:
    """Download (or read) a dataset's images into resumable image shards, with Ray.

    Each shard of --shard-size items is one Ray task with --threads fetch threads.
    Every item ends up as a row: the stored image, or status "failed" with a named
    reason. Rerunning the same command skips complete shards; a killed run loses
    nothing; --retry-failed re-attempts transient failures and refusals that changed
    options now allow. A summary is printed and written to OUT/summary.json; the command
    exits 1 when more than --max-failure-rate of the folder's items failed (or all did),
    and 75 at once when another process is writing OUT.

    Example:

        vlprep download --dataset conceptual_captions --input Validation_GCC-1.1.0-Validation.tsv \\
            --out cc_val_images
    """
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[ok]}"),
        TextColumn("{task.fields[bw]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("downloading", total=None, rate="", ok="", bw="")

        def update(p) -> None:
            elapsed = max(time.time() - p.started, 1e-6)
            bar.update(
                task,
                total=p.total_items,
                completed=p.skipped_items + p.items,
                rate=f"{p.items / elapsed:.1f} items/s",
                ok=f"{100 * p.ok / p.items:.1f}% ok" if p.items else "",
                bw=f"{_rate(p.bytes / elapsed, 'B/s')}",
            )

        summary = run_download(cfg, on_progress=update)
    out_line = (
        f"{summary['successes']:,} of {summary['items_in_shards']:,} images stored "
        f"({100 * (summary['success_rate'] or 0):.1f}%) in {summary['shards_complete']} shards -> {cfg.out}"
    )
    stdout.print(out_line)
    _print_outcomes(summary)


@app.command()
@named_errors
@config_command(
    ExtractConfig,
    Flags(
        ExtractConfig,
        "Input and output",
        flags={
            "out": "Feature store to write (created or resumed).",
            "dataset": Flag("Reader of --input files (download and extract in one job).", choices=READERS),
            "inputs": Flag("Input file or folder for --dataset (repeatable).", name="--input"),
            "images": (
                "Extract from image shards, an image folder or img2dataset output (files, webdataset or parquet)."
            ),
            "keep_images": "Also write the downloaded images as image shards here.",
        },
    ),
    Flags(
        ExtractConfig,
        "Detector",
        flags={
            "weights": (
                "Detector weights as published: BUTD's detectron2 .pkl or HF pytorch_model.bin (butd-c4), "
                "VinVL's vinvl_vg_x152c4.pth (vinvl-x152c4), grid-feats-vqa's X-152.pth / X-101.pth / R-50.pth (grid)."
            ),
            "random_weights": "Use an untrained detector (smoke runs; stamped into provenance).",
            "seed": "Seed of the untrained detector of --random-weights.",
            "detector": Flag(f"Detector config, by name or a JSON path: {DETECTOR_NAMES}."),
            "preprocess": Flag(
                "Resize convention (default: the detector's own): caffe (BUTD: float image, cv2-style bilinear, "
                "one scale), detectron2 (py-bottom-up-attention, grid-feats-vqa: uint8 image, PIL bilinear, "
                "per-axis box scales) or maskrcnn (VinVL: maskrcnn-benchmark's resize).",
                choices=PREPROCESS_MODES,
                default=None,
            ),
            "labelmap": "vinvl-x152c4: its label map (VG-SGG-dicts-vgoi6-clipped.json), recorded with the store.",
            "grid_pool": Flag(
                "grid-*: average-pool each image's map to ROWSxCOLS cells (e.g. 8x8; default: every cell).",
                parse=GridPool.parse,
            ),
            "batch_size": "Images per detector call (results do not depend on it).",
            "device": "auto (cuda when the Ray cluster has GPUs), cpu, cuda or cuda:N.",
            "fp16": "float16 autocast on CUDA.",
            "actors": "Detector actors (default: one per GPU, or 1 on CPU).",
            "actor_cpus": "CPUs each CPU detector actor reserves on its node (a GPU actor reserves one GPU instead).",
        },
    ),
    Flags(
        SelectionConfig,
        "Regions",
        section="selection",
        flags={
            "boxes": Flag(
                "Regions per image: K (e.g. 36) or MIN-MAX (default 10-100, BUTD's and VinVL's).", parse=BoxCount.parse
            ),
            "policy": Flag(
                "Region selection (default: the detector's own). butd-c4: butd (Caffe reference) or maxnms "
                "(detectron2/HF ports); vinvl-x152c4: per-class (NMS_FILTER 1, the released features) or "
                "class-agnostic (NMS_FILTER 2).",
                choices=POLICIES,
            ),
            "conf_thresh": "Keep regions whose best class score reaches this (default 0.2).",
            "nms_thresh": "Per-class (or class-agnostic) NMS overlap threshold (default 0.3).",
            "regression": Flag(
                "vinvl-x152c4: keep the regressed boxes (--box-regression, as its demo and MMF) or the proposals "
                "(default, TEST.IGNORE_BOX_REGRESSION True as its feature extraction). butd-c4's policies fix this.",
                name="--box-regression/--no-box-regression",
            ),
        },
    ),
    Flags(
        ExtractConfig,
        "Regions",
        flags={
            "given_boxes": (
                "JSON/Arrow/Parquet of image_id -> boxes (original pixels): features for exactly those boxes."
            ),
        },
    ),
    Flags(
        ExtractConfig,
        "Store",
        flags={
            "backend": Flag("Store backend.", choices=BACKENDS),
            "dtype": Flag("Stored dtype of features and probability tables.", choices=FLOAT_DTYPES),
            "cls_prob": "How to keep cls_prob: full, topk:K or none.",
            "attr_prob": "How to keep attr_prob: full, topk:K or none.",
        },
    ),
    DISTRIBUTE_FLAGS,
    READER_FLAGS,
    FETCH_FLAGS,
    IMAGE_FLAGS,
)
def extract(cfg: ExtractConfig) -> None:
    """Extract image features into a feature store: bottom-up-attention regions (the default,
    --detector vg-r101), VinVL's regions (--detector vinvl-x152c4) or grid features (--detector
    grid-x152, grid-x101, grid-r50).

    With --dataset, images are downloaded and fed to the detector in one streaming Ray
    job (download tasks on CPUs, one detector actor per GPU or CPU actors); with
    --images, they are read from image shards, a folder or img2dataset output. Rerunning
    resumes: finished shards are skipped; --retry-failed re-attempts their failed images
    that may now succeed. Every failed image is listed with its reason in
    OUT/extract/NNNNN_stats.json; the summary is in OUT/extract_summary.json. Exits 1 when
    more than --max-failure-rate of the images failed (or all did).

    Example:

        vlprep extract --dataset conceptual_captions --input Validation_GCC-1.1.0-Validation.tsv \\
            --weights faster_rcnn_from_caffe_attr.pkl --boxes 36 --out cc_val_feats

        vlprep extract --images coco/val2014 --detector vinvl-x152c4 --weights vinvl_vg_x152c4.pth \
            --labelmap VG-SGG-dicts-vgoi6-clipped.json --out coco_val_vinvl

        vlprep extract --images coco/val2014 --detector grid-x152 --weights X-152.pth --grid-pool 8x8 \
            --out coco_val_grid
    """
    from pipeline.detect.run import run_extract  # here: it imports torch, which the other commands do not need

    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("extracting", total=None, info="")

        def update(p) -> None:
            rate = p.images / max(time.time() - p.started, 1e-6)
            bar.update(
                task,
                info=f"{p.images:,} images, {p.extracted:,} extracted, {rate:.2f} images/s, "
                f"{p.shards_done} shards done",
            )

        summary = run_extract(cfg, on_progress=update)
    stdout.print(
        f"{summary['extracted']:,} of {summary['images']:,} images have features in {cfg.out} "
        f"({summary['shards_done']} shards done)"
    )
    _print_outcomes(summary)


@app.command()
@named_errors
def show(
    store: Path = typer.Argument(..., help="Feature store directory."),
    image_id: str = typer.Argument(..., help="The image's id in the store."),
    image: Path = typer.Option(..., help="The image file the features were extracted from."),
    output: Path = typer.Option(..., "-o", "--output", help="PNG (or JPEG) file to write."),
    max_regions: int = typer.Option(36, help="Draw at most this many regions (most confident first)."),
    min_conf: float = typer.Option(0.0, help="Skip regions whose object confidence is below this."),
    objects_vocab: Optional[Path] = typer.Option(
        None, help="objects_vocab.txt: one object name per line (default: the store's label map, if it has one)."
    ),
    attributes_vocab: Optional[Path] = typer.Option(
        None, help="attributes_vocab.txt: one attribute name per line (default: the store's label map)."
    ),
) -> None:
    """Draw an image's stored regions with object and attribute labels and confidences."""
    from pipeline.detect.show import read_vocab, render
    from pipeline.store import FeatureStore

    if not image.is_file():
        raise ConfigError(f"image not found: {image}")
    with FeatureStore.open(store) as fs:
        try:
            rec = fs.get(image_id)
        except KeyError as err:
            raise ConfigError(str(err.args[0])) from err
        names = fs.manifest.provenance.get("labels") or {}  # a store extracted with --labelmap names its labels
        picture = render(
            rec,
            image.read_bytes(),
            max_regions,
            min_conf,
            read_vocab(objects_vocab) or names.get("objects"),
            read_vocab(attributes_vocab) or names.get("attributes"),
        )
    picture.save(output)
    stdout.print(f"wrote {output} ({min(max_regions, rec.num_boxes)} of {rec.num_boxes} regions)")


@app.command("build-mixture")
@named_errors
def build_mixture(
    spec: Path = typer.Option(..., help="Mixture spec (YAML), e.g. data_manifests/mixtures/lxmert.yaml."),
    out: Path = typer.Option(
        ...,
        help=(
            "Output folder (items.arrow, answers.json, manifest.json, report.md): new, empty, or an earlier mixture "
            "(replaced)."
        ),
    ),
    root: Optional[Path] = typer.Option(
        None, help="Folder the spec's relative file paths are under (overrides its root)."
    ),
    stores: List[Path] = typer.Option([], "--stores", help="Feature stores every image must be in (repeatable)."),
    drop_missing: bool = typer.Option(False, help="Leave out items whose image has no features, instead of failing."),
    top_k: Optional[int] = typer.Option(
        None,
        help=(
            "Answer table size: the K most frequent answers, or the first K entries of the spec's answers_from file "
            "(overrides answers.top_k)."
        ),
    ),
) -> None:
    """Build a pretraining mixture of (image, text[, answers]) items from captions and
    question-answer annotations in their official formats (or LXMERT's own json).

    Images are named once across sources (VG images also in COCO take their COCO name);
    held-out images (e.g. LXMERT's minival) form the val split and never reach train;
    answers are normalized as the VQA evaluation and LXMERT do, with the official VQA soft
    scores (0.3/0.6/0.9/1.0) and a top-K answer table or a given one (the spec's
    answers_from, e.g. LXMERT's all_ans.json). Same inputs and spec give byte-identical items. Annotations with a
    null or blank text, or a null answer, are skipped and counted (manifest.json, report.md).

    OUT is built under a temporary name beside it and swapped in when complete. An existing
    OUT is replaced only when it is an earlier mixture; a folder of other files, `.`, a folder
    above the current one, a symbolic link or a folder holding the spec or an input is
    refused (exit 2) before any work. A second build of the same OUT exits 75.

    Example:

        vlprep build-mixture --spec data_manifests/mixtures/lxmert.yaml --root /data --out lxmert_mix \\
            --stores coco_feats --stores vg_feats
    """
    from collections import Counter

    from pipeline.mixture.build import MixtureSpec
    from pipeline.mixture.build import build_mixture as run_build

    mixture = MixtureSpec.load(spec, root=root, top_k=top_k)
    with _progress("building mixture") as advance:
        manifest = run_build(mixture, out, tuple(stores), drop_missing, progress=advance)
    totals = ", ".join(f"{k} {v:,}" for k, v in manifest["totals"].items())
    stdout.print(f"mixture {manifest['name']!r} -> {out}: {totals}")
    skipped = sum((Counter(reasons) for reasons in manifest["skipped"].values()), Counter())
    if skipped:
        stdout.print("skipped " + ", ".join(f"{n:,} x {reason}" for reason, n in sorted(skipped.items())))
    stdout.print(
        f"answer table {manifest['answers']['table_size']:,} answers; best-answer coverage "
        f"{manifest['answers']['questions_best_answer_covered']}; report: {out / 'report.md'}"
    )


@app.command("make-shapes")
@named_errors
def make_shapes(
    out: Path = typer.Option(
        ...,
        help="Folder to write (created; an earlier shapes world there is replaced, a folder of other files refused).",
    ),
    n_images: int = typer.Option(..., help="Images in all, train and val together (at least 1)."),
    seed: int = typer.Option(0, help="Random seed: the same seed writes byte-identical files."),
    val_fraction: float = typer.Option(0.1, help="Fraction of the images in the val split, in [0, 1)."),
    base_url: str = typer.Option(
        "http://127.0.0.1:8000", help="URL the folder is served at; image URLs are BASE_URL/images/NAME."
    ),
    textures: bool = typer.Option(True, "--textures/--no-textures", help="Draw some shapes striped (else all plain)."),
) -> None:
    """Write the shapes world: a deterministic synthetic vision-and-language data set
    (1-6 coloured shapes per 256 px image) with true captions, VQA questions, referring
    expressions and NLVR2 statements, in the official formats our readers take.

    Written into OUT (image i of split s is `images/shapes_<s>_<i:08d>.jpg`, s = train | val):

    - `images/*.jpg`: the images (JPEG, quality 90)
    - `Train_GCC-training.tsv`, `Validation_GCC-1.1.0-Validation.tsv`: Conceptual Captions
      TSVs (one row per image, URL under --base-url)
    - `annotations/captions_{train,val}2014.json`: COCO captions (all captions of each image)
    - `annotations/v2_OpenEnded_mscoco_{train,val}2014_questions.json`,
      `v2_mscoco_{train,val}2014_annotations.json`: VQA v2 (10 answers each)
    - `image_map.tsv`: `COCO_<s>2014_<id>` to `cc3m-<s>-<i>`, the ids the CC extraction gives the images,
      then the NLVR2 image names `<split>-<p>-0-img0|1`
    - `annotations/refexp_{train,val}.json`: referring expressions with their target boxes
    - `annotations/nlvr2_{train,dev}.json`: NLVR2 statements about image pairs (JSON lines)
    - `annotations/dataset_flickr30k.json`: a Flickr30k retrieval split (Karpathy format,
      5 captions per image; val = test)
    - `annotations/refcoco+/refs(unc).p`, `instances.json`: RefCOCO+ refs and boxes
    - `annotations/vcr/{train,val}.jsonl`, `vcr/metadata/*.json`: VCR-format 4-choice questions
    - `vg/region_descriptions.json`, `vg/image_data.json`: Visual Genome files of the train split's
      images (per object a phrase, per object with a clearly placed neighbour a relation phrase,
      each with its region's box); `vg/image_map.tsv`: their VG ids to `cc3m-train-<i>`
    - `annotations/scenes_{train,val}.json`, `objects.txt`, `attributes.txt`: detector ground truth and vocabularies
    - `summary.json`: counts per split and text kind, written last (marks a complete world)

    Example: vlprep make-shapes --out shapes_world --n-images 2000 --seed 0
    """
    from pipeline.synthetic import write_world

    with _progress("drawing shapes", n_images) as advance:
        summary = write_world(
            out, n_images, seed, val_fraction=val_fraction, base_url=base_url, textures=textures, progress=advance
        )
    for split, counts in summary["splits"].items():
        stdout.print(
            f"{split}: {counts['images']:,} images, {counts['objects']:,} objects, {counts['captions']:,} "
            f"captions, {counts['questions']:,} questions, {counts['refexps']:,} referring expressions, "
            f"{counts['nlvr2_statements']:,} NLVR2 statements"
        )
    stdout.print(f"shapes world (seed {seed}) -> {out}")


@app.command()
def datasets() -> None:
    """List the dataset readers `vlprep download --dataset` accepts."""
    table = Table("dataset", "description")
    for reader in READERS.values():
        table.add_row(reader.name, reader.summary)
    stdout.print(table)


@app.command()
def formats() -> None:
    """List the foreign feature formats import/export understand, with what an export writes
    (a file or a folder) and each format's options (--option KEY=VALUE)."""
    table = Table("format", "import", "export", "writes", "options", "description")
    for f in FORMATS.values():
        imported = ("yes (--trust-pickle)" if f.needs_pickle else "yes") if f.importable else "-"
        options = "\n".join(spec.describe() for spec in f.options.specs()) or "-"
        cells = (f.name, imported, "yes" if f.exportable else "-", f.output, options, f.summary)
        table.add_row(*map(escape, cells))  # option help holds brackets: text, not markup
    stdout.print(table)


@app.command()
def version() -> None:
    """Print the vlprep version."""
    stdout.print(f"vlprep {__version__}")


PLUGIN_GROUP = "vlprep.commands"


def load_plugins(target: typer.Typer = app) -> None:
    """Attach the commands of installed plugins: each entry point of the group `PLUGIN_GROUP`
    names a `register(app)` function, and its name is the command's. A command already
    attached is left alone (a second call changes nothing)."""
    attached = {c.name or c.callback.__name__.replace("_", "-") for c in target.registered_commands}
    for entry in entry_points(group=PLUGIN_GROUP):
        if entry.name not in attached:
            entry.load()(target)


def main() -> None:
    load_plugins()
    app()


if __name__ == "__main__":
    main()
