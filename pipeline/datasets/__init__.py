"""Dataset readers: one module per source, a registry by name.

Each reader streams its files into `pipeline.records.SourceItem`s (stable id, URL or
local path, texts) and reports rows it cannot read as `Malformed` (file and line).
The sources are described in data_manifests/datasets/<name>.yaml.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa

from pipeline.datasets import coco, conceptual_captions, flickr30k, folder, nlvr2, url_list, visual_genome
from pipeline.datasets.base import DatasetReader, Malformed, ReaderOptions, ReaderResult
from pipeline.errors import ConfigError

READERS: dict[str, DatasetReader] = {
    r.name: r
    for r in (
        DatasetReader(conceptual_captions.NAME, "Conceptual Captions TSV (caption, url), no header", conceptual_captions.read),
        DatasetReader(url_list.NAME, "generic tsv/csv/jsonl/txt/parquet URL list with url/caption/id columns", url_list.read),
        DatasetReader(coco.NAME, "MS COCO captions_*.json", coco.read),
        DatasetReader(visual_genome.NAME, "Visual Genome image_data.json", visual_genome.read),
        DatasetReader(nlvr2.NAME, "NLVR2 JSON lines with left_url/right_url", nlvr2.read),
        DatasetReader(flickr30k.NAME, "Flickr30k results_20130124.token + local image folder", flickr30k.read),
        DatasetReader(folder.NAME, "plain local folders of images", folder.read),
    )
}


def read_items(dataset: str, inputs: Sequence[Path], opts: ReaderOptions = ReaderOptions()) -> Iterator[ReaderResult]:
    """Stream the items of `inputs` with the reader named `dataset`."""
    if dataset not in READERS:
        raise ConfigError(f"unknown dataset {dataset!r}; known: {', '.join(READERS)}")
    missing = [str(p) for p in inputs if not Path(p).exists()]
    if missing:
        raise ConfigError(f"input not found: {', '.join(missing)}")
    paths = [Path(p) for p in inputs]
    return _named_read_errors(READERS[dataset].read(paths, opts), dataset, paths)


def _named_read_errors(results: Iterator[ReaderResult], dataset: str, paths: list[Path]) -> Iterator[ReaderResult]:
    """The reader's results; an input that cannot be read at all (not gzip, truncated, not
    Parquet, an I/O error) becomes a ConfigError naming it instead of a traceback."""
    try:
        yield from results
    except (OSError, EOFError, zlib.error, pa.ArrowException) as err:
        names = ", ".join(str(p) for p in paths)
        raise ConfigError(f"{dataset} input {names}: cannot be read ({type(err).__name__}: {err})") from err


__all__ = ["READERS", "DatasetReader", "Malformed", "ReaderOptions", "read_items"]
