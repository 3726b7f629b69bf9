"""Reference logits of vilbert-multi-task's `VILBertForVLTasks` (``vilbert/vilbert.py``, the
12-in-1 code), for `tests/vl_models/test_published_vilbert.py`.

The fixture (``vilbert_mt.json`` beside this file) holds no weights: every tensor of the model's
state dict (the ``multi_task_model.bin`` layout) is a deterministic function of its key name and
shape (`fill`; the LM decoder is tied to the word embeddings, so it is filled as they are), and
the inputs are drawn from a seed (`inputs`), so the test rebuilds the same checkpoint and inputs
from this module alone. The fixture keeps each key's shape and the logits: for a model trained
with ``--task_specific_tokens`` (a 20-row task-token table) the logits of the head each task
reads, run with that task's token (`TASKS`: the id ``task_utils.py`` fills the token with, the N
of ``TASKN`` in ``vilbert_tasks.yml``); for a model without the table, every head's logits from
one forward pass. Answer classifiers (3,129 and 1,533 rows, fixed in the class) are kept at every
`ANSWER_STRIDE`-th column.

Made once, on CPU, with the reference code (never vendored; fetch
github:facebookresearch/vilbert-multi-task):

    python tests/reference/vilbert_mt.py --reference /path/to/vilbert-multi-task

It runs the reference class unchanged; only imports of ``vilbert/utils.py`` that this
environment lacks or that need a network are replaced by empty modules (``tensorboardX``,
``torch._six``'s ``inf``), and the tiny `CONFIG` replaces ``bert_base_6layer_6conect.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import types
import zlib
from pathlib import Path

import torch

FIXTURE = Path(__file__).with_suffix(".json")
# Our vilbert-tiny's sizes, in the reference config's names.
CONFIG = {
    "vocab_size": 30522,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "v_feature_size": 2048,
    "v_target_size": 13,
    "v_hidden_size": 24,
    "v_num_hidden_layers": 2,
    "v_num_attention_heads": 4,
    "v_intermediate_size": 32,
    "bi_hidden_size": 16,
    "bi_num_attention_heads": 4,
    "v_biattention_id": [0, 1],
    "t_biattention_id": [1, 2],
}
BATCH, TEXT, REGIONS = 4, 9, 7
TASKS = {"vqa": 1, "vcr-q2a": 5, "flickr30k": 8, "refcoco+": 10, "nlvr2": 12, "gqa": 15}
HEAD_OF = {  # the output `task_utils.py` reads for each task's type
    "vqa": "vil_prediction",
    "gqa": "vil_prediction_gqa",
    "nlvr2": "vil_binary_prediction",
    "refcoco+": "vision_logit",
    "flickr30k": "vil_logit",
    "vcr-q2a": "vil_logit",
}
OUTPUTS = (  # VILBertForVLTasks.forward's outputs, in order
    "vil_prediction",
    "vil_prediction_gqa",
    "vil_logit",
    "vil_binary_prediction",
    "vil_tri_prediction",
    "vision_prediction",
    "vision_logit",
    "linguisic_prediction",
    "linguisic_logit",
)
ANSWER_STRIDE = 31
TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight"}


def fill(key: str, shape) -> torch.Tensor:
    """The tensor of `key`: random, seeded by the key's name; LayerNorm scales (and weight-norm
    gains) around 1."""
    key = TIED.get(key, key)
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    noise = torch.randn(tuple(shape), generator=g)
    scale_like = key.endswith(("LayerNorm.weight", "logit_fc.2.weight", "weight_g"))
    return 1 + 0.1 * noise if scale_like else 0.2 * noise


def inputs(seed: int = 3) -> dict:
    """Token ids ([CLS] first, [SEP] last, padded), masks, token types (a second segment in
    one row), region features (the IMG token first) with 5-d boxes, padded regions."""
    g = torch.Generator().manual_seed(seed)
    lengths, regions = [9, 6, 4, 7], [7, 5, 7, 3]
    ids = torch.zeros(BATCH, TEXT, dtype=torch.long)
    mask = torch.zeros(BATCH, TEXT, dtype=torch.long)
    types_ = torch.zeros(BATCH, TEXT, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.cat(
            [torch.tensor([101]), torch.randint(1000, 29000, (n - 2,), generator=g), torch.tensor([102])]
        )
        mask[b, :n] = 1
    types_[0, 5:9] = 1
    feats = torch.rand(BATCH, REGIONS, 2048, generator=g) * 2
    xy = torch.rand(BATCH, REGIONS, 2, generator=g) * 0.6
    wh = torch.rand(BATCH, REGIONS, 2, generator=g) * 0.4
    boxes = torch.cat([xy, xy + wh, (wh[..., :1] * wh[..., 1:])], -1)
    boxes[:, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])  # the IMG token: the whole image
    image_mask = torch.zeros(BATCH, REGIONS, dtype=torch.long)
    for b, n in enumerate(regions):
        image_mask[b, :n] = 1
    return {"ids": ids, "mask": mask, "types": types_, "feats": feats, "boxes": boxes, "image_mask": image_mask}


def kept(name: str, logits: torch.Tensor) -> list:
    """The logits the fixture keeps of output `name`."""
    if name in ("vil_prediction", "vil_prediction_gqa"):
        logits = logits[:, ::ANSWER_STRIDE]
    return [[round(float(x), 6) for x in row] for row in logits.reshape(logits.shape[0], -1)]


def stub_imports() -> None:
    """Empty stand-ins for what ``vilbert/utils.py`` imports and the reference forward never uses."""
    board = types.ModuleType("tensorboardX")
    board.SummaryWriter = object
    six = types.ModuleType("torch._six")
    six.inf = math.inf
    sys.modules.setdefault("tensorboardX", board)
    sys.modules.setdefault("torch._six", six)


def _filled(model: torch.nn.Module) -> dict:
    state = {k: fill(k, v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return {k: list(v.shape) for k, v in state.items()}


def run(model, x: dict, task_ids=None) -> dict:
    with torch.no_grad():
        out = model(
            x["ids"],
            x["feats"],
            x["boxes"],
            x["types"],
            x["mask"],
            x["image_mask"],
            None,
            task_ids,
        )
    return dict(zip(OUTPUTS, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="a vilbert-multi-task checkout")
    args = parser.parse_args()
    stub_imports()
    sys.path.insert(0, str(args.reference))
    from vilbert.vilbert import BertConfig, VILBertForVLTasks

    x = inputs()
    out: dict = {"source": "github.com/facebookresearch/vilbert-multi-task (vilbert/vilbert.py)", "config": CONFIG}
    out.update(batch=BATCH, text=TEXT, regions=REGIONS, answer_stride=ANSWER_STRIDE)
    for tokens in (True, False):
        config = BertConfig.from_dict(CONFIG)
        config.task_specific_tokens = tokens
        config.fusion_method = "mul"
        model = VILBertForVLTasks(config, num_labels=3129).eval()
        case: dict = {"shapes": _filled(model)}
        if tokens:
            for task, token in TASKS.items():
                logits = run(model, x, torch.full((BATCH, 1), token, dtype=torch.long))
                case[task] = kept(HEAD_OF[task], logits[HEAD_OF[task]])
        else:
            logits = run(model, x)
            case.update({name: kept(name, logits[name]) for name in dict.fromkeys(HEAD_OF.values())})
        out["task_tokens" if tokens else "plain"] = case
    FIXTURE.write_text(json.dumps(out) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
