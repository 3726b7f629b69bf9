"""`vltrain export --to hf`: a run (or one checkpoint) as a folder that transformers loads:
model.safetensors, config.json and the tokenizer files."""

import pytest
import torch
import transformers
from train_helpers import VOCAB, assert_pretraining_logits_match, config
from typer.testing import CliRunner

from pipeline.errors import EXIT_CONFIG
from vl_models.cli import app
from vl_models.data.tokenize import WordPiece
from vl_models.models.weights import load_exported
from vl_models.train import checkpoint
from vl_models.train.trainer import run


def export(*args):
    return CliRunner().invoke(app, ["export", "--to", "hf", *map(str, args)])


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """Finished lxmert-tiny and vilbert-tiny runs (checkpoints at steps 1 and 2)."""
    root = tmp_path_factory.mktemp("runs")
    for model in ("lxmert-tiny", "vilbert-tiny"):
        run(config(data, root / model, model, steps=2, checkpoint_every=1))
    return {model: root / model / "run" for model in ("lxmert-tiny", "vilbert-tiny")}


def inputs(feature_dim: int, pos_dim: int, batch: int = 2, words: int = 7, regions: int = 5):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 2000, (batch, words), generator=g)
    mask = torch.ones(batch, words, dtype=torch.long)
    mask[1, 4:] = 0
    feats = torch.rand(batch, regions, feature_dim, generator=g)
    pos = torch.rand(batch, regions, pos_dim, generator=g)
    return ids, feats, pos, mask, torch.ones(batch, regions, dtype=torch.long)


def test_an_lxmert_run_exports_to_a_folder_transformers_loads(runs, tmp_path):
    out = tmp_path / "hf"
    result = export(runs["lxmert-tiny"], out)
    assert result.exit_code == 0, result.output
    assert {"model.safetensors", "config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not (out / "pytorch_model.bin").exists()
    ours = load_exported(out).eval()
    saved = checkpoint.load(runs["lxmert-tiny"] / "checkpoints" / "step_0000002.pt")["model"]
    assert all(torch.equal(ours.state_dict()[k], saved[k]) for k in saved)
    hf = transformers.LxmertForPreTraining.from_pretrained(out).eval()
    ids, feats, pos, mask, vmask = inputs(ours.cfg.visual_feat_dim, 4)
    assert_pretraining_logits_match(ours, hf, ids, feats, pos, mask, vmask)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "A red thing with two circles"
    enc = WordPiece(VOCAB).encode(text, 12)
    assert tokenizer(text)["input_ids"] == enc.ids[enc.mask == 1].tolist()


def test_a_vilbert_run_exports_with_our_loader_and_a_bert_text_stream(runs, tmp_path):
    out = tmp_path / "hf"
    assert export(runs["vilbert-tiny"], out).exit_code == 0
    ours = load_exported(out).eval()
    saved = checkpoint.load(runs["vilbert-tiny"] / "checkpoints" / "step_0000002.pt")["model"]
    assert ours.state_dict().keys() == saved.keys() and all(torch.equal(ours.state_dict()[k], saved[k]) for k in saved)
    bert = transformers.BertModel.from_pretrained(out / "text_stream", add_pooling_layer=False).eval()
    ids, _, _, mask, _ = inputs(1, 5)
    with torch.no_grad():  # ViLBERT's text stream without its co-attention blocks = a BERT encoder
        hidden = ours.bert.embeddings(ids)
        for layer in ours.bert.encoder.layer:
            hidden = layer(hidden, mask.bool()[:, None, None, :])
        ref = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (hidden - ref).abs().max() <= 1e-5
    assert transformers.AutoTokenizer.from_pretrained(out / "text_stream")("a red thing")["input_ids"][0] == 101


@pytest.mark.slow
def test_export_picks_a_step_best_or_a_file_and_guards_its_output(runs, tmp_path):
    folder = runs["lxmert-tiny"]
    first = checkpoint.load(folder / "checkpoints" / "step_0000001.pt")["model"]
    for source in ([folder, "--step", "1"], [folder / "checkpoints" / "step_0000001.pt"]):
        out = tmp_path / f"hf{len(source)}"
        result = export(*source[:1], out, *source[1:])
        assert result.exit_code == 0, result.output
        got = load_exported(out).state_dict()
        assert all(torch.equal(got[k], first[k]) for k in first)
    result = export(folder, tmp_path / "x", "--step", "7")
    assert result.exit_code == EXIT_CONFIG and "no checkpoint of step 7" in result.output and "1, 2" in result.output
    result = export(folder, tmp_path / "y", "--step", "best")
    assert result.exit_code == EXIT_CONFIG and "no best checkpoint" in result.output
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for flags in ([], ["--overwrite"]):  # never replaces a folder we did not write
        result = export(folder, mine, *flags)
        assert result.exit_code == EXIT_CONFIG and "not an export" in result.output, result.output
    assert (mine / "notes.txt").read_text() == "mine"
    again = tmp_path / "hf1"  # the export of step 1 above
    result = export(folder, again)
    assert result.exit_code == EXIT_CONFIG and "--overwrite" in result.output
    (again / "README.md").write_text("model card")
    assert export(folder, again, "--overwrite").exit_code == 0
    assert all(
        torch.equal(load_exported(again).state_dict()[k], v)
        for k, v in checkpoint.load(folder / "checkpoints" / "step_0000002.pt")["model"].items()
    )
    assert (again / "README.md").read_text() == "model card"  # only our files are replaced


def test_a_failed_export_leaves_no_temporary_folder_and_the_earlier_export_intact(runs, tmp_path):
    """A full disk half-way through an export (here a file-size limit in a child process):
    exit 74, the temporary folder is gone (it used to stay, weights and all), an earlier
    export at OUT is unchanged; leftovers of a killed export are removed by the next one."""
    import os
    import subprocess
    import sys

    from helpers import REPO

    from pipeline.errors import EXIT_IO

    out = tmp_path / "hf"
    assert export(runs["lxmert-tiny"], out, "--step", "1").exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    code = (
        "import resource, signal, sys\nsignal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
        "from vl_models.cli import main\nsys.argv = ['vltrain'] + sys.argv[1:]\nmain()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "export", "--to", "hf", str(runs["lxmert-tiny"]), str(out), "--overwrite"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert proc.returncode == EXIT_IO, proc.stderr[-2000:]
    assert "disk full writing" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hf.vlprep.lock", "hf"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    (tmp_path / f".tmp-hf.{2**22 + 1}").mkdir()  # a killed export's temporary folder
    assert export(runs["lxmert-tiny"], out, "--overwrite").exit_code == 0
    assert not list(tmp_path.glob(".tmp-*"))


def test_export_into_the_current_folder_is_refused(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = export(runs["lxmert-tiny"], ".")
    assert result.exit_code == EXIT_CONFIG and "current folder" in result.output, result.output
    assert list(tmp_path.iterdir()) == []
