"""Adapters for the region-feature formats in use today (import and export).

The registry `FORMATS` maps a format name (the CLI's ``--from`` / ``--to``) to its reader
and writer. Field specs are in each module's docstring and in docs/store-format.md.
"""

from pipeline.legacy.base import LegacyFormat
from pipeline.legacy.grid_pth import check_grid, grid_provenance, read_grid_pth, write_grid_pth
from pipeline.legacy.mmf_npy import check_mmf_ids, read_mmf_npy, write_mmf_npy
from pipeline.legacy.tsv import (
    check_butd_fields,
    check_lxmert_fields,
    read_butd_tsv,
    read_lxmert_tsv,
    write_butd_tsv,
    write_lxmert_tsv,
)
from pipeline.legacy.vilbert_lmdb import check_vilbert_ids, read_vilbert_lmdb, write_vilbert_lmdb
from pipeline.legacy.vinvl_tsv import (
    check_oscar,
    check_vinvl,
    labels_provenance,
    read_oscar_tsv,
    read_vinvl_tsv,
    write_oscar_tsv,
    write_vinvl_tsv,
)

FORMATS: dict[str, LegacyFormat] = {
    f.name: f
    for f in (
        LegacyFormat(
            "lxmert-tsv",
            "LXMERT obj36 TSV: 10 fields, base64 int64/float32 arrays",
            read_lxmert_tsv,
            write_lxmert_tsv,
            check=check_lxmert_fields,
        ),
        LegacyFormat(
            "butd-tsv",
            "bottom-up-attention TSV: 6 fields, or 7 with cls_prob (ViLBERT)",
            read_butd_tsv,
            write_butd_tsv,
            check=check_butd_fields,
        ),
        LegacyFormat(
            "vilbert-lmdb",
            "ViLBERT/MMF LMDB of pickled dicts plus a 'keys' entry; export as "
            "vilbert-multi-task's convert_to_lmdb.py writes it",
            read_vilbert_lmdb,
            write_vilbert_lmdb,
            needs_pickle=True,
            check=check_vilbert_ids,
        ),
        LegacyFormat(
            "mmf-npy",
            "MMF folder of <id>.npy features and <id>_info.npy dicts",
            read_mmf_npy,
            write_mmf_npy,
            needs_pickle=True,
            check=check_mmf_ids,
        ),
        LegacyFormat(
            "vinvl-tsv",
            "VinVL predictions.tsv (objects: rect, class, conf, base64 feature, attributes) with its .lineidx, "
            "predictions.hw.tsv and label map",
            read_vinvl_tsv,
            write_vinvl_tsv,
            check=check_vinvl,
            provenance=labels_provenance,
        ),
        LegacyFormat(
            "oscar-tsv",
            "Oscar feature.tsv (num_boxes + base64 N x (D + 6)) and label.tsv, each with its .lineidx, and label map",
            read_oscar_tsv,
            write_oscar_tsv,
            check=check_oscar,
            provenance=labels_provenance,
        ),
        LegacyFormat(
            "grid-pth",
            "grid-feats-vqa per-image <id>.pth maps ([1, C, h, w]) with grid_sizes.json",
            read_grid_pth,
            write_grid_pth,
            check=check_grid,
            regions="grid",
            provenance=grid_provenance,
        ),
    )
}

__all__ = ["FORMATS", "LegacyFormat"]
