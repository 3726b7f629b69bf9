"""`mixture_file` refuses mixtures whose format this code does not read (issue 13, item 5)."""

import json

import pytest

from pipeline.errors import ConfigError
from vl_models.data.dataset import mixture_file, read_answers


def mixture(folder, **manifest):
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"format": "vlprep-mixture", **manifest}))
    (folder / "answers.json").write_text(json.dumps({"answers": ["yes"], "counts": [1]}))
    (folder / "items.arrow").write_bytes(b"")
    return folder


def test_a_schema_1_mixture_is_refused_with_the_old_rule_named(tmp_path):
    old = mixture(tmp_path / "old_mix", schema_version=1)
    for read in (lambda: mixture_file(old, "items.arrow"), lambda: read_answers(old)):
        with pytest.raises(ConfigError) as err:
            read()
        text = str(err.value)
        assert str(old) in text and "min(1, k/3)" in text and "vlprep build-mixture" in text


def test_a_mixture_without_a_schema_version_counts_as_schema_1(tmp_path):
    with pytest.raises(ConfigError, match=r"schema 1.*min\(1, k/3\)"):
        mixture_file(mixture(tmp_path / "mix"), "items.arrow")


def test_a_newer_mixture_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"schema 3.*newer"):
        mixture_file(mixture(tmp_path / "mix", schema_version=3), "items.arrow")


def test_a_current_mixture_is_read(tmp_path):
    mix = mixture(tmp_path / "mix", schema_version=2, answer_scores="vqa-official")
    assert mixture_file(mix, "items.arrow") == mix / "items.arrow"
    assert read_answers(mix) == ["yes"]
