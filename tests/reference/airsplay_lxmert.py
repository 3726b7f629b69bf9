"""Reference logits of airsplay/lxmert's own fine-tuning models (`src/tasks/vqa_model.py`'s
VQAModel, `src/tasks/nlvr2_model.py`'s NLVR2Model), for `tests/vl_models/test_published.py`.

The fixture (``airsplay_lxmert.json`` beside this file) holds no weights: every tensor of the
models' state dicts (the ``BEST.pth`` layout) is a deterministic function of its key name and
shape (`fill`), and the region features and boxes of the inputs are drawn from a seed
(`regions`), so the test rebuilds the same ``BEST.pth`` and inputs from this module alone. The
fixture keeps the sentences, the token ids airsplay's tokenizer made of them, each key's shape
and the logits.

Made once, on CPU, with the reference code (never vendored; fetch github:airsplay/lxmert):

    python tests/reference/airsplay_lxmert.py --airsplay /path/to/airsplay-lxmert/src

It runs the task models' own classes, unchanged, with what needs a network or a GPU replaced:
`BertTokenizer.from_pretrained("bert-base-uncased")` by the same class on bert-base-uncased's
vocab file (shipped with vl_models), `from_pretrained("bert-base-uncased")` of the encoder by
the same class built from a tiny `BertConfig` (its weights then come from `fill`),
`LXRTEncoder.dim` (768) by the tiny width, and `Tensor.cuda()` by a no-op.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import zlib
from pathlib import Path

import torch

FIXTURE = Path(__file__).with_suffix(".json")
HIDDEN, HEADS, INTERMEDIATE = 16, 2, 32
LAYERS = {"llayers": 2, "xlayers": 1, "rlayers": 1}
OBJECTS, FEATURE_DIM = 36, 2048  # NLVR2Model asserts both
VQA_ANSWERS = 5
SENTENCES = [
    "what color is the large cube on the left?",
    "Is there a dog?",
    "how many red spheres are there in the picture of the table next to the window by the door",  # > 18 pieces
]
NLVR2_SENTENCES = ["the left image has two dogs", "There is exactly one cat in the right image."]


def fill(key: str, shape: tuple) -> torch.Tensor:
    """The tensor of `key`: random, seeded by the key's name; LayerNorm scales around 1."""
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    noise = torch.randn(tuple(shape), generator=g)
    scale_like = key.endswith("LayerNorm.weight") or key.endswith("_layer_norm.weight") or key == "logit_fc.2.weight"
    return 1 + 0.1 * noise if scale_like else 0.2 * noise


def regions(batch: int, images: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (batch, images, 36, 2048), boxes as airsplay feeds them: x1/W, y1/H, x2/W, y2/H)."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.rand(batch, images, OBJECTS, FEATURE_DIM, generator=g) * 2
    xy = torch.rand(batch, images, OBJECTS, 2, generator=g) * 0.6
    wh = torch.rand(batch, images, OBJECTS, 2, generator=g) * 0.4
    return feats, torch.cat([xy, xy + wh], -1)


def _reference(src: Path, vocab: Path):
    """airsplay's VQAModel and NLVR2Model classes, importable and runnable here."""
    for name in ("boto3", "botocore", "botocore.exceptions"):  # file_utils imports them for S3 downloads
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["botocore.exceptions"].ClientError = Exception
    sys.argv = [sys.argv[0], *[f"--{k}={v}" for k, v in LAYERS.items()]]  # param.py parses at import
    sys.path.insert(0, str(src))
    from lxrt import entry, modeling, tokenization
    from tasks.nlvr2_model import NLVR2Model
    from tasks.vqa_model import VQAModel

    tokenization.BertTokenizer.from_pretrained = classmethod(lambda cls, name, **kw: cls(str(vocab), **kw))
    config = modeling.BertConfig(
        30522, hidden_size=HIDDEN, num_attention_heads=HEADS, intermediate_size=INTERMEDIATE, max_position_embeddings=64
    )
    entry.VisualBertForLXRFeature.from_pretrained = classmethod(lambda cls, name, mode="x": cls(config, mode=mode))
    entry.LXRTEncoder.dim = property(lambda self: HIDDEN)
    torch.Tensor.cuda = lambda self, *a, **k: self
    return VQAModel, NLVR2Model


def _filled(model: torch.nn.Module) -> dict:
    state = {k: fill(k, v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return {k: list(v.shape) for k, v in state.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--airsplay", type=Path, required=True, help="airsplay/lxmert's src/ folder")
    args = parser.parse_args()
    from vl_models.data.tokenize import bundled_bert_vocab

    VQAModel, NLVR2Model = _reference(args.airsplay, bundled_bert_vocab())
    out: dict = {"source": "github.com/airsplay/lxmert (src/tasks, src/lxrt)", "hidden": HIDDEN, "heads": HEADS}
    out.update(intermediate=INTERMEDIATE, layers=LAYERS, answers=VQA_ANSWERS)
    with torch.no_grad():
        vqa = VQAModel(VQA_ANSWERS).eval()
        shapes = _filled(vqa)
        feats, boxes = regions(len(SENTENCES), 1, seed=1)
        features = entry_features(vqa, SENTENCES)
        logits = vqa(feats[:, 0], boxes[:, 0], SENTENCES)
        out["vqa"] = {"sentences": SENTENCES, "seed": 1, **features, "shapes": shapes, "logits": logits.tolist()}
        nlvr2 = NLVR2Model().eval()
        shapes = _filled(nlvr2)
        feats, boxes = regions(len(NLVR2_SENTENCES), 2, seed=2)
        features = entry_features(nlvr2, NLVR2_SENTENCES)
        logits = nlvr2(feats, boxes, NLVR2_SENTENCES).tolist()
        out["nlvr2"] = {"sentences": NLVR2_SENTENCES, "seed": 2, **features, "shapes": shapes, "logits": logits}
    FIXTURE.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


def entry_features(model, sentences) -> dict:
    """The token ids and mask airsplay's encoder makes of `sentences` (its own function)."""
    from lxrt.entry import convert_sents_to_features

    made = convert_sents_to_features(sentences, model.lxrt_encoder.max_seq_length, model.lxrt_encoder.tokenizer)
    return {"input_ids": [f.input_ids for f in made], "input_mask": [f.input_mask for f in made]}


if __name__ == "__main__":
    main()
