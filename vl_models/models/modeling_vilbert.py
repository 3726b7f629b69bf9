"""ViLBERT: a BERT text stream and a visual stream exchanging information through
co-attention blocks.

Module names follow facebookresearch/vilbert-multi-task (`vilbert/vilbert.py`) under its
``bert.`` prefix, so its checkpoints load key for key (see `weights.py`):
``embeddings``, ``v_embeddings.{image_embeddings, image_location_embeddings, LayerNorm}``,
``encoder.layer.N`` (text), ``encoder.v_layer.N`` (visual), ``encoder.c_layer.N`` with
``biattention.{query1,key1,value1,query2,key2,value2}``,
``biOutput.{dense1,LayerNorm1,q_dense1,dense2,LayerNorm2,q_dense2}`` (``q_dense*`` exist in
the reference's checkpoints but are unused), ``v_intermediate``, ``v_output``,
``t_intermediate``, ``t_output``; ``t_pooler.dense``, ``v_pooler.dense``.

Wiring (`BertEncoder.forward`): for each pair ``(v_id, t_id)`` of the co-attention ids, run
text layers up to ``t_id``, visual layers up to ``v_id``, then the next co-attention block;
then the remaining layers of each stream. The image embedding is
``LN(Linear(feature) + Linear(5-d location))``; pooled outputs are ReLU(Linear) of token 0
of each stream (the IMG token for vision), fused by an element-wise product.

Shapes: ``input_ids`` (B, L); ``image_feat`` (B, N, 2048) with the IMG token first;
``image_loc`` (B, N, 5); masks (B, L) / (B, N), 1 = attend.

Task tokens (``task_tokens`` > 0 in the config: vilbert-multi-task's ``--task_specific_tokens``,
``embeddings.task_embeddings``): with ``task_ids`` (B,) the task's token follows [CLS] (see
`layers.TextEmbeddings`), so the text states are L + 1 long and the text mask grows by one
attended position; without ``task_ids`` the model is the one without the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from vl_models.models.configuration import ViLBERTConfig
from vl_models.models.layers import (
    Intermediate,
    ResidualOutput,
    TextEmbeddings,
    TransformerLayer,
    at_positions,
    attend,
    init_bert_weights,
    sdpa_mask,
    with_task_token,
)


@dataclass
class ViLBERTModelOutput:
    text_output: torch.Tensor  # (B, L, hidden_size)
    vision_output: torch.Tensor  # (B, N, v_hidden_size)
    pooled_text: torch.Tensor  # (B, bi_hidden_size)
    pooled_vision: torch.Tensor  # (B, bi_hidden_size)
    pooled_output: torch.Tensor  # (B, bi_hidden_size) dropout(pooled_text * pooled_vision)


class ViLBERTImageEmbeddings(nn.Module):
    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        self.image_embeddings = nn.Linear(cfg.v_feature_size, cfg.v_hidden_size)
        self.image_location_embeddings = nn.Linear(cfg.v_loc_size, cfg.v_hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.v_hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.v_hidden_dropout_prob)

    def forward(self, feat: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.LayerNorm(self.image_embeddings(feat) + self.image_location_embeddings(loc)))


class ViLBERTBiAttention(nn.Module):
    """Text queries attend to image keys (image mask) and image queries to text keys."""

    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        bi = cfg.bi_hidden_size
        self.heads = cfg.bi_num_attention_heads
        self.query1, self.key1, self.value1 = (nn.Linear(cfg.v_hidden_size, bi) for _ in range(3))
        self.query2, self.key2, self.value2 = (nn.Linear(cfg.hidden_size, bi) for _ in range(3))
        self.dropout_v = cfg.v_attention_probs_dropout_prob
        self.dropout_t = cfg.attention_probs_dropout_prob

    def forward(
        self, vision: torch.Tensor, vision_mask, text: torch.Tensor, text_mask
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(context at vision positions, context at text positions), both bi_hidden_size wide."""
        train = self.training
        text_ctx = attend(
            self.query2(text),
            self.key1(vision),
            self.value1(vision),
            self.heads,
            vision_mask,
            self.dropout_v if train else 0.0,
        )
        vision_ctx = attend(
            self.query1(vision),
            self.key2(text),
            self.value2(text),
            self.heads,
            text_mask,
            self.dropout_t if train else 0.0,
        )
        return vision_ctx, text_ctx


class ViLBERTBiOutput(nn.Module):
    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        bi, eps = cfg.bi_hidden_size, cfg.layer_norm_eps
        self.dense1 = nn.Linear(bi, cfg.v_hidden_size)
        self.LayerNorm1 = nn.LayerNorm(cfg.v_hidden_size, eps=eps)
        self.dropout1 = nn.Dropout(cfg.v_hidden_dropout_prob)
        self.q_dense1 = nn.Linear(bi, cfg.v_hidden_size)  # in the reference's checkpoints, unused
        self.dense2 = nn.Linear(bi, cfg.hidden_size)
        self.LayerNorm2 = nn.LayerNorm(cfg.hidden_size, eps=eps)
        self.dropout2 = nn.Dropout(cfg.hidden_dropout_prob)
        self.q_dense2 = nn.Linear(bi, cfg.hidden_size)  # likewise

    def forward(self, vision_ctx, vision, text_ctx, text) -> tuple[torch.Tensor, torch.Tensor]:
        v = self.LayerNorm1(self.dropout1(self.dense1(vision_ctx)) + vision)
        t = self.LayerNorm2(self.dropout2(self.dense2(text_ctx)) + text)
        return v, t


class ViLBERTConnectionLayer(nn.Module):
    """A co-attention block: bi-attention, per-stream output sub-layers, per-stream FFNs."""

    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        eps = cfg.layer_norm_eps
        self.biattention = ViLBERTBiAttention(cfg)
        self.biOutput = ViLBERTBiOutput(cfg)
        self.v_intermediate = Intermediate(cfg.v_hidden_size, cfg.v_intermediate_size)
        self.v_output = ResidualOutput(cfg.v_intermediate_size, cfg.v_hidden_size, eps, cfg.v_hidden_dropout_prob)
        self.t_intermediate = Intermediate(cfg.hidden_size, cfg.intermediate_size)
        self.t_output = ResidualOutput(cfg.intermediate_size, cfg.hidden_size, eps, cfg.hidden_dropout_prob)

    def forward(self, vision, vision_mask, text, text_mask) -> tuple[torch.Tensor, torch.Tensor]:
        vision_ctx, text_ctx = self.biattention(vision, vision_mask, text, text_mask)
        v, t = self.biOutput(vision_ctx, vision, text_ctx, text)
        return self.v_output(self.v_intermediate(v), v), self.t_output(self.t_intermediate(t), t)


class ViLBERTEncoder(nn.Module):
    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        self.cfg = cfg
        self.layer = nn.ModuleList(
            [
                TransformerLayer(
                    cfg.hidden_size,
                    cfg.num_attention_heads,
                    cfg.intermediate_size,
                    cfg.layer_norm_eps,
                    cfg.hidden_dropout_prob,
                    cfg.attention_probs_dropout_prob,
                )
                for _ in range(cfg.num_hidden_layers)
            ]
        )
        self.v_layer = nn.ModuleList(
            [
                TransformerLayer(
                    cfg.v_hidden_size,
                    cfg.v_num_attention_heads,
                    cfg.v_intermediate_size,
                    cfg.layer_norm_eps,
                    cfg.v_hidden_dropout_prob,
                    cfg.v_attention_probs_dropout_prob,
                )
                for _ in range(cfg.v_num_hidden_layers)
            ]
        )
        self.c_layer = nn.ModuleList([ViLBERTConnectionLayer(cfg) for _ in cfg.v_biattention_id])

    def forward(self, text, text_mask, vision, vision_mask) -> tuple[torch.Tensor, torch.Tensor]:
        return self.joint(
            self.text_prefix(text, text_mask), text_mask, self.vision_prefix(vision, vision_mask), vision_mask
        )

    # The layers before the first co-attention block see one stream each: retrieval computes
    # them once per caption and once per image, and only `joint` per pair.
    def text_prefix(self, text, text_mask) -> torch.Tensor:
        for layer in self.layer[: self.cfg.t_biattention_id[0]]:
            text = layer(text, text_mask)
        return text

    def vision_prefix(self, vision, vision_mask) -> torch.Tensor:
        for layer in self.v_layer[: self.cfg.v_biattention_id[0]]:
            vision = layer(vision, vision_mask)
        return vision

    def joint(self, text, text_mask, vision, vision_mask) -> tuple[torch.Tensor, torch.Tensor]:
        """From the first co-attention block on (`text_prefix` / `vision_prefix` applied)."""
        t_start, v_start = self.cfg.t_biattention_id[0], self.cfg.v_biattention_id[0]
        for block, v_id, t_id in zip(self.c_layer, self.cfg.v_biattention_id, self.cfg.t_biattention_id):
            for layer in self.layer[t_start:t_id]:
                text = layer(text, text_mask)
            for layer in self.v_layer[v_start:v_id]:
                vision = layer(vision, vision_mask)
            t_start, v_start = t_id, v_id
            vision, text = block(vision, vision_mask, text, text_mask)
        for layer in self.v_layer[v_start:]:
            vision = layer(vision, vision_mask)
        for layer in self.layer[t_start:]:
            text = layer(text, text_mask)
        return text, vision


class ViLBERTPooler(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.dense = nn.Linear(dim, out)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.relu(self.dense(hidden[:, 0]))


class ViLBERTModel(nn.Module):
    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = TextEmbeddings(
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.max_position_embeddings,
            cfg.type_vocab_size,
            cfg.layer_norm_eps,
            cfg.hidden_dropout_prob,
            task_tokens=cfg.task_tokens,
        )
        self.v_embeddings = ViLBERTImageEmbeddings(cfg)
        self.encoder = ViLBERTEncoder(cfg)
        self.t_pooler = ViLBERTPooler(cfg.hidden_size, cfg.bi_hidden_size)
        self.v_pooler = ViLBERTPooler(cfg.v_hidden_size, cfg.bi_hidden_size)
        self.fusion_dropout = nn.Dropout(cfg.fusion_dropout)
        self.apply(lambda m: init_bert_weights(m, cfg.initializer_range))

    def forward(
        self,
        input_ids: torch.Tensor,
        image_feat: torch.Tensor,
        image_loc: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        image_attention_mask: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        task_ids: Optional[torch.Tensor] = None,
        pooled_only: bool = False,
    ) -> ViLBERTModelOutput:
        """`pooled_only` is accepted as LXMERT's backbone takes it and changes nothing: the
        pooled pair vector reads both streams' last states, computed whole."""
        text = self.encode_text(input_ids, attention_mask, token_type_ids, task_ids)
        vision = self.encode_vision(image_feat, image_loc, image_attention_mask)
        return self.cross(
            text,
            attention_mask if attention_mask is not None else torch.ones_like(input_ids),
            vision,
            image_attention_mask,
            task_ids,
        )

    def encode_text(self, input_ids, attention_mask=None, token_type_ids=None, task_ids=None) -> torch.Tensor:
        """The text stream up to its first co-attention block (B, L, H; L + 1 with ``task_ids``)."""
        mask = with_task_token(attention_mask if attention_mask is not None else torch.ones_like(input_ids), task_ids)
        return self.encoder.text_prefix(self.embeddings(input_ids, token_type_ids, task_ids), sdpa_mask(mask))

    def encode_vision(self, image_feat, image_loc, image_attention_mask=None) -> torch.Tensor:
        """The visual stream up to its first co-attention block (B, N, H_v)."""
        return self.encoder.vision_prefix(self.v_embeddings(image_feat, image_loc), sdpa_mask(image_attention_mask))

    def cross(self, text, attention_mask, vision, image_attention_mask, task_ids=None) -> ViLBERTModelOutput:
        """The co-attention blocks and the layers after them, and the poolers (`attention_mask`:
        the (B, L) text mask without the task token; ``task_ids`` as `encode_text` had them)."""
        mask = sdpa_mask(with_task_token(attention_mask, task_ids))
        text, vision = self.encoder.joint(text, mask, vision, sdpa_mask(image_attention_mask))
        pooled_t, pooled_v = self.t_pooler(text), self.v_pooler(vision)
        return ViLBERTModelOutput(text, vision, pooled_t, pooled_v, self.fusion_dropout(pooled_t * pooled_v))


@dataclass
class ViLBERTPreTrainingOutput:
    lm_logits: torch.Tensor  # (B, L, vocab), or (M, vocab) at `lm_positions`
    region_logits: torch.Tensor  # (B, N, v_target_size) or (M, ...) at `region_positions`; log-probs taken by the loss
    alignment_logits: torch.Tensor  # (B, 2); index 0 = aligned (the reference's convention)
    model: ViLBERTModelOutput


class ViLBERTHeadTransform(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.LayerNorm = nn.LayerNorm(dim, eps=eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(hidden)))


class ViLBERTLMPredictionHead(nn.Module):
    def __init__(self, cfg: ViLBERTConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = ViLBERTHeadTransform(cfg.hidden_size, cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden)) + self.bias


class ViLBERTImagePredictionHead(nn.Module):
    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        self.transform = ViLBERTHeadTransform(cfg.v_hidden_size, cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.v_hidden_size, cfg.v_target_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


class ViLBERTPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ViLBERTConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = ViLBERTLMPredictionHead(cfg, word_embeddings)
        self.bi_seq_relationship = nn.Linear(cfg.bi_hidden_size, 2)
        self.imagePredictions = ViLBERTImagePredictionHead(cfg)


class ViLBERTForPreTraining(nn.Module):
    """The backbone (``bert.``) and vilbert-multi-task's pretraining heads (``cls.``):
    masked LM (tied decoder), masked-region class distribution (over the detector's
    classes, background first) and image-text alignment from the fused pooled vector."""

    def __init__(self, cfg: ViLBERTConfig):
        super().__init__()
        self.cfg = cfg
        self.bert = ViLBERTModel(cfg)
        self.cls = ViLBERTPreTrainingHeads(cfg, self.bert.embeddings.word_embeddings)
        self.cls.apply(
            lambda m: init_bert_weights(m, cfg.initializer_range) if not isinstance(m, nn.Embedding) else None
        )
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        # The lookup's gradient (a few rows) is added into the tied decoder's dense one instead of
        # a zero-filled vocab x hidden copy of its own (~6 % of an LXMERT-base CPU step).
        self.bert.embeddings.word_embeddings.sparse = True

    def forward(
        self,
        input_ids,
        image_feat,
        image_loc,
        attention_mask=None,
        image_attention_mask=None,
        token_type_ids=None,
        lm_positions: Optional[torch.Tensor] = None,
        region_positions: Optional[torch.Tensor] = None,
    ) -> ViLBERTPreTrainingOutput:
        """``lm_positions`` (B, L) / ``region_positions`` (B, N) boolean: decode only there
        (row-major order), as training needs."""
        out = self.bert(input_ids, image_feat, image_loc, attention_mask, image_attention_mask, token_type_ids)
        return ViLBERTPreTrainingOutput(
            lm_logits=self.cls.predictions(at_positions(out.text_output, lm_positions)),
            region_logits=self.cls.imagePredictions(at_positions(out.vision_output, region_positions)),
            alignment_logits=self.cls.bi_seq_relationship(out.pooled_output),
            model=out,
        )
