"""Hostile and careless inputs to feature stores and what we write: manifests that
name files outside the store or a pipe, fields of the wrong type, `verify --sample` seeds and
its summary, exports a format cannot hold, ids that are not Unicode text, strict JSON."""

import base64
import json
import os

import numpy as np
import pytest
from helpers import make_records, run_cli

from pipeline.errors import ConfigError, InvalidRecordError, StoreError
from pipeline.io import atomic_write_json, read_named_json
from pipeline.store import FeatureStore, FeatureStoreWriter, Manifest, verify_store, write_records


def _store(tmp_path, n=4, shard_size=2, **kwargs):
    kwargs = {"feature_dim": 8, "shard_size": shard_size, **kwargs}
    write_records(tmp_path / "s", make_records(n, seed=3, feature_dim=kwargs["feature_dim"]), **kwargs).close()
    return tmp_path / "s"


def _edit_manifest(store, edit) -> None:
    path = store / "manifest.json"
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def _one_error_line(result, code: int, *words: str) -> None:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(
    "name",
    ["/etc/passwd", "../../../../etc/passwd", "../manifest.json", "..", "", "00001.lmdb", "a/00001.arrow", 7, None],
)
def test_a_shard_name_that_is_no_plain_shard_name_of_the_store_is_a_store_error(tmp_path, name):
    """A manifest naming a path out of shards/ (or a name of the other backend, or no
    string) is refused when it is read: the file it names is never opened."""
    store = _store(tmp_path)

    def edit(obj):
        obj["shards"][1]["name"] = name
        if name == "/etc/passwd":
            obj["shards"][1]["bytes"] = os.path.getsize("/etc/passwd")

    _edit_manifest(store, edit)
    with pytest.raises(StoreError, match="not a shard name"):
        Manifest.read(store)
    with pytest.raises(StoreError):
        FeatureStore.open(store)
    report = verify_store(store)
    assert not report.ok and "not a shard name" in report.problems[0]
    _one_error_line(run_cli("inspect", store), 3, "not a shard name")
    _one_error_line(run_cli("verify", store), 3, "not a shard name")


@pytest.mark.parametrize(
    "edit",
    [
        lambda o: o["shards"][0].update(rows="2"),
        lambda o: o["shards"][0].update(bytes=None),
        lambda o: o["shards"][0].update(rows=True),
        lambda o: o["shards"][0].update(bytes=-1),
        lambda o: o["shards"][0].update(sha256=12),
        lambda o: o.update(shards={"name": "00000.arrow"}),
        lambda o: o.update(shards=[["00000.arrow", 2]]),
        lambda o: o["shards"].append(dict(o["shards"][0])),  # a shard listed twice
        lambda o: o.update(layout=["arrow"]),
        lambda o: o["layout"].update(feature_dim="8"),
        lambda o: o["layout"].update(cls_prob=3),
        lambda o: o.update(provenance=[]),
        lambda o: o.update(runs="none"),
        lambda o: o.update(schema_version="1"),
    ],
)
def test_manifest_fields_of_the_wrong_type_are_a_store_error(tmp_path, edit):
    store = _store(tmp_path)
    _edit_manifest(store, edit)
    with pytest.raises(StoreError, match="unreadable manifest"):
        Manifest.read(store)
    _one_error_line(run_cli("inspect", store), 3, "manifest")


def test_a_manifest_that_is_no_object_or_too_deep_is_a_store_error(tmp_path):
    store = _store(tmp_path)
    good = (store / "manifest.json").read_text()
    for text in ("[1, 2]", "null", "[" * 100_000 + "]" * 100_000, "\xff", good.replace('"rows": 2', '"rows": NaN', 1)):
        (store / "manifest.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(StoreError, match="unreadable manifest"):
            Manifest.read(store)


@pytest.mark.parametrize("backend", ["arrow", "lmdb"])
def test_a_shard_that_is_a_pipe_or_a_link_is_refused_not_opened(tmp_path, backend):
    """A FIFO where a shard should be made inspect and verify block forever; a link would
    be followed out of the store. Both are a StoreError naming the shard, before any open."""
    store = _store(tmp_path, backend=backend)
    shard = store / "shards" / f"00001.{backend}"
    data = shard / "data.mdb" if backend == "lmdb" else shard
    os.unlink(data)
    os.mkfifo(data)
    _edit_manifest(store, lambda o: o["shards"][1].update(bytes=0))  # a FIFO's size
    for command in ("inspect", "verify"):
        result = run_cli(command, store, fresh=True, timeout=60)
        said = " ".join((result.stdout + result.stderr).split())  # rich wraps long lines
        assert result.returncode in (1, 3) and "not a regular file" in said, result
    with pytest.raises(StoreError, match="not a regular file"):
        FeatureStore.open(store).check_shards()

    os.unlink(data)
    other = tmp_path / "elsewhere"
    other.write_bytes(b"x" * 100)
    os.symlink(other, data)
    _edit_manifest(store, lambda o: o["shards"][1].update(bytes=100))
    with pytest.raises(StoreError, match="not a regular file"):
        FeatureStore.open(store).check_shards()
    if backend == "lmdb":  # the shard folder itself a link
        os.unlink(data)
        (tmp_path / "dir").mkdir()
        (tmp_path / "dir" / "data.mdb").write_bytes(b"x" * 100)
        os.rmdir(shard)
        os.symlink(tmp_path / "dir", shard)
        with pytest.raises(StoreError, match="not a regular file"):
            FeatureStore.open(store).check_shards()


def test_an_index_that_is_a_pipe_is_rebuilt_not_read(tmp_path):
    store = _store(tmp_path)
    os.unlink(store / "index.arrow")
    os.mkfifo(store / "index.arrow")
    result = run_cli("verify", store, fresh=True, timeout=20)
    assert result.returncode == 0 and "index.arrow is missing or stale" in " ".join(result.stdout.split()), result


def test_a_manifest_that_is_a_pipe_is_a_store_error_not_a_hang(tmp_path):
    store = _store(tmp_path)
    os.unlink(store / "manifest.json")
    os.mkfifo(store / "manifest.json")
    _one_error_line(run_cli("inspect", store, fresh=True, timeout=60), 3, "not a regular file")


def test_verify_sample_refuses_a_bad_seed_in_one_line(tmp_path):
    store = _store(tmp_path)
    for seed in ("-1", str(2**64)):
        _one_error_line(run_cli("verify", store, "--sample", "3", "--seed", seed), 2, "--seed")
    with pytest.raises(ConfigError, match="--seed"):
        verify_store(store, sample=3, seed=-1)
    (store / "manifest.json").unlink()  # the invocation is checked before the store is read
    _one_error_line(run_cli("verify", store, "--sample", "3", "--seed", "-1"), 2, "--seed")


def test_verify_sample_says_how_many_shards_are_present(tmp_path):
    store = _store(tmp_path)
    os.unlink(store / "shards" / "00001.arrow")
    result = run_cli("verify", store, "--sample", "4")
    assert result.returncode == 1
    assert "1 of 2 shards (1 not): present" in result.stdout and "all 2 shards" not in result.stdout
    assert result.stdout.count("00001.arrow is missing") == 1  # reported once, not again for its sample


def test_export_lxmert_tsv_of_a_store_without_labels_is_refused_before_writing(tmp_path):
    recs = make_records(3, seed=1, feature_dim=8, labels=False, cls_dim=None, attr_dim=None)
    write_records(tmp_path / "s", recs, feature_dim=8).close()
    dest = tmp_path / "out.tsv"
    result = run_cli("export", "--to", "lxmert-tsv", tmp_path / "s", dest)
    _one_error_line(result, 2, "lxmert-tsv needs", "3 without objects_id", "butd-tsv")
    assert not dest.exists() and not list(tmp_path.glob(".tmp-*"))
    # the BUTD extractor's own 6 fields, which vilbert_beta's convert_trainval_lmdb.py reads
    assert run_cli("export", "--to", "butd-tsv", tmp_path / "s", dest).returncode == 0
    rows = [line.split("\t") for line in dest.read_text().splitlines()]
    assert [len(r) for r in rows] == [6, 6, 6] and rows[0][0] == recs[0].image_id
    np.testing.assert_array_equal(
        np.frombuffer(base64.b64decode(rows[2][5]), np.float32).reshape(recs[2].features.shape),
        recs[2].features.astype(np.float16).astype(np.float32),
    )


def test_export_butd_tsv_of_a_store_where_some_records_lack_cls_prob_is_refused(tmp_path):
    recs = make_records(2, seed=1, feature_dim=8) + make_records(1, seed=2, feature_dim=8, cls_dim=None, attr_dim=None)
    write_records(tmp_path / "s", recs, feature_dim=8).close()
    result = run_cli("export", "--to", "butd-tsv", tmp_path / "s", tmp_path / "out.tsv")
    _one_error_line(result, 2, "1 without cls_prob", recs[2].image_id)
    assert not (tmp_path / "out.tsv").exists()


def test_an_id_with_a_lone_surrogate_is_an_invalid_record_and_is_in_no_store(tmp_path):
    rec = make_records(1, seed=1, feature_dim=8)[0]
    rec.image_id = "img\udc80"
    store = _store(tmp_path)
    with FeatureStoreWriter(tmp_path / "w", feature_dim=8) as writer:
        with pytest.raises(InvalidRecordError, match="not valid Unicode"):
            writer.write(rec)
    with FeatureStore.open(store) as opened:
        assert "img\udc80" not in opened
        with pytest.raises(KeyError, match="not in the feature store"):
            opened.get("img\udc80")
        with pytest.raises(KeyError, match="not in the feature store"):
            opened.get_many_into([next(opened.ids()), "img\udc80"], opened.region_buffer(2, 8))


def test_json_we_write_is_strict_a_nan_is_named_and_nothing_written(tmp_path):
    path = tmp_path / "out.json"
    atomic_write_json(path, {"ok": 1})
    for value in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ConfigError, match=r'\["rows"\]\[1\]\["box"\]\[2\] is (nan|inf|-inf)'):
            atomic_write_json(path, {"rows": [{}, {"box": [0.0, 1.0, value]}]})
    assert json.loads(path.read_text()) == {"ok": 1} and os.listdir(tmp_path) == ["out.json"]


def test_config_files_refuse_nan_aliases_depth_and_pipes_in_one_line(tmp_path):
    cases = {
        "nan.json": '{"a": NaN}',
        "alias.yaml": "a: &x [1]\nb: *x\n",
        "deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n",
        "broken.yaml": "a: [1, 2\nb: 3\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError) as err:
            read_named_json(tmp_path / name, tmp_path, "test")
        assert "\n" not in str(err.value), str(err.value)
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(ConfigError, match="must be a file"):
        read_named_json(tmp_path / "folder.yaml", tmp_path, "test")
