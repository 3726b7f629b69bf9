"""LXMERT: language encoder, object-relationship encoder, cross-modality encoder.

Module names follow the original implementation and `transformers.LxmertModel` one for
one (``embeddings.*``, ``encoder.visn_fc.*``, ``encoder.layer.N``, ``encoder.r_layers.N``,
``encoder.x_layers.N.{visual_attention, lang_self_att, visn_self_att, lang_inter,
lang_output, visn_inter, visn_output}``, ``pooler.*``), so their checkpoints load key for
key (see `weights.py`). The BERT-style blocks come from `layers.py` (SDPA attention,
boolean masks built once per batch).

Shapes: ``input_ids`` (B, L); ``visual_feats`` (B, N, 2048); ``visual_pos`` (B, N, 4)
normalized x1y1x2y2; masks (B, L) / (B, N), 1 = attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from vl_models.models.configuration import LxmertConfig
from vl_models.models.layers import (
    Intermediate, MultiHeadAttention, ResidualOutput, SelfAttentionBlock, TextEmbeddings, TransformerLayer,
    init_bert_weights, sdpa_mask,
)


@dataclass
class LxmertModelOutput:
    language_output: torch.Tensor  # (B, L, H) last cross-modality layer, language side
    vision_output: torch.Tensor  # (B, N, H) last cross-modality layer, vision side
    pooled_output: torch.Tensor  # (B, H) tanh(Linear) of the [CLS] language state


class LxmertCrossAttentionLayer(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.att = MultiHeadAttention(h, h, h, cfg.num_attention_heads, cfg.attention_probs_dropout_prob)
        self.output = ResidualOutput(h, h, cfg.layer_norm_eps, cfg.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, context: torch.Tensor, context_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.output(self.att(hidden, context, context_mask), hidden)


def _self_attention(cfg: LxmertConfig) -> SelfAttentionBlock:
    return SelfAttentionBlock(cfg.hidden_size, cfg.num_attention_heads, cfg.layer_norm_eps, cfg.hidden_dropout_prob,
                              cfg.attention_probs_dropout_prob)


def _layer(cfg: LxmertConfig) -> TransformerLayer:
    return TransformerLayer(cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size, cfg.layer_norm_eps,
                            cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob)


class LxmertXLayer(nn.Module):
    """Cross-modality layer: one cross-attention module shared by both directions, then
    self-attention per stream, then a feed-forward network per stream (all post-LN)."""

    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        h, inner, eps, p = cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps, cfg.hidden_dropout_prob
        self.visual_attention = LxmertCrossAttentionLayer(cfg)
        self.lang_self_att = _self_attention(cfg)
        self.visn_self_att = _self_attention(cfg)
        self.lang_inter = Intermediate(h, inner)
        self.lang_output = ResidualOutput(inner, h, eps, p)
        self.visn_inter = Intermediate(h, inner)
        self.visn_output = ResidualOutput(inner, h, eps, p)

    def forward(self, lang: torch.Tensor, lang_mask: Optional[torch.Tensor], visn: torch.Tensor,
                visn_mask: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lang_x = self.visual_attention(lang, visn, visn_mask)
        visn_x = self.visual_attention(visn, lang, lang_mask)
        lang_s = self.lang_self_att(lang_x, lang_mask)
        visn_s = self.visn_self_att(visn_x, visn_mask)
        return self.lang_output(self.lang_inter(lang_s), lang_s), self.visn_output(self.visn_inter(visn_s), visn_s)


class LxmertVisualFeatureEncoder(nn.Module):
    """(LN(W_f f) + LN(W_p p)) / 2, then dropout."""

    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.visn_fc = nn.Linear(cfg.visual_feat_dim, cfg.hidden_size)
        self.visn_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.box_fc = nn.Linear(cfg.visual_pos_dim, cfg.hidden_size)
        self.box_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, feats: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.visn_layer_norm(self.visn_fc(feats))
        y = self.box_layer_norm(self.box_fc(pos))
        return self.dropout((x + y) / 2)


class LxmertEncoder(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.visn_fc = LxmertVisualFeatureEncoder(cfg)
        self.layer = nn.ModuleList([_layer(cfg) for _ in range(cfg.l_layers)])
        self.x_layers = nn.ModuleList([LxmertXLayer(cfg) for _ in range(cfg.x_layers)])
        self.r_layers = nn.ModuleList([_layer(cfg) for _ in range(cfg.r_layers)])


class LxmertPooler(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


class LxmertModel(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = TextEmbeddings(cfg.vocab_size, cfg.hidden_size, cfg.max_position_embeddings, cfg.type_vocab_size,
                                         cfg.layer_norm_eps, cfg.hidden_dropout_prob, padding_idx=0)
        self.encoder = LxmertEncoder(cfg)
        self.pooler = LxmertPooler(cfg)
        self.apply(lambda m: init_bert_weights(m, cfg.initializer_range))

    def forward(self, input_ids: torch.Tensor, visual_feats: torch.Tensor, visual_pos: torch.Tensor,
                attention_mask: Optional[torch.Tensor] = None, visual_attention_mask: Optional[torch.Tensor] = None,
                token_type_ids: Optional[torch.Tensor] = None) -> LxmertModelOutput:
        lang_mask = sdpa_mask(attention_mask if attention_mask is not None else torch.ones_like(input_ids))
        visn_mask = sdpa_mask(visual_attention_mask)
        enc = self.encoder
        lang = self.embeddings(input_ids, token_type_ids)
        visn = enc.visn_fc(visual_feats, visual_pos)
        for layer in enc.layer:
            lang = layer(lang, lang_mask)
        for layer in enc.r_layers:
            visn = layer(visn, visn_mask)
        for layer in enc.x_layers:
            lang, visn = layer(lang, lang_mask, visn, visn_mask)
        return LxmertModelOutput(lang, visn, self.pooler(lang))
