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

The ``data`` case runs the reference's own data path on the task-token model: images of 14 to
120 regions (`REGION_IMAGES`, features and boxes drawn from each image's name: `image`) in an
LMDB of the reference's format read by its ``ImageFeaturesH5Reader``, VQA questions, RefCOCO+
expressions and NLVR2 statements of up to 45 word pieces (`VQA`, `REFCOCO`, `NLVR2`: `sentence`),
tokenized, padded and cut by its ``VQAClassificationDataset``, ``ReferExpressionDataset`` and
``NLVR2Dataset`` at the text lengths and region slots of its ``vilbert_tasks.yml`` (kept in the
fixture), batched by torch's default collate and scored by its ``task_utils.ForwardModelsVal``.
The fixture keeps those settings, each task's logits (VQA's at every `ANSWER_STRIDE`-th answer)
and its choice: the answer (argmax over all 3,129), the region slot, the NLVR2 label.

Made once, on CPU, with the reference code (never vendored; fetch
github:facebookresearch/vilbert-multi-task):

    python tests/reference/vilbert_mt.py --reference /path/to/vilbert-multi-task

It runs the reference code unchanged; only imports that this environment lacks or that need a
network, and that the code run here never uses, are replaced by empty modules (``tensorboardX``,
``torch._six``'s ``inf``; ``h5py``, ``jsonlines``, ``pytorch_transformers``' tokenizer class,
``tools.refer``, and the dataset registry of ``vilbert/datasets/__init__.py``, whose modules
import many more), the tiny `CONFIG` replaces ``bert_base_6layer_6conect.json``, the datasets are
made without their ``__init__`` (which reads annotation files and caches; their attributes are
set as it sets them, then their own ``tokenize`` and ``tensorize`` run), their tokenizer is
transformers' ``BertTokenizer`` over bert-base-uncased's vocab behind the two methods of
pytorch_transformers 1.x they call, and ``Tensor.cuda`` returns the tensor (the evaluation
forward moves every batch to a GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
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

# The data case: images (name -> regions), and per task its examples: (image(s), words, seed).
REGION_IMAGES = {"img_a": 60, "img_b": 60, "img_c": 120, "img_d": 100, "img_e": 100, "img_f": 14, "img_g": 25}
REGION_IMAGES["img_n"] = 60  # RefCOCO+'s fifth expression: its best region is beyond slot 36
VQA = (("img_a", 7, 1), ("img_b", 30, 2), ("img_c", 12, 3), ("img_a", 24, 4), ("img_f", 40, 5))
REFCOCO = (("img_a", 6, 6), ("img_b", 25, 7), ("img_c", 9, 8), ("img_d", 14, 9), ("img_n", 16, 14))
NLVR2 = (
    (("img_f", "img_g"), 12, 10),
    (("img_a", "img_b"), 45, 11),
    (("img_d", "img_e"), 10, 12),
    (("img_c", "img_f"), 20, 13),
)
DATA_TASKS = {"vqa": "TASK1", "refcoco+": "TASK10", "nlvr2": "TASK12"}
BOX = [10, 10, 100, 80]  # each expression's referred box (x, y, w, h): its target only, not its logits
LABELS = {"vqa": 3129, "refcoco+": 1, "nlvr2": 2}  # each dataset's num_labels (VQA: its answer table's rows)
WORDS = (
    "the a man woman dog cat red blue green left right table two three of on in with next to small large white "
    "black car tree picture image is are there and near behind front person shirt wearing holding standing "
    "skateboarding unbelievable"
).split()
VOCAB = Path(__file__).resolve().parents[2] / "vl_models" / "data" / "vocab" / "bert-base-uncased.txt"


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


def image(name: str) -> dict:
    """Image `name`'s size, boxes (pixels, x1 y1 x2 y2) and 2048-d features (float16 values, so a
    float16 store holds them exactly), drawn from its name; ``REGION_IMAGES[name]`` regions."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    n = REGION_IMAGES[name]
    h, w = 360 + 40 * (len(name) % 3), 640
    xy = torch.rand(n, 2, generator=g) * 0.7
    wh = 0.05 + torch.rand(n, 2, generator=g) * 0.25
    size = torch.tensor([w, h], dtype=torch.float32)
    boxes = torch.cat([xy * size, (xy + wh) * size], 1).round()
    features = (torch.rand(n, 2048, generator=g) * 2).half().float()
    return {"image_h": h, "image_w": w, "boxes": boxes.numpy(), "features": features.numpy()}


def number(name: str) -> int:
    """Image `name`'s id in the reference's data (COCO's are numbers)."""
    return list(REGION_IMAGES).index(name) + 1


def sentence(words: int, seed: int) -> str:
    """`words` words of `WORDS`, drawn with `seed` (the last two are several word pieces each)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


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


def stub_data_imports(reference: Path) -> None:
    """Empty stand-ins for what the reference's datasets and ``task_utils.py`` import and the
    code run here never uses; ``vilbert.datasets`` without its ``__init__`` (its submodules load
    from the checkout)."""
    for name in ("h5py", "jsonlines", "pytorch_transformers", "pytorch_transformers.tokenization_bert", "tools"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["pytorch_transformers.tokenization_bert"].BertTokenizer = object
    refer = types.ModuleType("tools.refer.refer")
    refer.REFER = object
    sys.modules.setdefault("tools.refer", types.ModuleType("tools.refer"))
    sys.modules.setdefault("tools.refer.refer", refer)
    datasets = types.ModuleType("vilbert.datasets")
    datasets.__path__ = [str(reference / "vilbert" / "datasets")]
    datasets.DatasetMapTrain = datasets.DatasetMapEval = {}
    sys.modules["vilbert.datasets"] = datasets


class _Tokenizer:
    """The two methods of pytorch_transformers 1.x's ``BertTokenizer`` the datasets call, on
    transformers' ``BertTokenizer`` (bert-base-uncased's vocab, lower case)."""

    def __init__(self):
        from transformers import BertTokenizer

        self.tok = BertTokenizer(str(VOCAB), do_lower_case=True)

    def encode(self, text: str) -> list:
        return self.tok.convert_tokens_to_ids(self.tok.tokenize(text))

    def add_special_tokens_single_sentence(self, ids: list) -> list:
        return [self.tok.cls_token_id, *ids, self.tok.sep_token_id]


def _write_lmdb(path: Path) -> None:
    """`REGION_IMAGES` in the reference's LMDB layout (its extraction scripts'): a pickled item
    per image id (`number`), and the pickled list of ids under ``keys`` (a temporary input of
    its reader)."""
    import pickle

    import lmdb

    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for name in REGION_IMAGES:
            record = image(name)
            item = {"image_id": number(name), "num_boxes": len(record["boxes"]), **record}
            txn.put(str(number(name)).encode(), pickle.dumps(item))
        txn.put(b"keys", pickle.dumps([str(number(name)).encode() for name in REGION_IMAGES]))
    env.close()


def _dataset(cls, reader, tokenizer, task: dict, entries: list, split: str, labels: int):
    """A reference dataset as its ``__init__`` leaves it, the annotation files' entries given."""
    ds = cls.__new__(cls)
    ds.num_labels = labels
    ds.entries, ds.split, ds._tokenizer, ds._padding_index = entries, split, tokenizer, 0
    ds._image_features_reader, ds._gt_image_features_reader = reader, None
    ds._max_seq_length, ds._max_region_num = task["max_seq_length"], task["max_region_num"]
    ds.max_region_num = task["max_region_num"]  # ReferExpressionDataset's name for it
    return ds


def run_data(reference: Path, model) -> dict:
    """The `DATA_TASKS` through the reference's reader, datasets and evaluation forward (see the
    module's docstring)."""
    import yaml
    from torch.utils.data.dataloader import default_collate

    stub_data_imports(reference)
    from vilbert.datasets._image_features_reader import ImageFeaturesH5Reader
    from vilbert.datasets.nlvr2_dataset import NLVR2Dataset
    from vilbert.datasets.refer_expression_dataset import ReferExpressionDataset
    from vilbert.datasets.vqa_dataset import VQAClassificationDataset
    from vilbert.task_utils import ForwardModelsVal, LossMap

    cfg = yaml.safe_load((reference / "vilbert_tasks.yml").read_text())
    tokenizer, out = _Tokenizer(), {}
    no_answer = {"labels": [], "scores": []}
    entries = {
        "vqa": [
            {"question_id": q, "image_id": number(name), "question": sentence(n, seed), "answer": dict(no_answer)}
            for q, (name, n, seed) in enumerate(VQA)
        ],
        "refcoco+": [
            {"caption": sentence(n, seed), "sent_id": q, "image_id": number(name), "refBox": BOX, "ref_id": q}
            for q, (name, n, seed) in enumerate(REFCOCO)
        ],
        "nlvr2": [
            {
                "question_id": q,
                "image_id_0": number(pair[0]),
                "image_id_1": number(pair[1]),
                "sentence": sentence(n, seed),
                "answer": {"labels": [q % 2], "scores": [1.0]},
            }
            for q, (pair, n, seed) in enumerate(NLVR2)
        ],
    }
    classes = {"vqa": VQAClassificationDataset, "refcoco+": ReferExpressionDataset, "nlvr2": NLVR2Dataset}
    cuda = torch.Tensor.cuda
    with tempfile.TemporaryDirectory() as tmp:
        _write_lmdb(Path(tmp) / "feats.lmdb")
        reader = ImageFeaturesH5Reader(str(Path(tmp) / "feats.lmdb"))
        try:
            torch.Tensor.cuda = lambda self, *args, **kwargs: self  # its evaluation moves batches to a GPU
            for task, task_id in DATA_TASKS.items():
                settings = cfg[task_id]
                ds = _dataset(classes[task], reader, tokenizer, settings, entries[task], "val", LABELS[task])
                if task == "refcoco+":
                    ds.tokenize()
                else:
                    ds.tokenize(settings["max_seq_length"])
                ds.tensorize()
                batch = default_collate([ds[i] for i in range(len(ds))])
                outputs = []

                def forward(*args):
                    outputs.append(model(*args))
                    return outputs[-1]

                losses = {task_id: LossMap[settings["loss"]]}
                with torch.no_grad():
                    ForwardModelsVal(None, cfg, "cpu", task_id, batch, forward, losses)
                named = dict(zip(OUTPUTS, outputs[0]))
                head = named[HEAD_OF[task]]
                out[task] = {
                    "max_text": settings["max_seq_length"],
                    "region_slots": settings["max_region_num"],
                    "logits": kept(HEAD_OF[task], head),
                    "choice": [int(i) for i in head.reshape(head.shape[0], -1).argmax(1)],
                }
        finally:
            torch.Tensor.cuda = cuda
    return out


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
            out["data"] = run_data(args.reference, model)
        else:
            logits = run(model, x)
            case.update({name: kept(name, logits[name]) for name in dict.fromkeys(HEAD_OF.values())})
        out["task_tokens" if tokens else "plain"] = case
    FIXTURE.write_text(json.dumps(out) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
