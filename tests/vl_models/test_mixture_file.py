"""`Mixture.open` (what the trainer, dataset and evaluation read a mixture through) refuses
mixtures whose format this code does not read."""

import json

import pyarrow as pa
import pytest

from pipeline.errors import ConfigError
from pipeline.mixture import Mixture
from pipeline.mixture.mixture import ITEMS_SCHEMA


def mixture(folder, **manifest):
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "vlprep-mixture", **manifest}))
    (folder / "answers.json").write_text(json.dumps({"answers": ["yes"], "counts": [1]}))
    with pa.OSFile(str(folder / "items.arrow"), "wb") as sink, pa.ipc.new_file(sink, ITEMS_SCHEMA) as writer:
        writer.write_table(ITEMS_SCHEMA.empty_table())
    return folder


def test_a_schema_1_mixture_is_refused_with_the_old_rule_named(tmp_path):
    old = mixture(tmp_path / "old_mix", schema_version=1)
    with pytest.raises(ConfigError) as err:
        Mixture.open(old)
    text = str(err.value)
    assert str(old) in text and "min(1, k/3)" in text and "vlprep build-mixture" in text


def test_a_mixture_without_a_schema_version_counts_as_schema_1(tmp_path):
    with pytest.raises(ConfigError, match=r"schema 1.*min\(1, k/3\)"):
        Mixture.open(mixture(tmp_path / "mix"))


def test_a_newer_mixture_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"schema 3.*newer"):
        Mixture.open(mixture(tmp_path / "mix", schema_version=3))


def test_a_current_mixture_is_read(tmp_path):
    mix = Mixture.open(mixture(tmp_path / "mix", schema_version=2, answer_scores="vqa-official"))
    assert mix.file("items.arrow") == tmp_path / "mix" / "items.arrow"
    assert mix.answers == ["yes"] and len(mix) == 0
