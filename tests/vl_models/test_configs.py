"""The shipped model configs: narrow models initialize at a scale that suits their width."""

import math

import pytest
import torch

from vl_models.families import load_config
from vl_models.models.configuration import CONFIG_DIR
from vl_models.models.modeling_lxmert import LxmertModel

NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


@pytest.mark.parametrize("name", NAMES)
def test_initializer_range_scales_with_width(name):
    """BERT-base's 0.02 at width 768, 0.02 * sqrt(768 / d) at width d: at width 32, 0.02 lets
    each layer pass ~0.1 of its input's scale and the pair heads get almost no gradient."""
    cfg = load_config(name)
    assert cfg.initializer_range == pytest.approx(0.02 * math.sqrt(768 / cfg.hidden_size), abs=5e-4), name
    if cfg.hidden_size >= 768:
        assert cfg.initializer_range == 0.02  # the references' value, unchanged


@pytest.mark.parametrize("name", ["lxmert-tiny", "lxmert-small"])
def test_a_narrow_model_passes_its_input_scale_on_like_bert_base(name):
    """The symptom: a hidden -> hidden projection of an initialized narrow model scales its
    input's std by weight std * sqrt(width): 0.55 in BERT-base, 0.11 at width 32 with 0.02."""
    torch.manual_seed(0)
    model = LxmertModel(load_config(name))
    dense = model.pooler.dense
    gain = dense.weight.std().item() * math.sqrt(dense.in_features)
    assert gain == pytest.approx(0.02 * math.sqrt(768), rel=0.15)
