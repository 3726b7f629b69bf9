"""The formats seam: every format of the registry round-trips exactly (parametrized over the
registry, on the shapes world's store and a VG-sized one; grid formats on a grid store), its
options are typed and checked, and help texts, `vlprep formats` and the docs' tables follow from
the registry."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from format_stores import grid_store, shapes_records, shapes_store, vg_sized_store
from helpers import REPO, run_cli

from pipeline.errors import ConfigError
from pipeline.formats import BASE_FIELDS, FORMATS, docs_tables, exportable, importable
from pipeline.formats.convert import ExportConfig, ImportConfig, run_export, run_import
from pipeline.formats.options import EXPORT, IMPORT, byte_size
from pipeline.records import OPTIONAL_ARRAYS
from pipeline.store import FeatureStore

ROUND_TRIPS = [
    (name, kind)
    for name, f in FORMATS.items()
    if f.importable and f.exportable
    for kind in (("grid",) if f.needs == "grid" else ("shapes", "vg"))
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("format-stores")
    shapes_store(root / "shapes", shapes_records())
    vg_sized_store(root / "vg")
    grid_store(root / "grid")
    return {kind: root / kind for kind in ("shapes", "vg", "grid")}


def export(fmt: str, store: Path, dest: Path, *options: str) -> int:
    return run_export(ExportConfig(fmt, store, dest, options=options))


def import_(fmt: str, sources, dest: Path, **kw):
    kw.setdefault("trust_pickle", FORMATS[fmt].needs_pickle)
    return run_import(ImportConfig(fmt, tuple(sources), dest, **kw))


def assert_round_trip(original: FeatureStore, back: FeatureStore, kept: frozenset) -> None:
    """Every record of `original` is in `back`, the fields `kept` exactly, the others absent."""
    assert sorted(back.ids()) == sorted(original.ids())
    for rec in original:
        got = back.get(rec.image_id)
        assert (got.image_h, got.image_w) == (rec.image_h, rec.image_w), rec.image_id
        assert np.array_equal(got.boxes, rec.boxes) and got.boxes.dtype == np.float32, rec.image_id
        assert got.features.dtype == rec.features.dtype and np.array_equal(got.features, rec.features), rec.image_id
        for name in OPTIONAL_ARRAYS:
            if name in kept:
                assert np.array_equal(getattr(got, name), getattr(rec, name)), (rec.image_id, name)
            else:
                assert getattr(got, name) is None, (rec.image_id, name)


@pytest.mark.parametrize("name, kind", ROUND_TRIPS, ids=[f"{n}-{k}" for n, k in ROUND_TRIPS])
def test_every_format_round_trips_exactly(stores, tmp_path, name, kind):
    """Export then import gives back every record: the base fields and the fields the registry
    says the format keeps (`Format.round_trip`) bit for bit, no others."""
    fmt = FORMATS[name]
    original = FeatureStore.open(stores[kind])
    dest = tmp_path / "out"
    assert export(name, stores[kind], dest) == len(original)
    assert dest.is_file() if fmt.output == "file" else dest.is_dir()
    if fmt.output == "folder" and fmt.card:
        assert (dest / "README.md").read_text().startswith("---\n")  # the store's card travels with it
    report = import_(name, [dest], tmp_path / "back", dtype="float32", feature_dim=original.layout.feature_dim)
    assert (report.imported, report.skipped) == (len(original), 0)
    back = FeatureStore.open(tmp_path / "back")
    assert back.layout.regions == original.layout.regions
    assert_round_trip(original, back, BASE_FIELDS | fmt.round_trip)


def test_the_registry_describes_every_format():
    for f in FORMATS.values():
        assert f.name == f.name.lower() and " " not in f.name and f.summary
        assert f.output in ("file", "folder") and f.needs in ("", "labels", "grid")
        assert set(f.fields) >= BASE_FIELDS, f.name  # every format carries the base fields somehow
        assert f.round_trip <= set(OPTIONAL_ARRAYS) and set(f.fields) <= BASE_FIELDS | set(OPTIONAL_ARRAYS)
        for spec in f.options.specs():
            assert spec.help and spec.when in ("import", "export", "both") and re.fullmatch(r"[a-z0-9-]+", spec.key)


def test_the_docs_tables_follow_from_the_registry():
    """docs/store-format.md holds `pipeline.formats.docs_tables()` as it is now: a format added to
    the registry (or an option, or a field) fails here until the docs show it."""
    text = (REPO / "docs" / "store-format.md").read_text()
    begin, end = "<!-- formats tables: begin -->\n", "<!-- formats tables: end -->"
    assert begin in text and end in text
    held = text[text.index(begin) + len(begin) : text.index(end)]
    assert held.strip() == docs_tables().strip(), (
        "regenerate: python -c 'import pipeline.formats as f; print(f.docs_tables())'"
    )


def test_help_texts_and_vlprep_formats_name_every_format():
    imported = run_cli("import", "--help").stdout
    exported = run_cli("export", "--help").stdout
    listed = run_cli("formats", check=True).stdout
    for name in importable():
        assert name in imported and name in listed
    for name in exportable():
        assert name in exported
    for f in FORMATS.values():
        for spec in f.options.specs():
            assert spec.key in listed, (f.name, spec.key)


def test_options_are_typed_and_refused_by_name(stores, tmp_path):
    opts = FORMATS["mmf-npy"].parse_options(["cls-background=last"], IMPORT)
    assert opts.cls_background == "last"
    with pytest.raises(ConfigError, match="--option cls-background: 'middle' is not one of auto, first, last, absent"):
        FORMATS["mmf-npy"].parse_options(["cls-background=middle"], IMPORT)
    with pytest.raises(ConfigError, match="--option cls-background: no such option.*takes none"):
        FORMATS["mmf-npy"].parse_options(["cls-background=last"], EXPORT)  # an import option
    with pytest.raises(ConfigError, match="--option shard-bytes: no such option"):
        FORMATS["lxmert-tsv"].parse_options(["shard-bytes=1MB"], EXPORT)
    with pytest.raises(ConfigError, match="give KEY=VALUE"):
        FORMATS["mmf-npy"].parse_options(["last"], IMPORT)
    with pytest.raises(ConfigError, match="given twice"):
        FORMATS["mmf-npy"].parse_options(["cls-background=last", "cls_background=first"], IMPORT)
    assert (byte_size("500MB"), byte_size("64MiB"), byte_size("1000")) == (500 * 10**6, 64 << 20, 1000)
    for bad in ("-3", "12 parsecs", "MB", "0"):
        with pytest.raises(ValueError):
            byte_size(bad)
    # refused before any work, by the CLI too (exit 2)
    proc = run_cli("export", "--to", "mmf-npy", "--option", "nope=1", stores["vg"], tmp_path / "x")
    assert proc.returncode == 2 and "--option nope: no such option" in proc.stderr and not (tmp_path / "x").exists()


def test_the_class_table_option_moves_a_background_column(stores, tmp_path):
    """mmf-npy's cls_prob with the background last (detectron2's order) comes back with it first."""
    export("mmf-npy", stores["shapes"], tmp_path / "mmf")
    import_("mmf-npy", [tmp_path / "mmf"], tmp_path / "back", dtype="float32", feature_dim=384)
    import_("mmf-npy", [tmp_path / "mmf"], tmp_path / "moved", dtype="float32", feature_dim=384,
            options=("cls-background=last",))  # fmt: skip
    back, moved = FeatureStore.open(tmp_path / "back"), FeatureStore.open(tmp_path / "moved")
    for rec in back:
        table = moved.get(rec.image_id).cls_prob
        assert np.array_equal(table, np.concatenate([rec.cls_prob[:, -1:], rec.cls_prob[:, :-1]], axis=1))


def test_an_id_a_source_repeats_is_skipped_by_name(stores, tmp_path):
    export("lxmert-tsv", stores["shapes"], tmp_path / "a.tsv")
    lines = (tmp_path / "a.tsv").read_bytes().splitlines(keepends=True)
    (tmp_path / "twice.tsv").write_bytes(b"".join(lines + lines[:1]))
    report = import_("lxmert-tsv", [tmp_path / "twice.tsv"], tmp_path / "s", feature_dim=384)
    assert (report.imported, report.skipped, dict(report.skipped_by_kind)) == (len(lines), 1, {"duplicate id": 1})
    assert report.skipped_rows == [
        f"twice.tsv:{len(lines) + 1}: duplicate id: 'cc3m-val-00000000' came in an earlier row"
    ]
    # a rerun is a resume: the ids it already holds are present, not repeats
    again = import_("lxmert-tsv", [tmp_path / "a.tsv"], tmp_path / "s", feature_dim=384)
    assert (again.imported, again.already_present, again.skipped) == (0, len(lines), 0)


def test_an_unknown_format_names_the_known_ones(stores, tmp_path):
    with pytest.raises(ConfigError, match=r"cannot export to 'csv'; known formats: lxmert-tsv, .*vlprep formats"):
        ExportConfig("csv", stores["vg"], tmp_path / "x")
    with pytest.raises(ConfigError, match=r"cannot import from 'csv'; known formats: lxmert-tsv"):
        ImportConfig("csv", (stores["vg"],), tmp_path / "x")
