"""`vlprep import` / `vlprep export`: legacy feature files <-> a feature store."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pipeline import __version__
from pipeline.errors import ConfigError, InvalidRecordError
from pipeline.io import atomic_write_json, commit_path, remove_path, tmp_path_for
from pipeline.legacy import FORMATS
from pipeline.legacy.base import ReadOptions, Skipped, pickle_refusal
from pipeline.store import FeatureStore, FeatureStoreWriter
from pipeline.store.layout import BACKENDS, FLOAT_DTYPES, ProbStorage

log = logging.getLogger(__name__)
IMPORT_REPORT = "import_report.json"
MAX_LISTED_SKIPS = 1000

Progress = Optional[Callable[[int], None]]


@dataclass(frozen=True)
class ImportConfig:
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

    def to_json(self) -> dict:
        out = asdict(self)
        out["sources"] = [str(s) for s in self.sources]
        out["dest"] = str(self.dest)
        return out


@dataclass
class ImportReport:
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

    def to_json(self) -> dict:
        out = asdict(self)
        out["skipped_by_kind"] = dict(self.skipped_by_kind)
        return out


def run_import(cfg: ImportConfig, progress: Progress = None) -> ImportReport:
    """Stream every row of the sources into the store at `cfg.dest` (resuming it if it
    exists: ids already there are skipped). Bad rows are skipped with a reason; the
    report is written to `<dest>/import_report.json`."""
    fmt = FORMATS[cfg.fmt]
    report = ImportReport()
    writer = FeatureStoreWriter(
        cfg.dest, backend=cfg.backend, shard_size=cfg.shard_size, resume=True,
        feature_dim=cfg.feature_dim, dtype=cfg.dtype, cls_prob=cfg.cls_prob, attr_prob=cfg.attr_prob,
        provenance={"producer": f"vlprep {__version__} import --from {cfg.fmt}", "source_format": cfg.fmt},
        config=cfg.to_json(),
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
                if writer.write(item):
                    report.imported += 1
                else:
                    report.already_present += 1
            except InvalidRecordError as err:
                report.add_skip(Skipped(f"image {err.image_id!r}", "invalid record", f"{err.field}: {err.reason}"))
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
        if self.dest.exists() and not self.overwrite:
            raise ConfigError(f"{self.dest} exists; pass --overwrite to replace it")


def run_export(cfg: ExportConfig, progress: Progress = None) -> int:
    """Write every record of the store to `cfg.dest` in the legacy format, float32, in
    storage order. Built under a temporary name and renamed when complete."""
    store = FeatureStore.open(cfg.store, dtype="float32")
    for name in ("cls_prob", "attr_prob"):
        if store.layout.prob(name).mode == "topk":
            log.warning("%s is stored as %s: exported tables hold those values and zeros elsewhere", name, store.layout.prob(name))

    def records():
        for rec in store:
            if progress:
                progress(1)
            yield rec

    tmp = tmp_path_for(cfg.dest)
    try:
        count = FORMATS[cfg.fmt].write(records(), tmp, store.layout)
        commit_path(tmp, cfg.dest)
    finally:
        remove_path(tmp)
        store.close()
    return count
