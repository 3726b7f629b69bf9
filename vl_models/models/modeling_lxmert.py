"""LXMERT: language encoder, object-relationship encoder, cross-modality encoder.

Module names follow the original implementation and `transformers.LxmertModel` one for
one (``embeddings.*``, ``encoder.visn_fc.*``, ``encoder.layer.N``, ``encoder.r_layers.N``,
``encoder.x_layers.N.{visual_attention, lang_self_att, visn_self_att, lang_inter,
lang_output, visn_inter, visn_output}``, ``pooler.*``), so their checkpoints load key for
key (see `weights.py`). Attention runs through `F.scaled_dot_product_attention`, with the
boolean masks built once per batch.

Shapes: ``input_ids`` (B, L); ``visual_feats`` (B, N, 2048); ``visual_pos`` (B, N, 4)
normalized x1y1x2y2; masks (B, L) / (B, N), 1 = attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vl_models.models.configuration import LxmertConfig


@dataclass
class LxmertModelOutput:
    language_output: torch.Tensor  # (B, L, H) last cross-modality layer, language side
    vision_output: torch.Tensor  # (B, N, H) last cross-modality layer, vision side
    pooled_output: torch.Tensor  # (B, H) tanh(Linear) of the [CLS] language state


class LxmertEmbeddings(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size, padding_idx=0)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size, padding_idx=0)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class LxmertAttention(nn.Module):
    """Multi-head attention of `hidden` over `context` (the same tensor for self-attention)."""

    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob

    def forward(self, hidden: torch.Tensor, context: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        b, lq, h = hidden.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(b, x.shape[1], self.heads, h // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            split(self.query(hidden)), split(self.key(context)), split(self.value(context)),
            attn_mask=mask, dropout_p=self.dropout_p if self.training else 0.0,
        )
        return out.transpose(1, 2).reshape(b, lq, h)


class LxmertAttentionOutput(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class LxmertCrossAttentionLayer(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.att = LxmertAttention(cfg)
        self.output = LxmertAttentionOutput(cfg)

    def forward(self, hidden: torch.Tensor, context: torch.Tensor, context_mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.output(self.att(hidden, context, context_mask), hidden)


class LxmertSelfAttentionLayer(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.self = LxmertAttention(cfg)
        self.output = LxmertAttentionOutput(cfg)

    def forward(self, hidden: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        return self.output(self.self(hidden, hidden, mask), hidden)


class LxmertIntermediate(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden))


class LxmertOutput(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class LxmertLayer(nn.Module):
    """A single-modality transformer layer (language or object-relationship encoder)."""

    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.attention = LxmertSelfAttentionLayer(cfg)
        self.intermediate = LxmertIntermediate(cfg)
        self.output = LxmertOutput(cfg)

    def forward(self, hidden: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        attended = self.attention(hidden, mask)
        return self.output(self.intermediate(attended), attended)


class LxmertXLayer(nn.Module):
    """Cross-modality layer: one cross-attention module shared by both directions, then
    self-attention per stream, then a feed-forward network per stream (all post-LN)."""

    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.visual_attention = LxmertCrossAttentionLayer(cfg)
        self.lang_self_att = LxmertSelfAttentionLayer(cfg)
        self.visn_self_att = LxmertSelfAttentionLayer(cfg)
        self.lang_inter = LxmertIntermediate(cfg)
        self.lang_output = LxmertOutput(cfg)
        self.visn_inter = LxmertIntermediate(cfg)
        self.visn_output = LxmertOutput(cfg)

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
        self.layer = nn.ModuleList([LxmertLayer(cfg) for _ in range(cfg.l_layers)])
        self.x_layers = nn.ModuleList([LxmertXLayer(cfg) for _ in range(cfg.x_layers)])
        self.r_layers = nn.ModuleList([LxmertLayer(cfg) for _ in range(cfg.r_layers)])


class LxmertPooler(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[:, 0]))


def sdpa_mask(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """(B, T) 1/0 -> (B, 1, 1, T) boolean mask for scaled_dot_product_attention (True = attend)."""
    return None if mask is None else mask.bool()[:, None, None, :]


class LxmertModel(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = LxmertEmbeddings(cfg)
        self.encoder = LxmertEncoder(cfg)
        self.pooler = LxmertPooler(cfg)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """BERT initialization: N(0, 0.02) weights, zero biases, unit LayerNorms."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.initializer_range)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

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
