"""Model configurations: frozen dataclasses, named JSON files in `model_configs/` (read by
`vl_models.families.load_config`: the file's ``model_type`` names the family)."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

from pipeline.config import Config, from_json
from pipeline.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "model_configs"


MAX_DIM = 1 << 16  # a width, count or length of a model (a config over it would allocate without end)
MAX_VOCAB = 1 << 22
POSITIVE = ("_size", "_heads", "_dim", "max_position_embeddings", "vocab_size")  # fields that must be >= 1


def check_fields(cfg) -> None:
    """ConfigError for a field of the wrong type or out of range, before any tensor is made of
    it (a config.json from elsewhere may say ``"hidden_size": "32"``, ``-32`` or ``10**9``):
    integers within ``0..MAX_DIM`` (the vocabulary up to `MAX_VOCAB`), widths, head counts and
    lengths at least 1; floats finite, dropout probabilities in [0, 1), epsilons above 0."""
    hints = typing.get_type_hints(type(cfg))
    for f in fields(cfg):
        value, kind = getattr(cfg, f.name), hints.get(f.name)
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"model config {f.name}: an integer, not {value!r}")
            top = MAX_VOCAB if f.name == "vocab_size" else MAX_DIM
            least = 1 if f.name.endswith(POSITIVE) else 0
            if not least <= value <= top:
                raise ConfigError(f"model config {f.name} {value}: out of range ({least}..{top:,})")
        elif kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"model config {f.name}: a finite number, not {value!r}")
            if f.name.endswith("_prob") and not 0 <= value < 1:
                raise ConfigError(f"model config {f.name} {value}: a probability in [0, 1)")
            if f.name.endswith("_eps") and value <= 0:
                raise ConfigError(f"model config {f.name} {value}: must be above 0")


def check_text_length(mcfg, length: int, given: str) -> None:
    """ConfigError, before any work, when texts of `length` tokens (`given`: the option that
    asks for them, as written) would not fit the model's position table (they would fail at the
    first long text, hours into a run)."""
    if length > mcfg.max_position_embeddings:
        raise ConfigError(
            f"{given}: {mcfg.name} has {mcfg.max_position_embeddings} text positions; "
            f"give {mcfg.max_position_embeddings} or fewer"
        )


@dataclass(frozen=True)
class ModelConfig(Config):
    """Base of the model configs: the BERT-style text encoder's settings both models share
    (BERT-base's values). ``model_type`` (a class attribute, not a field) is the name of the
    model family, the key a JSON file names its family with."""

    model_type: ClassVar[str]

    name: str = "bert-base"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        check_fields(self)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")

    def hf_config(self) -> dict:
        """The fields of a transformers config.json for this model ({}: no transformers class)."""
        return {}

    @classmethod
    def from_json(cls, obj: dict):
        return from_json(cls, obj, ignore=("model_type",))


@dataclass(frozen=True)
class LxmertConfig(ModelConfig):
    """LXMERT (Tan & Bansal 2019): 9 language, 5 object-relationship and 5 cross-modality
    layers at BERT-base width; field names follow `transformers.LxmertConfig`."""

    model_type: ClassVar[str] = "lxmert"

    name: str = "lxmert-base"
    l_layers: int = 9
    x_layers: int = 5
    r_layers: int = 5
    visual_feat_dim: int = 2048
    visual_pos_dim: int = 4
    num_qa_labels: int = 9500
    num_object_labels: int = 1600
    num_attr_labels: int = 400

    def hf_config(self) -> dict:
        """`transformers.LxmertConfig`'s fields (the same names), GELU, tied LM decoder."""
        fields = self.to_json()
        fields.pop("name")
        return {**fields, "hidden_act": "gelu", "tie_word_embeddings": True}


@dataclass(frozen=True)
class ViLBERTConfig(ModelConfig):
    """ViLBERT (Lu et al. 2019): a BERT text stream, a visual stream and co-attention
    blocks placed by `v_biattention_id` / `t_biattention_id` (vilbert-multi-task's
    `bert_base_6layer_6conect.json`)."""

    model_type: ClassVar[str] = "vilbert"

    name: str = "vilbert-base"
    num_hidden_layers: int = 12
    v_feature_size: int = 2048
    v_loc_size: int = 5
    v_target_size: int = 1601
    v_hidden_size: int = 1024
    v_num_hidden_layers: int = 6
    v_num_attention_heads: int = 8
    v_intermediate_size: int = 1024
    v_hidden_dropout_prob: float = 0.1
    v_attention_probs_dropout_prob: float = 0.1
    bi_hidden_size: int = 1024
    bi_num_attention_heads: int = 8
    bi_intermediate_size: int = 1024
    v_biattention_id: tuple[int, ...] = (0, 1, 2, 3, 4, 5)
    t_biattention_id: tuple[int, ...] = (6, 7, 8, 9, 10, 11)
    fusion_dropout: float = 0.1
    # Rows of the task-token table (vilbert-multi-task's ``--task_specific_tokens``: 20, the
    # token of task N of its vilbert_tasks.yml is row N); 0: no table, no task token. A published
    # checkpoint's table sets it (`transfer.published`), ``vltrain finetune --task-tokens`` makes one.
    task_tokens: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task_tokens < 0:
            raise ConfigError(f"task_tokens {self.task_tokens}: the task-token table's rows (0: none)")
        if len(self.v_biattention_id) != len(self.t_biattention_id):
            raise ConfigError("v_biattention_id and t_biattention_id must pair up (same length)")
        if list(self.v_biattention_id) != sorted(self.v_biattention_id) or list(self.t_biattention_id) != sorted(
            self.t_biattention_id
        ):
            raise ConfigError("co-attention ids must be increasing")
        if any(i > self.v_num_hidden_layers for i in self.v_biattention_id) or any(
            i > self.num_hidden_layers for i in self.t_biattention_id
        ):
            raise ConfigError("a co-attention id is beyond its stream's layer count")
        for size, heads in (
            (self.v_hidden_size, self.v_num_attention_heads),
            (self.bi_hidden_size, self.bi_num_attention_heads),
        ):
            if size % heads:
                raise ConfigError(f"hidden size {size} is not a multiple of {heads} heads")
