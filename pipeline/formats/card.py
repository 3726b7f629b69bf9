"""The dataset card: what a store (or an export of it) is, in the form the Hugging Face Hub reads.

One owner for every card the tool writes: ``vlprep inspect --card`` prints it for any store,
``vlprep export`` writes it as ``README.md`` into every folder export, and the hf-dataset export
adds its ``configs`` / ``dataset_info`` (`render_card`'s `metadata`). A card is

    ---
    <YAML the Hub reads: pretty_name, license, size_categories, tags, (configs, dataset_info)>
    vlprep: {card, format, schema_version, records, layout, identity, (files)}
    ---
    # <name>
    <the provenance a user needs to trust the features: detector and weights sha256,
     preprocessing, box policy (NMS mode, thresholds), counts, the command that made them>

The ``vlprep`` block is what an import checks against the data (`read_card`); the body is for
people. The license comes from the store's provenance, else from the dataset manifest
(data_manifests/datasets/<dataset>.yaml ``license``) of the dataset it was extracted from, else
``unknown``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import yaml

from pipeline.errors import ConfigError
from pipeline.formats.base import FormatDataError
from pipeline.store.manifest import IDENTITY_KEYS, Manifest

CARD_VERSION = 1
NATIVE = "vlprep-feature-store"
DATA_MANIFESTS = Path(__file__).resolve().parents[2] / "data_manifests" / "datasets"
# The Hub's size_categories values, by upper bound.
_SIZES = [
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
]


def size_category(records: int) -> str:
    for bound, name in _SIZES:
        if records < bound:
            return name
    return "n>1B"


@dataclass
class RegionCounts:
    """Regions per image of a store (gathered while an export reads it, or by `count_regions`)."""

    images: int = 0
    regions: int = 0
    least: Optional[int] = None
    most: Optional[int] = None

    def add(self, num_boxes: int) -> None:
        self.images += 1
        self.regions += num_boxes
        self.least = num_boxes if self.least is None else min(self.least, num_boxes)
        self.most = num_boxes if self.most is None else max(self.most, num_boxes)

    def describe(self) -> str:
        if not self.images:
            return "no images"
        mean = self.regions / self.images
        return f"{self.regions:,} regions: {self.least}–{self.most} per image (mean {mean:.1f})"


def count_regions(records: Iterable) -> RegionCounts:
    counts = RegionCounts()
    for rec in records:
        counts.add(rec.num_boxes)
    return counts


def _dataset_name(manifest: Manifest) -> Optional[str]:
    config = manifest.provenance.get("config") or {}
    dataset = config.get("dataset") if isinstance(config, dict) else None
    return dataset if isinstance(dataset, str) and dataset else None


def license_of(manifest: Manifest) -> str:
    """The license the card declares: the store's provenance ``license`` (a store imported from a
    card keeps it), else the dataset manifest's of the dataset it was extracted from, else unknown."""
    own = manifest.provenance.get("license")
    if isinstance(own, str) and own:
        return own
    dataset = _dataset_name(manifest)
    path = DATA_MANIFESTS / f"{dataset}.yaml" if dataset else None
    if path is not None and path.is_file():
        try:
            value = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("license")
        except (OSError, yaml.YAMLError, AttributeError):
            value = None
        if isinstance(value, str) and value:
            return value
    return "unknown"


def identity(manifest: Manifest) -> dict:
    return {key: manifest.provenance.get(key) for key in IDENTITY_KEYS}


def vlprep_block(manifest: Manifest, export: Optional[str]) -> dict:
    """The card's machine-readable part: what an import checks against the data."""
    return {
        "card": CARD_VERSION,
        "format": export or NATIVE,
        "schema_version": manifest.schema_version,
        "records": manifest.num_records,
        "layout": manifest.layout.to_json(),
        "identity": identity(manifest),
    }


def card_metadata(
    manifest: Manifest,
    *,
    name: str,
    export: Optional[str] = None,
    metadata: Optional[dict] = None,
    license: Optional[str] = None,
) -> dict:
    """The YAML header: the Hub's keys (and the exporter's `metadata`: configs, dataset_info), then
    the ``vlprep`` block."""
    detector = manifest.provenance.get("detector") or "unknown detector"
    tags = ["vlprep", "region-features", "image-features"]
    if manifest.layout.regions == "grid":
        tags.append("grid-features")
    meta: dict = {
        "pretty_name": f"{name}: {'grid' if manifest.layout.regions == 'grid' else 'region'} features ({detector})",
        "license": license or license_of(manifest),
        "size_categories": [size_category(manifest.num_records)],
        "tags": tags,
    }
    meta.update(metadata or {})
    meta["vlprep"] = {**vlprep_block(manifest, export), **(meta.get("vlprep") or {})}
    return meta


def _row(rows: list, key: str, value) -> None:
    if value is not None and value != "":
        text = value if isinstance(value, str) else json.dumps(value)
        rows.append(f"| {key} | {text.replace('|', '/')} |")


def _preprocessing(provenance: dict) -> Optional[str]:
    mode = provenance.get("preprocess")
    config = (provenance.get("extractor") or {}).get("config") or {}
    parts = [str(mode)] if mode else []
    if isinstance(config, dict):
        if config.get("min_size") and config.get("max_size"):
            parts.append(f"short side {config['min_size']}, long side at most {config['max_size']}")
        for key in ("pixel_mean", "pixel_means"):
            if config.get(key) is not None:
                parts.append(f"pixel mean {config[key]} (BGR)")
    return "; ".join(parts) or None


def _selection(provenance: dict) -> Optional[str]:
    config = provenance.get("config") or {}
    selection = config.get("selection") if isinstance(config, dict) else None
    if not isinstance(selection, dict):
        return None
    shown = {k: v for k, v in selection.items() if v is not None}
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or None


def card_body(
    manifest: Manifest,
    *,
    name: str,
    export: Optional[str] = None,
    command: str = "",
    counts: Optional[RegionCounts] = None,
    license: Optional[str] = None,
) -> str:
    """The card's text: what the features are and where they come from."""
    layout, prov = manifest.layout, manifest.provenance
    kind = "grid cells of a feature map" if layout.regions == "grid" else "detected regions"
    what = f"{manifest.num_records:,} images' features ({kind})"
    lines = [f"# {name}", "", f"{what}, made with vlprep."]
    if export and export != NATIVE:
        lines.append(f"This folder holds them in the `{export}` format (`vlprep formats` lists the formats).")
    lines += ["", "## Provenance", "", "| | |", "|---|---|"]
    rows: list = []
    _row(rows, "detector", prov.get("detector"))
    extractor = prov.get("extractor") or {}
    _row(rows, "extraction backend", extractor.get("backend") if isinstance(extractor, dict) else None)
    _row(rows, "weights sha256", prov.get("weights_sha256"))
    _row(rows, "weights file", prov.get("weights_file"))
    _row(rows, "weights layout", prov.get("weights_layout"))
    _row(rows, "preprocessing", _preprocessing(prov))
    _row(rows, "box policy (NMS mode, thresholds)", prov.get("box_policy"))
    _row(rows, "selection settings", _selection(prov))
    _row(rows, "most regions per image", prov.get("max_regions"))
    _row(rows, "fp16 inference", prov.get("fp16"))
    _row(rows, "device", prov.get("device"))
    _row(rows, "source format", prov.get("source_format"))
    _row(rows, "source producer", prov.get("source_producer"))
    labels = prov.get("labels")
    if isinstance(labels, dict) and labels.get("objects"):
        described = f"{len(labels['objects'])} object names, {len(labels.get('attributes') or [])} attribute names"
        _row(rows, "label names", described + (f" ({labels['file']})" if labels.get("file") else ""))
    _row(rows, "dataset", _dataset_name(manifest))
    _row(rows, "license", license or license_of(manifest))
    lines += rows or ["| provenance | not recorded |"]
    lines += ["", "## Contents", "", "| | |", "|---|---|"]
    rows = []
    _row(rows, "images", f"{manifest.num_records:,}")
    if counts is not None:
        _row(rows, "regions", counts.describe())
    _row(rows, "features", f"{layout.feature_dim}-d, stored {layout.dtype}")
    _row(rows, "boxes", "x1, y1, x2, y2 in original-image pixels (float32)")
    for table, dim, what in (
        ("cls_prob", layout.cls_dim, "background at column 0"),
        ("attr_prob", layout.attr_dim, "no-attribute at column 0"),
    ):
        storage = layout.prob(table)
        if storage.mode != "none" and dim is not None:
            _row(rows, table, f"{dim} columns, {what} (stored {storage})")
    _row(rows, "schema version", manifest.schema_version)
    _row(rows, "store written", manifest.updated)
    lines += rows
    producer = prov.get("producer")
    config = prov.get("config")
    lines += ["", "## How it was made", ""]
    if producer:
        lines.append(f"Made by `{producer}`" + (" with this configuration:" if config else "."))
        if config:
            lines += ["", "```json", json.dumps(config, indent=1, sort_keys=True), "```"]
    else:
        lines.append("The store records no producing command.")
    if command:
        lines += ["", f"Exported with `{command}`."]
    lines += [
        "",
        "The `vlprep` block of the header above is what `vlprep import` checks against the data;",
        "`docs/store-format.md` of vlprep describes the record and every format's fields.",
    ]
    return "\n".join(lines) + "\n"


def render_card(
    manifest: Manifest,
    *,
    name: str,
    export: Optional[str] = None,
    command: str = "",
    metadata: Optional[dict] = None,
    counts: Optional[RegionCounts] = None,
    license: Optional[str] = None,
) -> str:
    """The whole card: the YAML header between ``---`` lines, then the body (`license` overrides
    the store's)."""
    header = yaml.safe_dump(
        card_metadata(manifest, name=name, export=export, metadata=metadata, license=license),
        sort_keys=False,
        allow_unicode=True,
        width=1000,
    )
    body = card_body(manifest, name=name, export=export, command=command, counts=counts, license=license)
    return f"---\n{header}---\n\n{body}"


@dataclass(frozen=True)
class Card:
    metadata: dict
    body: str
    path: Path

    @property
    def vlprep(self) -> dict:
        block = self.metadata.get("vlprep")
        if not isinstance(block, dict):
            raise FormatDataError(f"{self.path}: the card's header has no vlprep block; it is not a vlprep card")
        return block


def read_card(path: Path) -> Card:
    """A card's YAML header and body; a `FormatDataError` naming the file when it has no
    readable header."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise FormatDataError(f"{path}: cannot read the dataset card ({err})") from None
    if not text.startswith("---\n"):
        raise FormatDataError(f"{path}: a dataset card starts with a YAML header between '---' lines")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise FormatDataError(f"{path}: the card's YAML header has no closing '---' line")
    try:
        metadata = yaml.safe_load(text[4:end])
    except yaml.YAMLError as err:
        raise FormatDataError(f"{path}: the card's YAML header is not readable: {err}") from None
    if not isinstance(metadata, dict):
        raise FormatDataError(f"{path}: the card's YAML header is not a mapping")
    return Card(metadata, text[end + 5 :], Path(path))


def disagreement(path: Path, what: str, card_value, data_value) -> FormatDataError:
    """The error for a card that says `card_value` of `what` where the data holds `data_value`."""
    return FormatDataError(
        f"{path}: the dataset card disagrees with the data: {what} is {card_value!r} in the card, "
        f"{data_value!r} in the data; nothing imported"
    )


def check_same(path: Path, what: str, card_value, data_value) -> None:
    if card_value != data_value:
        raise disagreement(path, what, card_value, data_value)


def imported_provenance(provenance: Optional[dict], license: Optional[str] = None) -> dict:
    """What a store imported from an export records of the exporting store's provenance: all of it
    but its command's config, its producer as ``source_producer``, and the card's license."""
    out = dict(provenance or {})
    producer = out.pop("producer", None)
    out.pop("config", None)
    if producer:
        out["source_producer"] = producer
    if isinstance(license, str) and license not in ("", "unknown"):
        out["license"] = license
    return out


def options_license(value: Optional[str]) -> Optional[str]:
    """A license option's value: an identifier of the Hub's list (e.g. cc-by-4.0), lower case."""
    if value is None:
        return None
    value = value.strip().lower()
    if not value or any(c.isspace() for c in value):
        raise ConfigError(f"--option license: {value!r} is not a license identifier (e.g. cc-by-4.0, other)")
    return value
