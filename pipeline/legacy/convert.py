"""`vlprep import` / `vlprep export`: legacy feature files <-> a feature store."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pipeline import __version__
from pipeline.config import Config
from pipeline.errors import ConfigError, InvalidRecordError
from pipeline.io import atomic_write_json, check_output, replacing_output
from pipeline.legacy import FORMATS
from pipeline.legacy.base import ReadOptions, Skipped, pickle_refusal
from pipeline.store import FeatureStore, FeatureStoreWriter
from pipeline.store.layout import BACKENDS, FLOAT_DTYPES, ProbStorage

log = logging.getLogger(__name__)
IMPORT_REPORT = "import_report.json"
MAX_LISTED_SKIPS = 1000

Progress = Optional[Callable[[int], None]]


@dataclass(frozen=True)
class ImportConfig(Config):
    fmt: str
    sources: tuple[Path, ...]
    dest: Path
    backend: str = "arrow"
    shard_size: int = 1000
    dtype: str = "float16"
    feature_dim: int = 2048
    cls_prob: str = "full"
    attr_prob: str = "full"
    allow_skips: bool = False
    trust_pickle: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS or FORMATS[self.fmt].read is None:
            importable = [n for n, f in FORMATS.items() if f.read]
            raise ConfigError(f"cannot import from {self.fmt!r}; known formats: {', '.join(importable)}")
        if not self.sources:
            raise ConfigError("give at least one source file or folder")
        missing = [str(s) for s in self.sources if not s.exists()]
        if missing:
            raise ConfigError(f"source not found: {', '.join(missing)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.dtype not in FLOAT_DTYPES:
            raise ConfigError(f"dtype must be one of {FLOAT_DTYPES}, got {self.dtype!r}")
        ProbStorage.parse(self.cls_prob), ProbStorage.parse(self.attr_prob)
        if FORMATS[self.fmt].needs_pickle and not self.trust_pickle:
            raise pickle_refusal(self.fmt)


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


def run_import(cfg: ImportConfig, progress: Progress = None) -> ImportReport:
    """Stream every row of the sources into the store at `cfg.dest` (resuming it if it
    exists: ids already there are skipped). Bad rows are skipped with their file:row
    and a reason, and the good ones committed; the report is written to
    `<dest>/import_report.json`, under the store's write lock, once every imported row is
    committed. Any other error (a full disk, a second writer) propagates: the shards
    committed so far stay, and a rerun resumes."""
    fmt = FORMATS[cfg.fmt]
    report = ImportReport()
    sources = fmt.provenance(list(cfg.sources)) if fmt.provenance else {}
    writer = FeatureStoreWriter(
        cfg.dest,
        backend=cfg.backend,
        shard_size=cfg.shard_size,
        resume=True,
        feature_dim=cfg.feature_dim,
        dtype=cfg.dtype,
        cls_prob=cfg.cls_prob,
        attr_prob=cfg.attr_prob,
        provenance={"producer": f"vlprep {__version__} import --from {cfg.fmt}", "source_format": cfg.fmt, **sources},
        config=cfg.to_json(),
        regions=fmt.regions,
    )
    with writer:
        for item in fmt.read(list(cfg.sources), ReadOptions(trust_pickle=cfg.trust_pickle)):
            report.rows_read += 1
            if progress:
                progress(1)
            if isinstance(item, Skipped):
                report.add_skip(item)
                continue
            try:
                if writer.write(item.record):
                    report.imported += 1
                else:
                    report.already_present += 1
            except InvalidRecordError as err:
                report.add_skip(Skipped(item.location, "invalid record", str(err)))
        writer.commit_shard()
        atomic_write_json(cfg.dest / IMPORT_REPORT, {"config": cfg.to_json(), **report.to_json()})
    return report


@dataclass(frozen=True)
class ExportConfig:
    fmt: str
    store: Path
    dest: Path
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS or FORMATS[self.fmt].write is None:
            exportable = [n for n, f in FORMATS.items() if f.write]
            raise ConfigError(f"cannot export to {self.fmt!r}; known formats: {', '.join(exportable)}")
        if (self.dest.exists() or self.dest.is_symlink()) and not self.overwrite:
            raise ConfigError(f"{self.dest} exists; pass --overwrite to replace it")
        check_output(self.dest, **self.output_check())

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


def run_export(cfg: ExportConfig, progress: Progress = None) -> int:
    """Write every record of the store to `cfg.dest` in the legacy format, float32, in
    storage order. Built under a temporary name and renamed when complete; an existing DEST
    (with --overwrite) is replaced only when it is a file or an earlier export to this format."""
    store = FeatureStore.open(cfg.store, dtype="float32")
    check = FORMATS[cfg.fmt].check
    if check is not None:
        try:
            check(store)  # what the format cannot hold: refused before anything is written
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

    def records():
        for rec in store:
            if progress:
                progress(1)
            yield rec

    try:
        with replacing_output(cfg.dest, **cfg.output_check()) as tmp:
            count = FORMATS[cfg.fmt].write(records(), tmp, store.manifest)
    finally:
        store.close()
    return count
