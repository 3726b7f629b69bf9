import json
import pickle
from pathlib import Path

import lmdb
import numpy as np
import pytest
from helpers import assert_same_record, make_records, run_cli
from legacy_files import (
    RunsCode,
    load_obj_tsv,
    read_butd_tsv,
    write_butd_tsv,
    write_lxmert_tsv,
    write_mmf_npy,
    write_vilbert_lmdb,
)

from pipeline.errors import ConfigError
from pipeline.formats.convert import ExportConfig, ImportConfig, run_export, run_import
from pipeline.store import FeatureStore, verify_store

D, C = 2048, 1601  # the published feature width and VG class count


@pytest.fixture(scope="module")
def records():
    recs = make_records(7, seed=11, feature_dim=D, cls_dim=C, attr_dim=401)
    return recs


def _import(fmt, sources, dest, **kw):
    cfg = ImportConfig(fmt=fmt, sources=tuple(Path(s) for s in sources), dest=Path(dest), **kw)
    return run_import(cfg)


def _stores_equal(a: Path, b: Path) -> None:
    sa, sb = FeatureStore.open(a), FeatureStore.open(b)
    assert list(sa.ids()) == list(sb.ids())
    for ra, rb in zip(sa, sb):
        assert_same_record(ra, rb, exact=True)


def _without(rec, *names):
    return rec.__class__(**{**rec.__dict__, **{n: None for n in names}})


def test_lxmert_tsv_import_export_reimport(tmp_path, records):
    src = tmp_path / "val2014_obj36.tsv"
    write_lxmert_tsv(src, records)
    report = _import("lxmert-tsv", [src], tmp_path / "a", dtype="float32")
    assert (report.rows_read, report.imported, report.skipped) == (7, 7, 0)
    store = FeatureStore.open(tmp_path / "a")
    for rec in records:
        assert_same_record(_without(rec, "cls_prob", "attr_prob"), store.get(rec.image_id), exact=True)

    run_export(ExportConfig("lxmert-tsv", tmp_path / "a", tmp_path / "out.tsv"))
    assert (tmp_path / "out.tsv").read_bytes() == src.read_bytes()  # same bytes as the extractor wrote
    loaded = load_obj_tsv(tmp_path / "out.tsv")  # LXMERT's own loader logic accepts it
    assert [i["img_id"] for i in loaded] == [r.image_id for r in records]
    np.testing.assert_array_equal(loaded[2]["features"], records[2].features)
    assert loaded[2]["objects_id"].dtype == np.int64

    _import("lxmert-tsv", [tmp_path / "out.tsv"], tmp_path / "b", dtype="float32")
    _stores_equal(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("with_cls", [False, True])
def test_butd_tsv_import_export_reimport(tmp_path, records, with_cls):
    src = tmp_path / "feats.tsv"
    write_butd_tsv(src, records, with_cls_prob=with_cls)
    cls_prob = "full" if with_cls else "none"
    assert _import("butd-tsv", [src], tmp_path / "a", dtype="float32", cls_prob=cls_prob).imported == 7
    got = FeatureStore.open(tmp_path / "a").get(records[1].image_id)
    np.testing.assert_array_equal(got.features, records[1].features)
    if with_cls:  # labels derived from cls_prob, background column 0 kept
        np.testing.assert_array_equal(got.cls_prob, records[1].cls_prob)
        np.testing.assert_array_equal(got.objects_id, records[1].objects_id)
    else:
        assert got.cls_prob is None and got.objects_id is None

    run_export(ExportConfig("butd-tsv", tmp_path / "a", tmp_path / "out.tsv"))
    assert (tmp_path / "out.tsv").read_bytes() == src.read_bytes()
    rows = read_butd_tsv(tmp_path / "out.tsv", with_cls)
    assert rows[0]["image_w"] == records[0].image_w and rows[0]["features"].shape == (records[0].num_boxes, D)
    _import("butd-tsv", [tmp_path / "out.tsv"], tmp_path / "b", dtype="float32", cls_prob=cls_prob)
    _stores_equal(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("style", ["multitask", "beta", "mmf"])
def test_vilbert_lmdb_import(tmp_path, records, style):
    src = tmp_path / "features.lmdb"
    write_vilbert_lmdb(src, records, style)
    with pytest.raises(ConfigError, match="--trust-pickle"):
        _import("vilbert-lmdb", [src], tmp_path / "a")
    report = _import("vilbert-lmdb", [src], tmp_path / "a", dtype="float32", trust_pickle=True)
    assert (report.imported, report.skipped) == (7, 0)
    store = FeatureStore.open(tmp_path / "a")
    assert list(store.ids()) == [r.image_id for r in records]  # the `keys` entry's order
    got, rec = store.get(records[3].image_id), records[3]
    np.testing.assert_array_equal(got.boxes, rec.boxes)
    np.testing.assert_array_equal(got.features, rec.features)
    if style == "multitask":
        assert got.cls_prob is None and got.objects_id is None  # convert_to_lmdb.py drops them
    elif style == "beta":
        np.testing.assert_array_equal(got.cls_prob, rec.cls_prob)
    else:  # 1600 columns without background: a zero background column is prepended
        np.testing.assert_array_equal(got.cls_prob[:, 1:], rec.cls_prob[:, 1:])
        assert (got.cls_prob[:, 0] == 0).all()
        np.testing.assert_array_equal(got.objects_id, rec.objects_id)


def test_mmf_npy_import_export_reimport(tmp_path, records):
    src = tmp_path / "mmf"
    write_mmf_npy(src, records)
    assert _import("mmf-npy", [src], tmp_path / "a", dtype="float32", trust_pickle=True).imported == 7
    got = FeatureStore.open(tmp_path / "a").get(records[0].image_id)
    np.testing.assert_array_equal(got.cls_prob[:, 1:], records[0].cls_prob[:, 1:])
    np.testing.assert_array_equal(got.objects_id, records[0].objects_id)

    run_export(ExportConfig("mmf-npy", tmp_path / "a", tmp_path / "out"))
    rid = records[4].image_id
    feats = np.load(tmp_path / "out" / f"{rid}.npy")  # as MMF's feature readers load them
    info = np.load(tmp_path / "out" / f"{rid}_info.npy", allow_pickle=True).item()
    np.testing.assert_array_equal(feats, records[4].features)
    assert info["num_boxes"] == records[4].num_boxes and info["image_width"] == records[4].image_w
    assert info["bbox"].shape == (records[4].num_boxes, 4) and info["cls_prob"].shape[1] == C
    _import("mmf-npy", [tmp_path / "out"], tmp_path / "b", dtype="float32", trust_pickle=True)
    _stores_equal(tmp_path / "a", tmp_path / "b")


def test_export_refuses_ids_that_escape_the_folder(tmp_path):
    from pipeline.store import write_records

    recs = make_records(1, seed=3, feature_dim=8)
    recs[0] = recs[0].__class__(**{**recs[0].__dict__, "image_id": "../escape"})
    write_records(tmp_path / "s", recs, feature_dim=8)
    with pytest.raises(ValueError, match="cannot be used as a file name"):
        run_export(ExportConfig("mmf-npy", tmp_path / "s", tmp_path / "out"))
    assert not (tmp_path / "escape.npy").exists() and not (tmp_path / "out").exists()


def _corrupt_tsv(tmp_path, records) -> Path:
    """Good rows around: truncated base64, wrong num_boxes, NaN features, bad field
    count, and a truncated last line."""
    src = tmp_path / "bad.tsv"
    write_lxmert_tsv(src, records)
    lines = src.read_bytes().split(b"\r\n")[:-1]
    fields = [line.split(b"\t") for line in lines]
    fields[1][9] = fields[1][9][:-3]  # base64 cut mid-quantum
    fields[2][7] = str(records[2].num_boxes + 1).encode()  # num_boxes disagrees with the arrays
    nan = records[3].features.copy()
    nan[0, 0] = np.nan
    import base64

    fields[3][9] = base64.b64encode(nan.astype(np.float32).tobytes())
    fields[4] = fields[4][:8]
    out = b"".join(b"\t".join(f) + b"\r\n" for f in fields)
    out = out[: len(out) - 1000]  # the crash mid-append: last line truncated, no newline
    src.write_bytes(out)
    return src


def test_corrupt_rows_are_skipped_with_reasons(tmp_path, records):
    src = _corrupt_tsv(tmp_path, records)
    report = _import("lxmert-tsv", [src], tmp_path / "s")
    assert report.rows_read == 7 and report.imported == 2  # rows 0 and 5
    assert dict(report.skipped_by_kind) == {
        "bad base64": 1,
        "num_boxes mismatch": 1,
        "invalid record": 1,
        "wrong field count": 1,
        "truncated last line": 1,
    }
    assert any("bad.tsv:2" in r for r in report.skipped_rows)
    assert any("features" in r and "NaN" in r for r in report.skipped_rows)
    assert list(FeatureStore.open(tmp_path / "s").ids()) == [records[0].image_id, records[5].image_id]
    saved = json.loads((tmp_path / "s" / "import_report.json").read_text())
    assert saved["skipped"] == 5 and saved["config"]["fmt"] == "lxmert-tsv"


def test_cli_import_exit_codes_and_resume(tmp_path, records):
    src = _corrupt_tsv(tmp_path, records)
    proc = run_cli("import", "--from", "lxmert-tsv", src, tmp_path / "s")
    assert proc.returncode == 1
    assert "5 rows skipped" in proc.stderr and "truncated last line" in proc.stdout
    proc = run_cli("import", "--from", "lxmert-tsv", "--allow-skips", src, tmp_path / "s")
    assert proc.returncode == 0 and "already present 2" in proc.stdout  # resumed, nothing duplicated
    assert len(FeatureStore.open(tmp_path / "s")) == 2
    proc = run_cli("import", "--from", "mmf-npy", tmp_path, tmp_path / "t")
    assert proc.returncode == 2 and "--trust-pickle" in proc.stderr
    proc = run_cli("import", "--from", "nope", src, tmp_path / "t")
    assert proc.returncode == 2 and "known formats" in proc.stderr


def test_pickle_that_runs_code_is_refused(tmp_path, records):
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.lmdb"
    write_vilbert_lmdb(src, records[:2], "multitask")
    env = lmdb.open(str(src), map_size=1 << 28)
    with env.begin(write=True) as txn:
        txn.put(b"evil", pickle.dumps({"image_id": "evil", "features": RunsCode(marker)}))
        txn.put(b"keys", pickle.dumps([r.image_id.encode() for r in records[:2]] + [b"evil"]))
    env.close()
    report = _import("vilbert-lmdb", [src], tmp_path / "s", trust_pickle=True)
    assert not marker.exists()
    assert report.imported == 2 and dict(report.skipped_by_kind) == {"refused pickle": 1}
    assert "posix.system" in report.skipped_rows[0] and "may try to run code" in report.skipped_rows[0]

    evil_npy = tmp_path / "mmf"
    write_mmf_npy(evil_npy, records[:1])
    with open(evil_npy / "x_info.npy", "wb") as f:
        np.save(f, np.array(RunsCode(marker), dtype=object), allow_pickle=True)
    np.save(evil_npy / "x.npy", np.zeros((1, D), np.float32))
    report = _import("mmf-npy", [evil_npy], tmp_path / "m", trust_pickle=True)
    assert not marker.exists() and report.imported == 1 and report.skipped_by_kind["refused pickle"] == 1


def test_verify_names_a_flipped_byte_and_cli_reports(tmp_path, records):
    from pipeline.store import write_records

    for backend in ("arrow", "lmdb"):
        path = tmp_path / backend
        write_records(path, records, backend=backend, shard_size=3)
        assert run_cli("verify", path).returncode == 0
        target = path / "shards" / f"00001.{backend}"
        target = target / "data.mdb" if backend == "lmdb" else target
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
        report = verify_store(path)
        assert not report.ok and any(f"shard 00001.{backend}" in p and "sha256" in p for p in report.problems)
        proc = run_cli("verify", path)
        assert proc.returncode == 1 and f"00001.{backend}" in proc.stdout
        (path / "shards" / f"00002.{backend}").rename(path / "shards" / "moved")
        assert any("00002" in p and "missing" in p for p in verify_store(path).problems)


def test_cli_inspect_and_export(tmp_path, records):
    from pipeline.store import write_records

    write_records(tmp_path / "s", records, shard_size=4, provenance={"producer": "test", "detector": "vg-r101"})
    proc = run_cli("inspect", tmp_path / "s", "--json", check=True)
    info = json.loads(proc.stdout)
    assert info["records"] == 7 and info["shards"] == 2 and info["backend"] == "arrow"
    assert info["dims"] == {"features": D, "cls_prob": C, "attr_prob": 401}
    assert info["dtypes"]["features"] == "float16" and info["provenance"]["detector"] == "vg-r101"
    assert info["sample"]["image_id"] == records[0].image_id and info["bytes_per_image"] > 0
    proc = run_cli("inspect", tmp_path / "s", check=True)
    assert "bytes per image" in proc.stdout and "vg-r101" in proc.stdout
    run_cli("export", "--to", "lxmert-tsv", tmp_path / "s", tmp_path / "o.tsv", check=True)
    assert len(load_obj_tsv(tmp_path / "o.tsv")) == 7
    proc = run_cli("export", "--to", "lxmert-tsv", tmp_path / "s", tmp_path / "o.tsv")
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    proc = run_cli("export", "--to", "nope", tmp_path / "s", tmp_path / "x")
    assert proc.returncode == 2 and "cannot export" in proc.stderr
    proc = run_cli("inspect", tmp_path)
    assert proc.returncode == 3 and "not a feature store" in proc.stderr


# -- hostile rows are skipped with file:row, good rows committed --


def _b64(arr, dtype) -> bytes:
    import base64

    return base64.b64encode(np.ascontiguousarray(arr, dtype).tobytes())


def _check_skips(report, dest: Path, source_name: str, good, kinds: dict) -> None:
    assert report.imported == len(good) and dict(report.skipped_by_kind) == kinds, dict(report.skipped_by_kind)
    assert all(line.startswith(source_name) for line in report.skipped_rows), report.skipped_rows
    assert list(FeatureStore.open(dest).ids()) == [r.image_id for r in good]
    saved = json.loads((dest / "import_report.json").read_text())
    assert saved["skipped"] == sum(kinds.values()) and saved["imported"] == len(good)
    assert verify_store(dest).ok


def test_hostile_lxmert_rows_are_skipped_with_file_and_row(tmp_path, records):
    src = tmp_path / "hostile.tsv"
    good = records[:3]
    write_lxmert_tsv(src, good)
    base = src.read_bytes().split(b"\r\n")[0].split(b"\t")
    n = int(base[7])

    def row(**changes):
        fields = list(base)
        for index, value in changes.items():
            fields[int(index[1:])] = value
        fields[0] = b"hostile_%d" % len(lines)
        return b"\t".join(fields)

    lines: list[bytes] = []
    for changes in (
        {"f1": b"99999999999"},  # used to abort the run at flush time: "too large to fit in C integer type"
        {"f2": b"-3"},
        {"f1": b"12abc"},
        {"f7": b"99999999999999999999"},
        {"f7": b"0"},
        {"f3": _b64(np.full(n, 2**40), np.int64)},
        {"f9": _b64(np.full((n, D), 1e30), np.float32)},
    ):
        lines.append(row(**changes))
    lines.append(b"\xff\xfe" + row()[len(b"hostile_7") :])
    with open(src, "ab") as f:
        for line in lines:
            f.write(line + b"\r\n")
    report = _import("lxmert-tsv", [src], tmp_path / "s")
    _check_skips(
        report,
        tmp_path / "s",
        "hostile.tsv:",
        good,
        {
            "invalid record": 4,
            "bad integer": 1,
            "num_boxes mismatch": 1,
            "bad num_boxes": 1,
            "bad utf-8": 1,
        },
    )
    assert any(
        line.startswith("hostile.tsv:4: invalid record") and "image_h" in line and "2**31" in line
        for line in report.skipped_rows
    ), report.skipped_rows


def test_hostile_butd_rows_are_skipped_with_file_and_row(tmp_path, records):
    src = tmp_path / "hostile.tsv"
    good = records[:2]
    write_butd_tsv(src, good, with_cls_prob=True)
    base = src.read_bytes().split(b"\r\n")[0].split(b"\t")
    n = int(base[3])
    hostile = []
    for index, value in ((2, b"99999999999"), (6, _b64(np.full((n, C), -0.5), np.float32)), (3, b"abc"), (4, b"@@@@")):
        fields = list(base)
        fields[0], fields[index] = b"hostile_%d" % len(hostile), value
        hostile.append(b"\t".join(fields))
    with open(src, "ab") as f:
        f.write(b"".join(h + b"\r\n" for h in hostile))
    report = _import("butd-tsv", [src], tmp_path / "s")
    _check_skips(report, tmp_path / "s", "hostile.tsv:", good, {"invalid record": 2, "bad integer": 1, "bad base64": 1})


def test_hostile_vilbert_lmdb_values_are_skipped_with_key(tmp_path, records):
    src = tmp_path / "hostile.lmdb"
    good = records[:2]
    write_vilbert_lmdb(src, good, "multitask")
    r = records[2]
    base = {
        "image_h": r.image_h,
        "image_w": r.image_w,
        "num_boxes": r.num_boxes,
        "boxes": np.asarray(r.boxes, np.float32),
        "features": np.asarray(r.features, np.float32),
    }
    hostile = {
        b"objects_as_text": {**base, "objects": "abc", "objects_conf": np.zeros(r.num_boxes, np.float32)},
        b"too_tall": {**base, "image_h": 99999999999},
        b"nan_height": {**base, "image_h": float("nan")},
        b"word_width": {**base, "image_w": "wide"},
        b"not_a_dict": [1, 2, 3],
        b"bad_base64": {**base, "boxes": "!!!"},
        b"text_features": {**base, "features": [["a", "b"]]},
        b"bytes_id": {**base, "image_id": b"\xff\xfe"},
        b"dict_id": {**base, "image_id": {"x": 1}},
        b"negative_boxes": {**base, "num_boxes": -1},
        b"short_cls_prob": {**base, "cls_prob": np.zeros(r.num_boxes + 1, np.float32)},
        b"bool_width": {**base, "image_w": True},
    }
    env = lmdb.open(str(src), map_size=1 << 28)
    with env.begin(write=True) as txn:
        for key, value in hostile.items():
            txn.put(
                key,
                pickle.dumps(
                    {"image_id": key.decode(), **value}
                    if isinstance(value, dict) and "image_id" not in value
                    else value
                ),
            )
        txn.put(b"keys", pickle.dumps([g.image_id.encode() for g in good] + list(hostile)))
    env.close()
    report = _import("vilbert-lmdb", [src], tmp_path / "s", trust_pickle=True)
    _check_skips(
        report,
        tmp_path / "s",
        "hostile.lmdb key b'",
        good,
        {
            "bad array": 2,
            "invalid record": 1,
            "bad integer": 3,
            "not a dict": 1,
            "bad base64": 1,
            "bad image id": 2,
            "bad num_boxes": 1,
            "num_boxes mismatch": 1,
        },
    )


def test_hostile_mmf_files_are_skipped_with_path(tmp_path, records):
    src = tmp_path / "mmf"
    good = records[:2]
    write_mmf_npy(src, good)
    r = records[2]
    info = {
        "bbox": np.asarray(r.boxes, np.float32),
        "num_boxes": r.num_boxes,
        "image_width": r.image_w,
        "image_height": r.image_h,
        "objects": np.zeros(r.num_boxes, np.int64),
        "cls_prob": np.asarray(r.cls_prob, np.float32)[:, 1:],
    }
    hostile = {
        "objects_as_text": {**info, "objects": "abc"},
        "too_tall": {**info, "image_height": 99999999999},
        "a_list": [info],
    }
    for name, value in hostile.items():
        np.save(src / f"{name}.npy", np.asarray(r.features, np.float32))
        np.save(
            src / f"{name}_info.npy",
            np.array(value, dtype=object) if isinstance(value, list) else value,
            allow_pickle=True,
        )
    np.save(src / "object_features.npy", np.array([object()] * 2), allow_pickle=True)
    np.save(src / "object_features_info.npy", info, allow_pickle=True)
    report = _import("mmf-npy", [src], tmp_path / "s", trust_pickle=True)
    _check_skips(report, tmp_path / "s", "", good, {"bad array": 1, "invalid record": 1, "not a dict": 1, "bad npy": 1})
    assert sorted(line.split(":")[0] for line in report.skipped_rows) == [
        "a_list_info.npy",
        "object_features_info.npy",
        "objects_as_text_info.npy",
        "too_tall_info.npy",
    ]


# -- export collisions ---------------------------------------


@pytest.mark.parametrize(
    "ids, words",
    [
        (["img", "img_info"], "'img' and 'img_info' both write img_info.npy"),
        (["a", "a.npy/b"], "'a' writes the file a.npy, which 'a.npy/b' needs as a folder"),
    ],
)
def test_mmf_export_refuses_colliding_ids_before_writing(tmp_path, ids, words):
    from pipeline.store import write_records

    recs = [
        r.__class__(**{**r.__dict__, "image_id": i})
        for r, i in zip(make_records(len(ids), seed=31, feature_dim=8), ids)
    ]
    write_records(tmp_path / "s", recs, feature_dim=8)
    with pytest.raises(ConfigError, match=words):
        run_export(ExportConfig("mmf-npy", tmp_path / "s", tmp_path / "out"))
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))
    proc = run_cli("export", "--to", "mmf-npy", tmp_path / "s", tmp_path / "out")
    assert proc.returncode == 2 and "collide" in proc.stderr


def test_mmf_round_trip_of_an_id_ending_in_info(tmp_path):
    """`x_info` writes x_info.npy (features) and x_info_info.npy: the importer must not take
    the features file for the info file of an image `x`."""
    from pipeline.store import write_records

    recs = [
        r.__class__(**{**r.__dict__, "image_id": i})
        for r, i in zip(make_records(2, seed=32, feature_dim=8), ["x_info", "y"])
    ]
    write_records(tmp_path / "s", recs, feature_dim=8, dtype="float32")
    run_export(ExportConfig("mmf-npy", tmp_path / "s", tmp_path / "out"))
    report = _import("mmf-npy", [tmp_path / "out"], tmp_path / "t", dtype="float32", feature_dim=8, trust_pickle=True)
    assert (report.imported, report.skipped) == (2, 0), report.skipped_rows
    _stores_equal(tmp_path / "s", tmp_path / "t")


# -- vilbert-lmdb export --------------------------------------


def _pickle_globals(data: bytes) -> set[str]:
    import pickletools

    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            found.add(".".join(strings[-2:]))
    return found


def test_vilbert_lmdb_export_loads_in_vilbert_multi_task_and_round_trips(tmp_path):
    from legacy_files import vilbert_features_reader

    from pipeline.store import write_records

    recs = make_records(5, seed=33, feature_dim=D, cls_dim=None, attr_dim=None, labels=False)
    write_records(tmp_path / "s", recs, dtype="float32", shard_size=2)
    run_export(ExportConfig("vilbert-lmdb", tmp_path / "s", tmp_path / "feats.lmdb"))

    for rec in recs:
        got = vilbert_features_reader(tmp_path / "feats.lmdb", rec.image_id)
        assert got["image_ids"] == [r.image_id.encode() for r in recs]
        assert sorted(got["item"]) == ["boxes", "features", "image_h", "image_id", "image_w", "num_boxes"]
        assert got["item"]["image_id"] == rec.image_id and type(got["item"]["image_h"]) is int
        assert got["item"]["features"].dtype == np.float32 and got["item"]["boxes"].dtype == np.float32
        np.testing.assert_array_equal(got["features"][1:], rec.features)
        assert got["num_boxes"] == rec.num_boxes + 1
        np.testing.assert_allclose(got["image_location"][1:], rec.spatial5(), rtol=1e-6)
    env = lmdb.open(str(tmp_path / "feats.lmdb"), readonly=True, lock=False)
    with env.begin() as txn:
        names = set().union(*(_pickle_globals(bytes(v)) for _, v in txn.cursor()))
    env.close()
    assert names <= {"numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"}, (
        names
    )  # numpy 1.x loads these

    report = _import("vilbert-lmdb", [tmp_path / "feats.lmdb"], tmp_path / "back", dtype="float32", trust_pickle=True)
    assert (report.imported, report.skipped) == (5, 0)
    _stores_equal(tmp_path / "s", tmp_path / "back")


def test_vilbert_lmdb_export_refuses_an_image_id_named_keys(tmp_path):
    from pipeline.store import write_records

    recs = make_records(2, seed=34, feature_dim=8)
    write_records(
        tmp_path / "s", [recs[0], recs[1].__class__(**{**recs[1].__dict__, "image_id": "keys"})], feature_dim=8
    )
    with pytest.raises(ConfigError, match="'keys'.*the list of keys"):
        run_export(ExportConfig("vilbert-lmdb", tmp_path / "s", tmp_path / "out.lmdb"))
    assert not (tmp_path / "out.lmdb").exists()


# -- disk full during import --------------------------


def _limit_file_size(limit: int):
    import resource
    import signal

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    return apply


@pytest.mark.parametrize("backend", ["arrow", "lmdb"])
def test_disk_full_during_import_keeps_the_committed_shards_and_exits_74(tmp_path, backend):
    import os
    import subprocess
    import sys

    from helpers import REPO

    rng = np.random.default_rng(35)
    from helpers import make_record

    recs = [
        make_record(rng, f"small_{i}", num_boxes=2, feature_dim=D, cls_dim=None, attr_dim=None, labels=True)
        for i in range(4)
    ]
    recs += [
        make_record(rng, f"large_{i}", num_boxes=60, feature_dim=D, cls_dim=None, attr_dim=None, labels=True)
        for i in range(3)
    ]
    src = tmp_path / "feats.tsv"
    write_lxmert_tsv(src, recs)
    args = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "import",
        "--from",
        "lxmert-tsv",
        "--backend",
        backend,
        "--shard-size",
        "2",
        str(src),
        str(tmp_path / "s"),
    ]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run(
        args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size(200_000)
    )  # two small shards fit, a large one does not
    assert proc.returncode == 74, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "shards/.tmp-00002" in lines[0] and "rerun" in lines[0], lines
    assert "disk full" in lines[0] or "Input/output error" in lines[0]

    store = FeatureStore.open(tmp_path / "s")
    assert list(store.ids()) == [r.image_id for r in recs[:4]]  # the committed shards stay
    assert not list((tmp_path / "s").rglob(".tmp-*"))  # the half-written shard was removed
    report = verify_store(tmp_path / "s")
    assert report.ok and all("index.arrow" in w for w in report.warnings), report

    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)  # space freed: rerun
    assert proc.returncode == 0 and "already present 4" in proc.stdout, proc.stderr
    assert list(FeatureStore.open(tmp_path / "s").ids()) == [r.image_id for r in recs]
    assert verify_store(tmp_path / "s").ok
