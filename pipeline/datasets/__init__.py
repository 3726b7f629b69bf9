"""Dataset readers: the image lists `vlprep download` / `extract` fetch; one module per
source, a registry by name.

Each reader streams its files into `pipeline.download.source_item.SourceItem`s (an image to fetch:
stable id, URL or local path, its texts) and reports rows it cannot read as `Malformed`
(file and line or position). Official formats that other stages read too (COCO captions,
VG image_data, the CC TSV) are parsed by `pipeline.sources`, the readers here only turn
those records into items; all follow `pipeline.sources.base`'s rules. The sources are
described in data_manifests/datasets/<name>.yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from pipeline.datasets import coco, conceptual_captions, flickr30k, folder, nlvr2, url_list, visual_genome
from pipeline.datasets.base import DatasetReader, Malformed, ReaderOptions, ReaderResult
from pipeline.errors import ConfigError
from pipeline.sources.base import named_read_errors

READERS: dict[str, DatasetReader] = {
    r.name: r
    for r in (
        DatasetReader(
            conceptual_captions.NAME, "Conceptual Captions TSV (caption, url), no header", conceptual_captions.read
        ),
        DatasetReader(
            url_list.NAME, "generic tsv/csv/jsonl/txt/parquet URL list with url/caption/id columns", url_list.read
        ),
        DatasetReader(coco.NAME, "MS COCO captions_*.json", coco.read),
        DatasetReader(visual_genome.NAME, "Visual Genome image_data.json", visual_genome.read),
        DatasetReader(nlvr2.NAME, "NLVR2 JSON lines with left_url/right_url", nlvr2.read),
        DatasetReader(flickr30k.NAME, "Flickr30k results_20130124.token + local image folder", flickr30k.read),
        DatasetReader(folder.NAME, "plain local folders of images", folder.read),
    )
}


def check_inputs(inputs: Sequence[Path]) -> None:
    """A ConfigError, before any work, unless there is an input and every input exists."""
    if not inputs:
        raise ConfigError("give at least one --input")
    missing = [str(p) for p in inputs if not Path(p).exists()]
    if missing:
        raise ConfigError(f"input not found: {', '.join(missing)}")


def read_items(dataset: str, inputs: Sequence[Path], opts: ReaderOptions = ReaderOptions()) -> Iterator[ReaderResult]:
    """Stream the items of `inputs` with the reader named `dataset`."""
    if dataset not in READERS:
        raise ConfigError(f"unknown dataset {dataset!r}; known: {', '.join(READERS)}")
    check_inputs(inputs)
    paths = [Path(p) for p in inputs]
    names = ", ".join(str(p) for p in paths)
    return named_read_errors(READERS[dataset].read(paths, opts), f"{dataset} input {names}")


__all__ = ["READERS", "DatasetReader", "Malformed", "ReaderOptions", "read_items"]
