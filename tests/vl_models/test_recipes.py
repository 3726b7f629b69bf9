"""Published recipes (`vltrain pretrain --recipe`) and epoch-based schedules."""

import json

import pytest
from train_helpers import VOCAB, config
from typer.testing import CliRunner

from pipeline.errors import ConfigError
from vl_models.cli import app
from vl_models.config import flat_settings
from vl_models.train.recipes import RECIPE_DIR, load_recipe

# The published numbers (LXMERT paper §3.3 and airsplay/lxmert run/lxmert_pretrain.bash; ViLBERT
# paper §3.3 and vilbert-multi-task train_concap.py), written out here independently of the files.
PUBLISHED = {
    "lxmert-paper": {
        "model": "lxmert-base",
        "epochs": 20,
        "lr": 1e-4,
        "batch_size": 256,
        "optimizer": "bertadam",
        "qa_from_epoch": 10,
        "warmup": 0.05,
        "max_text": 20,
        "max_regions": 36,
    },
    "vilbert-paper": {
        "model": "vilbert-base",
        "epochs": 10,
        "lr": 1e-4,
        "batch_size": 512,
        "warmup": 0.1,
        "max_text": 36,
        "max_regions": 36,
    },
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_recipes_hold_the_published_numbers_each_cited(name):
    path, values = load_recipe(name)
    assert {k: values[k] for k in PUBLISHED[name]} == PUBLISHED[name]
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            assert "[paper" in line or "[code" in line or "[bash" in line, f"uncited: {line}"
    assert sorted(p.stem for p in RECIPE_DIR.glob("*.yaml")) == sorted(PUBLISHED)


def _pretrain(data, tmp_path, *extra):
    args = [
        "pretrain",
        "--stores",
        str(data / "feats"),
        "--mixture",
        str(data / "mix"),
        "--vocab",
        str(VOCAB),
        "--out",
        str(tmp_path / "run"),
        "--max-regions",
        "10",
        "--checkpoint-every",
        "100",
        *extra,
    ]
    return CliRunner().invoke(app, args)


def test_the_lxmert_recipe_sets_the_schedule_and_flags_win(data, tmp_path):
    """--recipe lxmert-paper on a tiny model: its optimizer, lr, QA start and 5 % warmup are
    used; the flags given (model, batch size, epochs) win over the recipe's."""
    result = _pretrain(
        data, tmp_path, "--recipe", "lxmert-paper", "--model", "lxmert-tiny", "--batch-size", "4", "--epochs", "2"
    )
    assert result.exit_code == 0, result.output
    train = flat_settings(json.loads((tmp_path / "run" / "config.json").read_text())["train"])
    assert (train["model"], train["batch_size"], train["optimizer"], train["lr"]) == (
        "lxmert-tiny",
        4,
        "bertadam",
        1e-4,
    )
    assert train["qa_from_epoch"] == 10 and train["max_text"] == 20 and train["epochs"] == 2
    assert train["steps"] == 6  # 2 epochs of 12 train items in batches of 4
    assert train["warmup"] == 0.05  # a fraction of the steps, kept as given


def test_steps_on_the_command_line_win_over_a_recipes_epochs(data, tmp_path):
    result = _pretrain(
        data, tmp_path, "--recipe", "lxmert-paper", "--model", "lxmert-tiny", "--batch-size", "4", "--steps", "2"
    )
    assert result.exit_code == 0, result.output
    train = flat_settings(json.loads((tmp_path / "run" / "config.json").read_text())["train"])
    assert train["steps"] == 2 and train["epochs"] is None and train["optimizer"] == "bertadam"


def test_every_recipe_value_reaches_the_run(data, tmp_path):
    """verify_shards, like every settable option, is taken from a recipe file."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: lxmert-tiny\nverify_shards: true\nsteps: 1\nbatch_size: 4\nseed: 5\n")
    result = _pretrain(data, tmp_path, "--recipe", str(mine))
    assert result.exit_code == 0, result.output
    train = flat_settings(json.loads((tmp_path / "run" / "config.json").read_text())["train"])
    assert train["verify_shards"] is True and train["seed"] == 5 and train["steps"] == 1


def test_a_recipe_key_of_a_renamed_flag_is_read_as_the_flag_with_a_line(data, tmp_path):
    """A recipe's weight (the former spelling of --loss-weight) still sets the loss weights, said
    on stderr; with loss_weight beside it the recipe is refused."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("model: lxmert-tiny\nweight: {mlm: 0.5}\nsteps: 1\nbatch_size: 4\n")
    result = _pretrain(data, tmp_path, "--recipe", str(mine))
    assert result.exit_code == 0, result.output
    assert f"{mine}: weight is deprecated: use loss_weight" in result.stderr
    train = flat_settings(json.loads((tmp_path / "run" / "config.json").read_text())["train"])
    assert train["weights"] == {"mlm": 0.5}
    mine.write_text("model: lxmert-tiny\nweight: {mlm: 0.5}\nloss_weight: {mlm: 2}\n")
    _refused_in_one_line(_pretrain(data, tmp_path, "--recipe", str(mine)), "weight and loss_weight are one option")


def test_a_recipe_file_is_checked(data, tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("model: lxmert-tiny\nlearning_rate: 0.1\n")
    result = _pretrain(data, tmp_path, "--recipe", str(bad))
    assert result.exit_code == 2 and "learning_rate" in result.output and "settable" in result.output
    bad.write_text("model: lxmert-tiny\nbatch_size: many\n")
    result = _pretrain(data, tmp_path, "--recipe", str(bad))
    assert result.exit_code == 2 and "batch_size" in result.output
    bad.write_text("out: elsewhere\n")
    assert _pretrain(data, tmp_path, "--recipe", str(bad)).exit_code == 2  # where things go is the command line's
    result = _pretrain(data, tmp_path, "--recipe", "lxmert-papers")
    assert result.exit_code == 2 and "lxmert-paper" in result.output  # the known names are listed
    result = _pretrain(data, tmp_path, "--model", "lxmert-tiny", "--steps", "3", "--epochs", "1")
    assert result.exit_code == 2 and "not both" in result.output


def test_epochs_and_warmup_fraction_resolve_to_steps(data, tmp_path):
    cfg = config(data, tmp_path, "lxmert-tiny", epochs=2.5, warmup=0.1, batch_size=4)
    assert cfg.scheduled(train_items=100, world=2).optim.steps == 30  # 12 steps per epoch on 2 ranks
    assert cfg.scheduled(train_items=100, world=2).optim.warmup_steps == 3
    assert config(data, tmp_path, "lxmert-tiny", warmup=7).scheduled(100, 1).optim.warmup_steps == 7
    assert config(data, tmp_path, "lxmert-tiny", steps=9).scheduled(100, 1).optim.steps == 9  # no --epochs: as given
    with pytest.raises(ConfigError, match="warmup"):
        config(data, tmp_path, "lxmert-tiny", warmup=2.5)
    with pytest.raises(ConfigError, match="epochs"):
        config(data, tmp_path, "lxmert-tiny", epochs=0)


def _refused_in_one_line(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    for word in words:
        assert word in lines[0], lines[0]


def test_a_recipe_with_yaml_aliases_is_refused_at_once(data, tmp_path):
    """Nested aliases ("billion laughs") under a settable key: a few hundred bytes that stand
    for millions of values once formatted. Refused when read, before anything expands."""
    levels = ["&l0 [" + ", ".join(["lol"] * 10) + "]"]
    levels += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 7)]
    bad = tmp_path / "laughs.yaml"
    bad.write_text("model: lxmert-tiny\nloss_weight: [" + ", ".join(levels) + "]\n")
    _refused_in_one_line(_pretrain(data, tmp_path, "--recipe", str(bad)), "alias")


@pytest.mark.parametrize(
    "text, words",
    [
        ("steps: true\n", ["steps", "bool"]),  # click reads True as 1
        ("steps: null\n", ["steps"]),
        ("lr: [1.0e-4, 2.0e-4]\n", ["lr", "list"]),
        ("verify_shards: 1\n", ["verify_shards", "true or false"]),
        ("loss_weight: [[mlm, 1]]\n", ["loss_weight"]),
        ("loss_weight: {mlm: [1]}\n", ["loss_weight"]),
        ("steps: " + "[" * 5000 + "]" * 5000 + "\n", ["nested deeper"]),  # RecursionError in the loader
        # PyYAML's own message spans several lines
        ("steps: [1, 2\nlr: 3\n", ["invalid YAML", "at line 3, column 3", "sequence begun at line 2"]),
    ],
    ids=["bool", "null", "list", "flag-int", "nested-list", "nested-map", "5000-deep", "invalid"],
)
def test_recipe_values_of_the_wrong_yaml_type_are_refused_in_one_line(data, tmp_path, text, words):
    bad = tmp_path / "mine.yaml"
    bad.write_text("model: lxmert-tiny\n" + text)
    _refused_in_one_line(_pretrain(data, tmp_path, "--recipe", str(bad)), *words)
