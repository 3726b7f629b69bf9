"""`vlprep import` / `vlprep export`: foreign feature files <-> a feature store, through the registry."""

from __future__ import annotations

import logging
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

from pipeline import __version__
from pipeline.config import Config
from pipeline.errors import ConfigError, InvalidRecordError
from pipeline.formats import FORMATS, unknown_format
from pipeline.formats.base import Description, FormatDataError, ReadOptions, Skipped, WriteContext, pickle_refusal
from pipeline.formats.options import EXPORT, IMPORT, FormatOptions
from pipeline.io import atomic_write_json, check_output, remove_path, replacing_output
from pipeline.store import FeatureStore, FeatureStoreWriter
from pipeline.store.index import INDEX_FILE
from pipeline.store.layout import BACKENDS, FLOAT_DTYPES, ProbStorage
from pipeline.store.manifest import MANIFEST_FILE, SHARDS_DIR

log = logging.getLogger(__name__)
IMPORT_REPORT = "import_report.json"
MAX_LISTED_SKIPS = 1000
CARD_FILE = "README.md"
# What an import writes when neither the command nor the sources say (`Format.layout`).
IMPORT_DEFAULTS = {"backend": "arrow", "dtype": "float16", "feature_dim": 2048, "cls_prob": "full", "attr_prob": "full"}

Progress = Optional[Callable[[int], None]]


@dataclass(frozen=True)
class ImportConfig(Config):
    fmt: str
    sources: tuple[Path, ...]
    dest: Path
    backend: Optional[str] = None  # None: what the sources state (`Format.layout`), else IMPORT_DEFAULTS
    shard_size: int = 1000
    dtype: Optional[str] = None
    feature_dim: Optional[int] = None
    cls_prob: Optional[str] = None
    attr_prob: Optional[str] = None
    allow_skips: bool = False
    trust_pickle: bool = False
    options: tuple[str, ...] = ()  # the format's options, KEY=VALUE (`pipeline.formats.options`)

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS or not FORMATS[self.fmt].importable:
            raise ConfigError(unknown_format(self.fmt, IMPORT))
        if not self.sources:
            raise ConfigError("give at least one source file or folder")
        missing = [str(s) for s in self.sources if not s.exists()]
        if missing:
            raise ConfigError(f"source not found: {', '.join(missing)}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.dtype is not None and self.dtype not in FLOAT_DTYPES:
            raise ConfigError(f"dtype must be one of {FLOAT_DTYPES}, got {self.dtype!r}")
        if self.feature_dim is not None and self.feature_dim < 1:
            raise ConfigError(f"--feature-dim must be positive, got {self.feature_dim}")
        for value in (self.cls_prob, self.attr_prob):
            if value is not None:
                ProbStorage.parse(value)
        if FORMATS[self.fmt].needs_pickle and not self.trust_pickle:
            raise pickle_refusal(self.fmt)
        self.format_options()  # an unknown or bad --option: refused before any work

    def format_options(self) -> FormatOptions:
        return FORMATS[self.fmt].parse_options(self.options, IMPORT)

    def read_options(self) -> ReadOptions:
        return ReadOptions(trust_pickle=self.trust_pickle, options=self.format_options())


@dataclass
class ImportReport(Config):
    rows_read: int = 0
    imported: int = 0
    already_present: int = 0
    skipped: int = 0
    skipped_by_kind: Counter = field(default_factory=Counter)
    skipped_rows: list[str] = field(default_factory=list)  # first MAX_LISTED_SKIPS, "location: kind: detail"

    def add_skip(self, skip: Skipped) -> None:
        self.skipped += 1
        self.skipped_by_kind[skip.kind] += 1
        if len(self.skipped_rows) < MAX_LISTED_SKIPS:
            self.skipped_rows.append(str(skip))
        log.warning("skipped %s", skip)


def store_settings(cfg: ImportConfig, stated: Mapping) -> dict:
    """The store an import writes: each setting the command gives, else the one the sources state
    (`Format.describe`), else `IMPORT_DEFAULTS`."""
    out = {}
    for name, default in IMPORT_DEFAULTS.items():
        given = getattr(cfg, name)
        out[name] = given if given is not None else stated.get(name, default)
    out["regions"] = stated.get("regions", FORMATS[cfg.fmt].regions)
    return out


def _vouched(skip: Skipped) -> FormatDataError:
    return FormatDataError(
        f"{skip}; the source's dataset card vouches for every row, so this is damage, not a row to skip: "
        "nothing imported"
    )


def _remove_new_store(dest: Path, existed: bool) -> None:
    """Remove what an import that created the store at `dest` wrote (a folder that was there
    before keeps everything else in it)."""
    if not existed:
        remove_path(dest)
        return
    for name in (MANIFEST_FILE, INDEX_FILE, SHARDS_DIR, IMPORT_REPORT):
        remove_path(dest / name)


def run_import(cfg: ImportConfig, progress: Progress = None) -> ImportReport:
    """Stream every row of the sources into the store at `cfg.dest` (resuming it if it
    exists: ids already there are skipped). Bad rows are skipped with their file:row
    and a reason (an id a source repeats: ``duplicate id``), and the good ones committed; the
    report is written to `<dest>/import_report.json`, under the store's write lock, once every
    imported row is committed.

    A source that is not of the format is a ConfigError, one damaged as a whole (a truncated
    shard, a card that disagrees with its data) a `FormatDataError`, before anything is written
    where the format can tell (`Format.describe`). A source whose card vouches for its rows
    (`Description.checked`) has no row to skip: a bad one (a non-finite number, an id twice) is a
    `FormatDataError` too, and a store this import created is removed again (nothing
    half-written; a store it appended to keeps its committed shards). Any other error (a full
    disk, a second writer) propagates: the shards committed so far stay, and a rerun resumes."""
    fmt = FORMATS[cfg.fmt]
    report = ImportReport()
    sources, opts = list(cfg.sources), cfg.read_options()
    described = fmt.describe(sources, opts) if fmt.describe else Description()
    settings = store_settings(cfg, described.layout)
    existed = cfg.dest.exists()
    created = not (cfg.dest / MANIFEST_FILE).exists()
    writer = FeatureStoreWriter(
        cfg.dest,
        backend=settings["backend"],
        shard_size=cfg.shard_size,
        resume=True,
        feature_dim=settings["feature_dim"],
        dtype=settings["dtype"],
        cls_prob=settings["cls_prob"],
        attr_prob=settings["attr_prob"],
        provenance={
            "producer": f"vlprep {__version__} import --from {cfg.fmt}",
            "source_format": cfg.fmt,
            **described.provenance,
        },
        config=cfg.to_json(),
        regions=settings["regions"],
    )
    seen: set[str] = set()  # the ids of this run's rows: a repeat is the source's damage, not a resume

    def skip(item: Skipped) -> None:
        if described.checked:
            raise _vouched(item)
        report.add_skip(item)

    try:
        with writer:
            for item in fmt.read(sources, opts):
                report.rows_read += 1
                if progress:
                    progress(1)
                if isinstance(item, Skipped):
                    skip(item)
                    continue
                image_id = item.record.image_id
                if image_id in seen:
                    skip(Skipped(item.location, "duplicate id", f"{image_id!r} came in an earlier row"))
                    continue
                try:
                    if writer.write(item.record):
                        report.imported += 1
                    else:
                        report.already_present += 1
                    seen.add(image_id)
                except InvalidRecordError as err:
                    skip(Skipped(item.location, "invalid record", str(err)))
            writer.commit_shard()
            atomic_write_json(cfg.dest / IMPORT_REPORT, {"config": cfg.to_json(), **report.to_json()})
    except FormatDataError:
        if created:
            _remove_new_store(cfg.dest, existed)
        raise
    return report


@dataclass(frozen=True)
class ExportConfig(Config):
    fmt: str
    store: Path
    dest: Path
    overwrite: bool = False
    options: tuple[str, ...] = ()  # the format's options, KEY=VALUE (`pipeline.formats.options`)

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS or not FORMATS[self.fmt].exportable:
            raise ConfigError(unknown_format(self.fmt, EXPORT))
        self.format_options()  # an unknown or bad --option: refused before any work
        if (self.dest.exists() or self.dest.is_symlink()) and not self.overwrite:
            raise ConfigError(f"{self.dest} exists; pass --overwrite to replace it")
        check_output(self.dest, **self.output_check())

    def format_options(self) -> FormatOptions:
        return FORMATS[self.fmt].parse_options(self.options, EXPORT)

    def output_check(self) -> dict:
        """How DEST is checked before it is written or replaced (pipeline.io.check_output):
        a file may replace a file; a folder only an earlier export to this format."""
        return dict(
            kind=f"{self.fmt} export",
            inputs=(self.store,),
            flag="DEST",
            what=f"vlprep export --to {self.fmt}",
            folder=None,
        )

    def command(self) -> str:
        """The command line of this export (the dataset card states it)."""
        options = [arg for pair in self.options for arg in ("--option", pair)]
        return shlex.join(["vlprep", "export", "--to", self.fmt, *options, str(self.store), str(self.dest)])


def run_export(cfg: ExportConfig, progress: Progress = None) -> int:
    """Write every record of the store to `cfg.dest` in the format, in storage order (float32,
    unless the format keeps the store's dtype: `Format.store_dtype`). Built under a temporary name
    and renamed when complete; an existing DEST (with --overwrite) is replaced only when it is a
    file or an earlier export to this format. A folder export also gets the store's dataset card
    (`README.md`, `pipeline.formats.card`) unless the format writes its own."""
    from pipeline.formats.card import RegionCounts, render_card

    fmt = FORMATS[cfg.fmt]
    store = FeatureStore.open(cfg.store, dtype=None if fmt.store_dtype else "float32")
    ctx = WriteContext(store.manifest, cfg.format_options(), store=cfg.store, command=cfg.command())
    try:
        if fmt.check is not None:
            fmt.check(store, ctx)  # what the format cannot hold: refused before anything is written
    except BaseException:
        store.close()
        raise
    for name in ("cls_prob", "attr_prob"):
        if store.layout.prob(name).mode == "topk":
            log.warning(
                "%s is stored as %s: exported tables hold those values and zeros elsewhere",
                name,
                store.layout.prob(name),
            )

    counts = RegionCounts()

    def records():
        for rec in store:
            counts.add(rec.num_boxes)
            if progress:
                progress(1)
            yield rec

    try:
        with replacing_output(cfg.dest, **cfg.output_check()) as tmp:
            count = fmt.write(records(), tmp, ctx)
            if fmt.card and tmp.is_dir() and not (tmp / CARD_FILE).exists():
                card = render_card(
                    store.manifest, name=cfg.store.resolve().name, export=cfg.fmt, command=ctx.command, counts=counts
                )
                (tmp / CARD_FILE).write_text(card, encoding="utf-8")
    finally:
        store.close()
    return count
