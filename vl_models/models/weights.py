"""Model weights in and out, with strict key accounting.

Reads `transformers.LxmertModel` checkpoints (``pytorch_model.bin`` or
``model.safetensors``; keys ``embeddings.*``, ``encoder.*``, ``pooler.*``) and original
airsplay/lxmert ``.pth`` files (``module.`` and ``bert.`` prefixes stripped, as the HF
conversion does). Writes our models as Hugging Face folders (`export_hf`: model.safetensors,
config.json, tokenizer files): LXMERT as `transformers.LxmertModel` /
`LxmertForPreTraining`; ViLBERT, which transformers has no class for, for `load_exported`,
with its text stream also as a `transformers.BertModel` folder. A load that leaves a
parameter unfilled or a tensor unused fails listing the keys; the position-id buffer some
HF versions store is the only key dropped, by name, and a tied LM decoder left out of a
safetensors file is tied again. ViLBERT: vilbert-multi-task checkpoints (``bert.*`` backbone,
``cls.*`` pretraining heads, and the fine-tuned task heads ``vil_prediction`` & co, handed
back by name for the tasks that use them). BERT checkpoints (`BertForPreTraining` as the
hub's ``bert-base-uncased/``, old ``gamma/beta`` names included, or a bare `BertModel` such
as MiniLM) initialize either model's text side (`init_from_bert`). `init_pretraining` reads a
`vltrain pretrain --init` checkpoint: BERT's layout here, the model's own through its family.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import torch

from pipeline.errors import ConfigError
from pipeline.state_dicts import mismatch
from vl_models.data.tokenize import WordPiece
from vl_models.models.configuration import LxmertConfig, ModelConfig, ViLBERTConfig
from vl_models.models.modeling_lxmert import LxmertForPreTraining, LxmertModel
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining, ViLBERTModel

_DROPPABLE = ("embeddings.position_ids",)


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (path / name).exists():
                return read_state_dict(path / name)
        raise ConfigError(f"{path}: no model.safetensors or pytorch_model.bin inside")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # an empty, truncated or foreign file: safetensors' own errors
            raise ConfigError(f"{path}: not a readable safetensors file ({type(err).__name__}: {err})") from err
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ConfigError(f"{path}: cannot read as a torch checkpoint ({describe_load_error(err)})") from err
    if not isinstance(state, dict):
        raise ConfigError(f"{path}: a torch file of a {type(state).__name__}, not of a model's tensors")
    return state.get("model", state) if isinstance(state.get("model"), dict) else state


def describe_load_error(err: BaseException) -> str:
    """One line for a failed ``torch.load(..., weights_only=True)``: what is wrong with the
    file, without torch's advice to load it with ``weights_only=False`` or to allow more
    globals (either would run the file's code)."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
        text = re.split(r"\. Please use `torch\.serialization|\n\s*Check the documentation", text)[0]
        text = f"it holds what is no tensor or plain value: {' '.join(text.split()).rstrip('.')}; not loaded"
    elif "weights_only" in text:
        text = "not a torch checkpoint of tensors"
    else:
        text = " ".join(text.split())
    return f"{type(err).__name__}: {text}"


def _normalize(key: str) -> str:
    for prefix in ("module.", "bert.", "lxmert."):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key


def check_keys(expected: dict[str, torch.Tensor], state: dict[str, torch.Tensor], what: str) -> None:
    """Raise ConfigError listing missing, unexpected and misshaped keys, if any (one line)."""
    problems = mismatch(expected, state)
    if problems:
        raise ConfigError(f"checkpoint does not match {what}: {problems}")


def _load_strict(source: Union[Path, dict], model, what: str):
    state = read_state_dict(source) if not isinstance(source, dict) else source
    state = {_normalize(k): v for k, v in state.items() if _normalize(k) not in _DROPPABLE}
    check_keys(model.state_dict(), state, what)
    model.load_state_dict(state, strict=True)
    return model


def load_lxmert(source: Union[Path, dict], cfg: LxmertConfig) -> LxmertModel:
    """An `LxmertModel` for `cfg` filled from a checkpoint path or a state dict."""
    return _load_strict(source, LxmertModel(cfg), f"LXMERT config {cfg.name!r}")


def load_vilbert(source: Union[Path, dict], cfg: ViLBERTConfig) -> ViLBERTModel:
    """A `ViLBERTModel` filled from a vilbert-multi-task checkpoint's ``bert.*`` tensors
    (or our own state dict). Task and pretraining heads are loaded with their tasks."""
    return _load_strict(source, ViLBERTModel(cfg), f"ViLBERT config {cfg.name!r}")


# vilbert-multi-task's `VILBertForVLTasks` heads (VQA, GQA, NLVR2, retrieval/VCR, SNLI-VE,
# RefCOCO, and the text-side logit; "linguisic" is the reference's spelling).
VILBERT_TASK_HEADS = (
    "vil_prediction",
    "vil_prediction_gqa",
    "vil_binary_prediction",
    "vil_logit",
    "vil_tri_prediction",
    "vision_logit",
    "linguisic_logit",
)


def load_vilbert_pretraining(
    source: Union[Path, dict], cfg: ViLBERTConfig
) -> tuple[ViLBERTForPreTraining, dict[str, dict[str, torch.Tensor]]]:
    """`ViLBERTForPreTraining` from a vilbert-multi-task checkpoint (``pretrained_model.bin``:
    ``bert.*`` + ``cls.*``; a fine-tuned ``multi_task_model.bin`` adds task heads), strictly.
    Task-head tensors come back grouped by head, e.g. ``{"vil_prediction": {"logit_fc.0.weight":
    ...}}``; any other stray key is an error. Alignment keeps the reference's 0 = aligned."""
    state = read_state_dict(source) if not isinstance(source, dict) else source
    state = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}
    heads: dict[str, dict[str, torch.Tensor]] = {}
    model_state = {}
    for key, value in state.items():
        head = key.split(".", 1)[0]
        if head in VILBERT_TASK_HEADS:
            heads.setdefault(head, {})[key.split(".", 1)[1]] = value
        elif key not in ("bert." + k for k in _DROPPABLE):
            model_state[key] = value
    model = ViLBERTForPreTraining(cfg)
    check_keys(model.state_dict(), model_state, f"ViLBERT pretraining model {cfg.name!r}")
    model.load_state_dict(model_state, strict=True)
    return model, heads


def init_pretraining(model, source: Path, load_own: Callable[[Any, dict], str]) -> str:
    """Fill a pretraining model from a checkpoint, strictly; returns what was loaded. A BERT
    checkpoint (`BertForPreTraining` or `BertModel`, e.g. ``bert-base-uncased/``) fills the
    text side of either model (`init_from_bert`); any other is the model's own format, read
    by `load_own(model, state)` (the model family's `load_checkpoint`)."""
    state = read_state_dict(source)
    if _is_bert(state):
        left_out = init_from_bert(model, state)
        return "BERT text side" + (f" (BERT's {', '.join(left_out)} left out)" if left_out else "")
    return load_own(model, state)


# Tensors of a vision-and-language checkpoint that a plain BERT one never has.
_NOT_BERT = (
    ".c_layer.",
    ".v_layer.",
    "v_embeddings.",
    "x_layers.",
    "r_layers.",
    "visn_fc.",
    "obj_predict_head.",
    "answer_head.",
    "imagePredictions.",
    "bi_seq_relationship.",
)


# LXMERT's `AnswerTable.ANS_CONVERT` (airsplay/lxmert src/pretrain/qa_answer_table.py).
_LXMERT_ANSWER_CONVERT = {
    "a man": "man",
    "the man": "man",
    "a woman": "woman",
    "the woman": "woman",
    **dict(zip("one two three four five six seven eight nine ten".split(), map(str, range(1, 11)))),
    "grey": "gray",
}


def lxmert_answer_key(answer: str) -> str:
    """An answer as LXMERT's `AnswerTable.convert_ans` spells it before looking it up in the
    pretraining QA table: lower case, one trailing period dropped, a leading article ("a ",
    "an ", "the ") dropped, then a few answers mapped (``two`` -> ``2``, ``grey`` -> ``gray``, ...)."""
    if not answer:
        return ""
    answer = answer.lower()
    if answer.endswith("."):
        answer = answer[:-1].strip()
    for article in ("a ", "an ", "the "):
        if answer.startswith(article):
            answer = answer[len(article) :].strip()
    return _LXMERT_ANSWER_CONVERT.get(answer, answer)


def copy_answer_rows(
    head: torch.nn.Linear,
    weight: torch.Tensor,
    bias: torch.Tensor,
    old_answers: Sequence[str],
    new_answers: Sequence[str],
) -> int:
    """Initialize an answer classifier (`head`: one output row per entry of `new_answers`)
    from a trained one (`weight`, `bias`, one row per entry of `old_answers`) by answer
    string, as LXMERT's fine-tuning does with its pretraining QA head (`load_lxmert_qa`): a
    new answer, converted as LXMERT converts it (`lxmert_answer_key`), that the old table has
    exactly gets that row (several new answers converting to one old answer each get it; an
    old table with an answer twice, which LXMERT's never has: its first row); every other row
    is zeroed, weight and bias.
    Returns how many rows were copied."""
    if weight.shape != (len(old_answers), head.in_features) or bias.shape != (len(old_answers),):
        raise ConfigError(
            f"answer head of {tuple(weight.shape)} / {tuple(bias.shape)} for {len(old_answers)} answers "
            f"and width {head.in_features}: the checkpoint's head does not match its answer table"
        )
    if head.out_features != len(new_answers):
        raise ConfigError(f"the new answer head has {head.out_features} rows for {len(new_answers)} answers")
    old_row = {}
    for i, answer in enumerate(old_answers):
        old_row.setdefault(answer, i)
    pairs = [(j, old_row[key]) for j, key in enumerate(map(lxmert_answer_key, new_answers)) if key in old_row]
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        if pairs:
            new, old = (torch.tensor(index) for index in zip(*pairs))
            head.weight[new] = weight[old].to(head.weight.dtype)
            head.bias[new] = bias[old].to(head.bias.dtype)
    return len(pairs)


def _is_bert(state: dict) -> bool:
    return any("encoder.layer." in k for k in state) and not any(part in k for k in state for part in _NOT_BERT)


def _bert_key(key: str) -> str:
    """A BERT checkpoint key in today's spelling, under ``bert.`` / ``cls.``: ``module.``
    dropped, the original release's ``LayerNorm.gamma/beta`` read as ``weight/bias``, a bare
    `BertModel`'s keys put under ``bert.``."""
    key = key[len("module.") :] if key.startswith("module.") else key
    key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
    return key if key.startswith(("bert.", "cls.")) else "bert." + key


def init_from_bert(model, source: Union[Path, dict]) -> list[str]:
    """Fill the text side of a pretraining model from a BERT checkpoint, by name as the
    references do (vilbert-multi-task's and airsplay/lxmert's ``from_pretrained``):
    embeddings, the first text layers (ViLBERT: all `num_hidden_layers`; LXMERT: the
    `l_layers` language layers), LXMERT's pooler, and BERT's masked-LM head into the LM head
    (its decoder is tied to the word embeddings). Every one of those parameters must be
    filled, with the same shape; a `BertModel` without MLM head leaves the LM head as
    initialized. LXMERT's matching head takes BERT's next-sentence head (same name and
    shape, as airsplay's loader does). Returns what BERT has that the model does not use
    (ViLBERT: the pooler, ViLBERT pools into the co-attention width, and the next-sentence
    head; LXMERT: layers beyond `l_layers`); any other tensor is an error."""
    state = read_state_dict(source) if not isinstance(source, dict) else source
    lxmert = isinstance(model, LxmertForPreTraining)
    prefix, depth = ("lxmert.", model.cfg.l_layers) if lxmert else ("bert.", model.cfg.num_hidden_layers)
    state = {_bert_key(k): v for k, v in state.items()}
    if "cls.predictions.decoder.bias" in state and "cls.predictions.bias" not in state:  # some older files
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]
    tied = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")  # the word embeddings; the bias
    state = {k: v for k, v in state.items() if k not in tied and k[len("bert.") :] not in _DROPPABLE}
    has_head = any(k.startswith("cls.predictions.") for k in state)
    # LXMERT's matching head has BERT's next-sentence head's name and shape: airsplay loads it.
    has_nsp = lxmert and any(k.startswith("cls.seq_relationship.") for k in state)
    text_side = (
        (prefix + "embeddings.", prefix + "encoder.layer.")
        + ((prefix + "pooler.",) if lxmert else ())
        + (("cls.predictions.",) if has_head else ())
        + (("cls.seq_relationship.",) if has_nsp else ())
    )
    expected = {k: v for k, v in model.state_dict().items() if k.startswith(text_side) and k not in tied}
    renamed, left_out = {}, set()
    for key, value in state.items():
        ours = prefix + key[len("bert.") :] if key.startswith("bert.") else key
        layer = re.match(r"bert\.encoder\.layer\.(\d+)\.", key)
        if not lxmert and key.startswith(("cls.seq_relationship.", "bert.pooler.")):
            left_out.add(key.rsplit(".", 1)[0])
        elif layer and int(layer.group(1)) >= depth and lxmert:
            left_out.add(layer.group(0).rstrip("."))
        else:
            renamed[ours] = value
    what = "LXMERT's language side" if lxmert else "ViLBERT's text stream"
    check_keys(
        expected, renamed, f"{what} and LM head ({depth} layers x {model.cfg.hidden_size}) of {model.cfg.name!r}"
    )
    model.load_state_dict(renamed, strict=False)  # exactly `expected`: accounted for by check_keys above
    return sorted(left_out, key=lambda k: [int(p) if p.isdigit() else p for p in k.split(".")])


def load_lxmert_pretraining(source: Union[Path, dict], cfg: LxmertConfig) -> LxmertForPreTraining:
    """`LxmertForPreTraining` from an HF `LxmertForPreTraining` checkpoint or an original
    airsplay ``.pth`` (``module.`` stripped, ``bert.`` read as ``lxmert.``), strictly."""
    state = read_state_dict(source) if not isinstance(source, dict) else source
    renamed = {}
    for key, value in state.items():
        key = key[len("module.") :] if key.startswith("module.") else key
        key = "lxmert." + key[len("bert.") :] if key.startswith("bert.") else key
        if key[len("lxmert.") :] not in _DROPPABLE:
            renamed[key] = value
    model = LxmertForPreTraining(cfg)
    retie(model, renamed)
    check_keys(model.state_dict(), renamed, f"LXMERT pretraining model {cfg.name!r}")
    model.load_state_dict(renamed, strict=True)
    return model


def _tied(model) -> dict[str, str]:
    """{key: the earlier key it shares its tensor with} (the LM decoder tied to the word embeddings)."""
    first: dict = {}
    tied = {}
    for key, value in model.state_dict().items():
        ident = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if ident in first:
            tied[key] = first[ident]
        else:
            first[ident] = key
    return tied


def retie(model, state: dict) -> None:
    """Fill a tied key that a file leaves out (safetensors stores a shared tensor once) from
    the key it is tied to in `model`."""
    for key, partner in _tied(model).items():
        if key not in state and partner in state:
            state[key] = state[partner]


EXPORT_FILES = (
    "model.safetensors",
    "config.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "text_stream",
)  # what `export_hf` writes (text_stream/: ViLBERT)


def _save_safetensors(model, path: Path) -> None:
    """model.safetensors (tied weights once). safetensors reports a failed write (a full
    disk) as a SafetensorError with the OS error number in its text: raised here as that
    OSError, naming the file."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tied = _tied(model)
    try:
        save_file(
            {k: v.contiguous() for k, v in model.state_dict().items() if k not in tied},
            str(path),
            metadata={"format": "pt"},
        )
    except SafetensorError as err:
        number = re.search(r"os error (\d+)", str(err))
        if number is None:
            raise
        raise OSError(int(number.group(1)), os.strerror(int(number.group(1))), str(path)) from err
    _usual_mode(path)


def _usual_mode(path: Path) -> None:
    """Give a file safetensors wrote (0600, as a temporary file) the mode `open` gives the
    export's other files: 0666 less the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


def export_hf(model, folder: Path, tokenizer: Optional[WordPiece] = None, provenance: Optional[dict] = None) -> None:
    """Write `model` as a Hugging Face folder: model.safetensors (tied weights once), config.json
    and, given a tokenizer, its files. LXMERT (`LxmertModel` or `LxmertForPreTraining`) loads
    with the transformers class of that name; ViLBERT (`ViLBERTForPreTraining`) with
    `load_exported`, and its text stream (embeddings and text layers, without co-attention)
    from ``text_stream/`` as a `transformers.BertModel`. config.json carries a ``vltrain``
    record (our config, the class, `provenance`): `load_exported` reads it, and it marks the
    folder as ours."""
    cfg, architecture = getattr(model, "cfg", None), type(model).__name__
    if not isinstance(cfg, ModelConfig):
        raise ConfigError(
            f"cannot export a {architecture}: not a model of a vltrain model family (its .cfg is no ModelConfig)"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"kind": cfg.model_type, "architecture": architecture, "config": cfg.to_json(), **(provenance or {})}
    config = {"model_type": cfg.model_type, "architectures": [architecture], **cfg.hf_config()}
    if isinstance(model, ViLBERTForPreTraining):  # no transformers class: its text stream as a BertModel
        _export_bert_text_stream(model.bert, folder / "text_stream", tokenizer)
    _save_safetensors(model, folder / "model.safetensors")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder, cfg.max_position_embeddings)
    (folder / "config.json").write_text(json.dumps({**config, "vltrain": record}, indent=2) + "\n")


def _export_bert_text_stream(model: ViLBERTModel, folder: Path, tokenizer: Optional[WordPiece]) -> None:
    """ViLBERT's embeddings and text layers (BERT's names) as a `transformers.BertModel`
    folder without pooler (load it with ``add_pooling_layer=False``); a task-token table
    stays behind (BERT has none)."""
    from safetensors.torch import save_file

    cfg = model.cfg
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if k.startswith(("embeddings.", "encoder.layer.")) and not k.startswith("embeddings.task_embeddings.")
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _usual_mode(folder / "model.safetensors")
    config = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": cfg.hidden_dropout_prob,
        "attention_probs_dropout_prob": cfg.attention_probs_dropout_prob,
        "max_position_embeddings": cfg.max_position_embeddings,
        "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range,
        "layer_norm_eps": cfg.layer_norm_eps,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder, cfg.max_position_embeddings)


def exported_record(folder: Path) -> Optional[dict]:
    """The ``vltrain`` record of an `export_hf` folder's config.json; None if it is not one."""
    try:
        record = json.loads((Path(folder) / "config.json").read_text()).get("vltrain")
    except (OSError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) and "architecture" in record else None


def load_exported(folder: Path):
    """Our model from an `export_hf` folder (either family), strictly."""
    record = exported_record(folder)
    if record is None:
        raise ConfigError(f"{folder}: not a vltrain export (config.json has no 'vltrain' record)")
    classes = {
        "LxmertModel": (LxmertConfig, LxmertModel),
        "LxmertForPreTraining": (LxmertConfig, LxmertForPreTraining),
        "ViLBERTForPreTraining": (ViLBERTConfig, ViLBERTForPreTraining),
    }
    if record["architecture"] not in classes:
        raise ConfigError(f"{folder}: unknown architecture {record['architecture']!r}")
    config_cls, model_cls = classes[record["architecture"]]
    model = model_cls(config_cls.from_json(record["config"]))
    state = read_state_dict(Path(folder) / "model.safetensors")
    retie(model, state)
    check_keys(model.state_dict(), state, f"{record['architecture']} {record['config'].get('name')!r}")
    model.load_state_dict(state, strict=True)
    return model
