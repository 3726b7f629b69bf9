"""Every foreign region-feature format (import and export), one module each, one registry.

`FORMATS` maps a format name (the CLI's ``--from`` / ``--to``) to its `Format`: reader, writer,
options (`pipeline.formats.options`), what an export writes, how it spells each record field,
which fields survive a round trip. The CLI's help texts, ``vlprep formats``, the tables in
docs/store-format.md (`docs_tables`, checked by a test) and the round-trip test parametrized over
the registry all read it: adding a format is its module and its entry here.
"""

from __future__ import annotations

from pipeline.formats.base import BASE_FIELDS, ClassTableOptions, Format
from pipeline.formats.butd_npz import NPZ_FIELDS, NpzOptions, check_npz_ids, npz_describe, read_butd_npz, write_butd_npz
from pipeline.formats.grid_pth import check_grid, grid_described, read_grid_pth, write_grid_pth
from pipeline.formats.hf_dataset import (
    HF_FIELDS,
    HfOptions,
    hf_describe,
    read_hf_dataset,
    write_hf_dataset,
)
from pipeline.formats.m2_hdf5 import (
    M2_FIELDS,
    M2Options,
    check_m2,
    m2_describe,
    read_m2_hdf5,
    write_m2_hdf5,
)
from pipeline.formats.mmf_npy import check_mmf_ids, read_mmf_npy, write_mmf_npy
from pipeline.formats.options import FormatOptions
from pipeline.formats.tsv import (
    check_butd_fields,
    check_lxmert_fields,
    read_butd_tsv,
    read_lxmert_tsv,
    write_butd_tsv,
    write_lxmert_tsv,
)
from pipeline.formats.vilbert_lmdb import check_vilbert_ids, read_vilbert_lmdb, write_vilbert_lmdb
from pipeline.formats.vinvl_tsv import (
    check_oscar,
    check_vinvl,
    labels_described,
    read_oscar_tsv,
    read_vinvl_tsv,
    write_oscar_tsv,
    write_vinvl_tsv,
)
from pipeline.formats.wds import WDS_FIELDS, WdsOptions, read_wds, wds_describe, write_wds

LABELS = frozenset({"objects_id", "objects_conf", "attrs_id", "attrs_conf"})
OBJECTS = frozenset({"objects_id", "objects_conf"})
ATTRIBUTES = frozenset({"attrs_id", "attrs_conf"})
EVERY_FIELD = LABELS | {"cls_prob", "attr_prob"}
# The record fields, in the order the docs' field table lists them.
FIELD_ORDER = (
    "image_id",
    "image_h",
    "image_w",
    "boxes",
    "features",
    "objects_id",
    "objects_conf",
    "attrs_id",
    "attrs_conf",
    "cls_prob",
    "attr_prob",
)

_ENTRIES = [
    Format(
        "lxmert-tsv",
        "LXMERT obj36 TSV: 10 fields, base64 int64/float32 arrays",
        read_lxmert_tsv,
        write_lxmert_tsv,
        output="file",
        check=check_lxmert_fields,
        fields={
            "image_id": "img_id",
            "image_h": "img_h",
            "image_w": "img_w",
            "boxes": "boxes (+ num_boxes)",
            "features": "features",
            "objects_id": "objects_id (int64)",
            "objects_conf": "objects_conf",
            "attrs_id": "attrs_id (int64)",
            "attrs_conf": "attrs_conf",
        },
        round_trip=LABELS,
    ),
    Format(
        "butd-tsv",
        "bottom-up-attention TSV: 6 fields, or 7 with cls_prob (ViLBERT)",
        read_butd_tsv,
        write_butd_tsv,
        output="file",
        check=check_butd_fields,
        fields={
            "image_id": "image_id",
            "image_h": "image_h",
            "image_w": "image_w",
            "boxes": "boxes (+ num_boxes)",
            "features": "features",
            "objects_id": "(derived from cls_prob)",
            "objects_conf": "(derived from cls_prob)",
            "cls_prob": "cls_prob (7th field)",
        },
        round_trip=OBJECTS | {"cls_prob"},  # objects derived from cls_prob, as the fixtures' are
    ),
    Format(
        "vilbert-lmdb",
        "ViLBERT/MMF LMDB of pickled dicts plus a 'keys' entry; export as vilbert-multi-task's convert_to_lmdb.py "
        "writes it",
        read_vilbert_lmdb,
        write_vilbert_lmdb,
        needs_pickle=True,
        check=check_vilbert_ids,
        options=ClassTableOptions,
        fields={
            "image_id": "key / image_id",
            "image_h": "image_h (image_height)",
            "image_w": "image_w (image_width)",
            "boxes": "boxes (bbox)",
            "features": "features",
            "objects_id": "import: objects",
            "cls_prob": "import: cls_prob",
        },
    ),
    Format(
        "mmf-npy",
        "MMF folder of <id>.npy features and <id>_info.npy dicts",
        read_mmf_npy,
        write_mmf_npy,
        needs_pickle=True,
        check=check_mmf_ids,
        options=ClassTableOptions,
        fields={
            "image_id": "<id> (path) / image_id",
            "image_h": "image_height",
            "image_w": "image_width",
            "boxes": "bbox",
            "features": "<id>.npy",
            "objects_id": "objects",
            "objects_conf": "objects_conf",
            "attrs_id": "attrs_id",
            "attrs_conf": "attrs_conf",
            "cls_prob": "cls_prob",
            "attr_prob": "attr_prob",
        },
        round_trip=EVERY_FIELD,
    ),
    Format(
        "vinvl-tsv",
        "VinVL predictions.tsv (objects: rect, class, conf, base64 feature, attributes) with its .lineidx, "
        "predictions.hw.tsv and label map",
        read_vinvl_tsv,
        write_vinvl_tsv,
        check=check_vinvl,
        describe=labels_described,
        fields={
            "image_id": "key",
            "image_h": "predictions.hw.tsv height",
            "image_w": "predictions.hw.tsv width",
            "boxes": "rect",
            "features": "feature",
            "objects_id": "class (label map)",
            "objects_conf": "conf",
            "attrs_id": "attributes[0] (label map)",
            "attrs_conf": "attr_scores[0]",
        },
        round_trip=LABELS,
        needs="labels",
    ),
    Format(
        "oscar-tsv",
        "Oscar feature.tsv (num_boxes + base64 N x (D + 6)) and label.tsv, each with its .lineidx, and label map",
        read_oscar_tsv,
        write_oscar_tsv,
        check=check_oscar,
        describe=labels_described,
        fields={
            "image_id": "key",
            "image_h": "(from the position tails)",
            "image_w": "(from the position tails)",
            "boxes": "label.tsv rect",
            "features": "feature.tsv features[:, :D]",
            "objects_id": "label.tsv class (label map)",
            "objects_conf": "label.tsv conf",
        },
        round_trip=OBJECTS,
        needs="labels",
    ),
    Format(
        "grid-pth",
        "grid-feats-vqa per-image <id>.pth maps ([1, C, h, w]) with grid_sizes.json",
        read_grid_pth,
        write_grid_pth,
        check=check_grid,
        regions="grid",
        describe=grid_described,
        fields={
            "image_id": "<id> (path)",
            "image_h": "grid_sizes.json",
            "image_w": "grid_sizes.json",
            "boxes": "(the cells, from the sizes)",
            "features": "<id>.pth [1, C, h, w]",
        },
        needs="grid",
    ),
    Format(
        "hf-dataset",
        "Hugging Face dataset: Parquet shards (one row per image) and a dataset card (README.md) the Hub and "
        "datasets.load_dataset read",
        read_hf_dataset,
        write_hf_dataset,
        describe=hf_describe,
        options=HfOptions,
        fields=HF_FIELDS,
        round_trip=EVERY_FIELD,
        card=False,  # writes its own, with the Hub's configs and dataset_info
        store_dtype=True,
    ),
    Format(
        "webdataset",
        "WebDataset tar shards (one sample per image: .json metadata, .npy arrays, keys = safely encoded ids) "
        "and a dataset card",
        read_wds,
        write_wds,
        describe=wds_describe,
        options=WdsOptions,
        fields=WDS_FIELDS,
        round_trip=EVERY_FIELD,
        card=False,  # writes its own, with the Hub's configs
        store_dtype=True,
    ),
    Format(
        "m2-hdf5",
        "meshed-memory-transformer detections HDF5: <key>_features, <key>_boxes, <key>_cls_prob per image (needs h5py)",
        read_m2_hdf5,
        write_m2_hdf5,
        output="file",
        check=check_m2,
        describe=m2_describe,
        options=M2Options,
        fields=M2_FIELDS,
        round_trip=EVERY_FIELD,
    ),
    Format(
        "butd-npz",
        "bottom-up-attention.pytorch / OpenVQA / MCAN per-image <id>.npz (x, bbox, num_bbox, image_h, image_w)",
        read_butd_npz,
        write_butd_npz,
        check=check_npz_ids,
        describe=npz_describe,
        options=NpzOptions,
        fields=NPZ_FIELDS,
        round_trip=EVERY_FIELD,
    ),
]

FORMATS: dict[str, Format] = {f.name: f for f in _ENTRIES}


def importable() -> list[str]:
    return [name for name, f in FORMATS.items() if f.importable]


def exportable() -> list[str]:
    return [name for name, f in FORMATS.items() if f.exportable]


def unknown_format(name: str, direction: str) -> str:
    """The message for a format name `direction` ("import" / "export") does not know."""
    known = importable() if direction == "import" else exportable()
    verb = "import from" if direction == "import" else "export to"
    return f"cannot {verb} {name!r}; known formats: {', '.join(known)} (vlprep formats lists them)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "\\<")


def _spelling(text: str) -> str:
    """A field's spelling as code; a note (in parentheses) as text."""
    return "-" if not text else _cell(text) if text.startswith("(") else f"`{text.replace('|', '/')}`"


def docs_tables() -> str:
    """The tables of docs/store-format.md that follow from the registry: the formats, their
    options, and how each spells the record's fields. A test checks the docs hold them as they
    are now."""
    lines = [
        "| format | import | export | writes | options | what it is |",
        "|---|---|---|---|---|---|",
    ]
    for f in FORMATS.values():
        options = ", ".join(f"`{s.key}`" for s in f.options.specs()) or "-"
        imported = ("yes (`--trust-pickle`)" if f.needs_pickle else "yes") if f.importable else "-"
        exported = "yes" if f.exportable else "-"
        if f.needs == "grid":
            exported += " (grid stores)"
        elif f.needs == "labels":
            exported += " (stores with label names)"
        lines.append(f"| `{f.name}` | {imported} | {exported} | {f.output} | {options} | {_cell(f.summary)} |")
    lines += ["", "| format | option | default | on | what it sets |", "|---|---|---|---|---|"]
    for f in FORMATS.values():
        for spec in f.options.specs():
            default = f"`{spec.default}`" if spec.default else "-"
            choices = f" ({', '.join(f'`{c}`' for c in spec.choices)})" if spec.choices else ""
            lines.append(f"| `{f.name}` | `{spec.key}` | {default} | {spec.when} | {_cell(spec.help)}{choices} |")
    lines += ["", "| field | " + " | ".join(f"`{name}`" for name in FORMATS) + " |"]
    lines.append("|---" * (len(FORMATS) + 1) + "|")
    for name in FIELD_ORDER:
        cells = [_spelling(f.fields.get(name, "")) for f in FORMATS.values()]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    kept = [", ".join(sorted(f.round_trip)) if f.round_trip else "base fields" for f in FORMATS.values()]
    lines.append("| *a round trip keeps* | " + " | ".join(kept) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["BASE_FIELDS", "FORMATS", "Format", "FormatOptions", "docs_tables", "exportable", "importable"]
