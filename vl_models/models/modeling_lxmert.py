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
import torch.nn.functional as F
from torch import nn

from vl_models.models.configuration import LxmertConfig
from vl_models.models.layers import (
    Intermediate,
    MultiHeadAttention,
    ResidualOutput,
    SelfAttentionBlock,
    TextEmbeddings,
    TransformerLayer,
    at_positions,
    init_bert_weights,
    sdpa_mask,
)


@dataclass
class LxmertModelOutput:
    language_output: torch.Tensor  # (B, L, H) last cross-modality layer, language side ((B, 1, H): pooled_only)
    vision_output: Optional[torch.Tensor]  # (B, N, H) last cross-modality layer, vision side (None: pooled_only)
    pooled_output: torch.Tensor  # (B, H) tanh(Linear) of the [CLS] language state


class LxmertCrossAttentionLayer(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.att = MultiHeadAttention(h, h, h, cfg.num_attention_heads, cfg.attention_probs_dropout_prob)
        self.output = ResidualOutput(h, h, cfg.layer_norm_eps, cfg.hidden_dropout_prob)

    def forward(
        self, hidden: torch.Tensor, context: torch.Tensor, context_mask: Optional[torch.Tensor]
    ) -> torch.Tensor:
        return self.output(self.att(hidden, context, context_mask), hidden)


def _self_attention(cfg: LxmertConfig) -> SelfAttentionBlock:
    return SelfAttentionBlock(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.layer_norm_eps,
        cfg.hidden_dropout_prob,
        cfg.attention_probs_dropout_prob,
    )


def _layer(cfg: LxmertConfig) -> TransformerLayer:
    return TransformerLayer(
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.layer_norm_eps,
        cfg.hidden_dropout_prob,
        cfg.attention_probs_dropout_prob,
    )


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

    def forward(
        self,
        lang: torch.Tensor,
        lang_mask: Optional[torch.Tensor],
        visn: torch.Tensor,
        visn_mask: Optional[torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lang_x = self.visual_attention(lang, visn, visn_mask)
        visn_x = self.visual_attention(visn, lang, lang_mask)
        lang_s = self.lang_self_att(lang_x, lang_mask)
        visn_s = self.visn_self_att(visn_x, visn_mask)
        return self.lang_output(self.lang_inter(lang_s), lang_s), self.visn_output(self.visn_inter(visn_s), visn_s)

    def first_token(
        self,
        lang: torch.Tensor,
        lang_mask: Optional[torch.Tensor],
        visn: torch.Tensor,
        visn_mask: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """`forward`'s language output at the first token alone (B, 1, H): the [CLS] state the
        pooler reads. The visual side and the other tokens' self-attention queries and
        feed-forward networks, which nothing after the last layer reads, are skipped."""
        lang_x = self.visual_attention(lang, visn, visn_mask)
        first = lang_x[:, :1]
        block = self.lang_self_att
        lang_s = block.output(block.self(first, lang_x, lang_mask), first)
        return self.lang_output(self.lang_inter(lang_s), lang_s)


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
        self.embeddings = TextEmbeddings(
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.max_position_embeddings,
            cfg.type_vocab_size,
            cfg.layer_norm_eps,
            cfg.hidden_dropout_prob,
            padding_idx=0,
        )
        self.encoder = LxmertEncoder(cfg)
        self.pooler = LxmertPooler(cfg)
        self.apply(lambda m: init_bert_weights(m, cfg.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        visual_feats: torch.Tensor,
        visual_pos: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        visual_attention_mask: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        pooled_only: bool = False,
    ) -> LxmertModelOutput:
        lang = self.encode_text(input_ids, attention_mask, token_type_ids)
        visn = self.encode_vision(visual_feats, visual_pos, visual_attention_mask)
        return self.cross(
            lang,
            attention_mask if attention_mask is not None else torch.ones_like(input_ids),
            visn,
            visual_attention_mask,
            pooled_only,
        )

    # The language and object-relationship encoders see one modality each: retrieval computes
    # them once per caption and once per image, and only `cross` per pair.
    def encode_text(self, input_ids, attention_mask=None, token_type_ids=None) -> torch.Tensor:
        """The language encoder's output (B, L, H)."""
        mask = sdpa_mask(attention_mask if attention_mask is not None else torch.ones_like(input_ids))
        lang = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder.layer:
            lang = layer(lang, mask)
        return lang

    def encode_vision(self, visual_feats, visual_pos, visual_attention_mask=None) -> torch.Tensor:
        """The object-relationship encoder's output (B, N, H)."""
        mask = sdpa_mask(visual_attention_mask)
        visn = self.encoder.visn_fc(visual_feats, visual_pos)
        for layer in self.encoder.r_layers:
            visn = layer(visn, mask)
        return visn

    def cross(self, lang, attention_mask, visn, visual_attention_mask, pooled_only: bool = False) -> LxmertModelOutput:
        """The cross-modality encoder and the pooler over both encoders' outputs. With
        `pooled_only` (heads that read the pooled vector alone) the last layer computes the
        [CLS] state only (`LxmertXLayer.first_token`): ``language_output`` is (B, 1, H) and
        ``vision_output`` None; the pooled vector is the same."""
        lang_mask, visn_mask = sdpa_mask(attention_mask), sdpa_mask(visual_attention_mask)
        layers = list(self.encoder.x_layers)
        last = layers.pop() if pooled_only and layers else None
        for layer in layers:
            lang, visn = layer(lang, lang_mask, visn, visn_mask)
        if last is not None:
            lang, visn = last.first_token(lang, lang_mask, visn, visn_mask), None
        return LxmertModelOutput(lang, visn, self.pooler(lang))


@dataclass
class LxmertPreTrainingOutput:
    lm_logits: torch.Tensor  # (B, L, vocab), or (M, vocab) at `lm_positions`
    matched_logits: torch.Tensor  # (B, 2); index 1 = the text matches the image
    obj_logits: torch.Tensor  # (B, N, num_object_labels)
    attr_logits: torch.Tensor  # (B, N, num_attr_labels)
    feat_pred: torch.Tensor  # (B, N, visual_feat_dim), or (M, visual_feat_dim) at `feat_positions`
    answer_logits: torch.Tensor  # (B, num_qa_labels)
    model: LxmertModelOutput


class LxmertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(hidden)))


class LxmertLMPredictionHead(nn.Module):
    def __init__(self, cfg: LxmertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = LxmertPredictionHeadTransform(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden)) + self.bias


class LxmertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: LxmertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = LxmertLMPredictionHead(cfg, word_embeddings)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


class LxmertVisualObjHead(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.transform = LxmertPredictionHeadTransform(cfg)
        self.decoder_dict = nn.ModuleDict(
            {
                "obj": nn.Linear(cfg.hidden_size, cfg.num_object_labels),
                "attr": nn.Linear(cfg.hidden_size, cfg.num_attr_labels),
                "feat": nn.Linear(cfg.hidden_size, cfg.visual_feat_dim),
            }
        )


class LxmertVisualAnswerHead(nn.Module):
    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        h = cfg.hidden_size
        self.logit_fc = nn.Sequential(
            nn.Linear(h, 2 * h),
            nn.GELU(),
            nn.LayerNorm(2 * h, eps=cfg.layer_norm_eps),
            nn.Linear(2 * h, cfg.num_qa_labels),
        )


class LxmertForPreTraining(nn.Module):
    """The backbone and the five pretraining heads: masked LM (decoder tied to the word
    embeddings), cross-modality matching, object / attribute classification and feature
    regression from the vision states, and image QA from the pooled state. Names match
    `transformers.LxmertForPreTraining` (``lxmert.``, ``cls.``, ``obj_predict_head.``,
    ``answer_head.``)."""

    def __init__(self, cfg: LxmertConfig):
        super().__init__()
        self.cfg = cfg
        self.lxmert = LxmertModel(cfg)
        self.cls = LxmertPreTrainingHeads(cfg, self.lxmert.embeddings.word_embeddings)
        self.obj_predict_head = LxmertVisualObjHead(cfg)
        self.answer_head = LxmertVisualAnswerHead(cfg)
        for head in (self.cls, self.obj_predict_head, self.answer_head):
            head.apply(
                lambda m: init_bert_weights(m, cfg.initializer_range) if not isinstance(m, nn.Embedding) else None
            )
        self.cls.predictions.decoder.weight = self.lxmert.embeddings.word_embeddings.weight
        # The lookup's gradient (a few rows) is added into the tied decoder's dense one instead of
        # a zero-filled vocab x hidden copy of its own (~6 % of an LXMERT-base CPU step).
        self.lxmert.embeddings.word_embeddings.sparse = True

    def forward(
        self,
        input_ids,
        visual_feats,
        visual_pos,
        attention_mask=None,
        visual_attention_mask=None,
        token_type_ids=None,
        lm_positions: Optional[torch.Tensor] = None,
        feat_positions: Optional[torch.Tensor] = None,
    ) -> LxmertPreTrainingOutput:
        """``lm_positions`` (B, L) / ``feat_positions`` (B, N) boolean: decode the masked LM
        and the feature regression only there (row-major order), as training needs; the
        30k-word LM decoder over every token is the single largest head."""
        out = self.lxmert(input_ids, visual_feats, visual_pos, attention_mask, visual_attention_mask, token_type_ids)
        visual = self.obj_predict_head.transform(out.vision_output)
        decoders = self.obj_predict_head.decoder_dict
        return LxmertPreTrainingOutput(
            lm_logits=self.cls.predictions(at_positions(out.language_output, lm_positions)),
            matched_logits=self.cls.seq_relationship(out.pooled_output),
            obj_logits=decoders["obj"](visual),
            attr_logits=decoders["attr"](visual),
            feat_pred=decoders["feat"](at_positions(visual, feat_positions)),
            answer_logits=self.answer_head.logit_fc(out.pooled_output),
            model=out,
        )
