"""Model configurations: frozen dataclasses, named JSON files in `model_configs/`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Union

from pipeline.errors import ConfigError

CONFIG_DIR = Path(__file__).parent / "model_configs"


@dataclass(frozen=True)
class LxmertConfig:
    """LXMERT (Tan & Bansal 2019): 9 language, 5 object-relationship and 5 cross-modality
    layers at BERT-base width; field names follow `transformers.LxmertConfig`."""

    name: str = "lxmert-base"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    l_layers: int = 9
    x_layers: int = 5
    r_layers: int = 5
    visual_feat_dim: int = 2048
    visual_pos_dim: int = 4
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    num_qa_labels: int = 9500
    num_object_labels: int = 1600
    num_attr_labels: int = 400

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> "LxmertConfig":
        unknown = set(obj) - {f.name for f in fields(cls)} - {"model_type"}
        if unknown:
            raise ConfigError(f"unknown LXMERT config keys: {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in obj.items() if k != "model_type"})


def load_config(name_or_path: Union[str, Path]) -> LxmertConfig:
    path = Path(name_or_path)
    if not path.suffix:
        path = CONFIG_DIR / f"{name_or_path}.json"
    if not path.exists():
        known = ", ".join(p.stem for p in sorted(CONFIG_DIR.glob("*.json")))
        raise ConfigError(f"no model config {name_or_path!r} (known: {known}, or a .json path)")
    obj = json.loads(path.read_text())
    if obj.get("model_type", "lxmert") != "lxmert":
        raise ConfigError(f"{path}: model_type {obj.get('model_type')!r} is not built yet")
    return LxmertConfig.from_json(obj)
