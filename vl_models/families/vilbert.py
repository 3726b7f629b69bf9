"""ViLBERT (Lu et al. 2019): two streams with co-attention; masked LM, masked-region KL to
the detector's class distribution (on the selected regions only) and image-text alignment
(class 0 = aligned, the reference's convention: the dataset's ``matched`` is converted here)."""

from __future__ import annotations

from dataclasses import replace

import torch

from pipeline.errors import ConfigError
from vl_models.data.masking import RegionMasking
from vl_models.families.base import RETRIEVAL_METRICS, ModelFamily
from vl_models.models.configuration import ViLBERTConfig
from vl_models.models.modeling_vilbert import ViLBERTForPreTraining
from vl_models.models.weights import load_vilbert_pretraining
from vl_models.tasks import losses as L


class ViLBERT(ModelFamily):
    name = "vilbert"
    config_class = ViLBERTConfig
    tasks = ("mlm", "region", "alignment")
    pair_task = "alignment"
    pair_loss = "bce"  # NLVR2: 12-in-1's BCE on one-hot targets (vilbert_tasks.yml TASK12)
    eval_metrics = {"eval_mlm_acc": "max", "eval_alignment_acc": "max", "eval_region_kl": "min", **RETRIEVAL_METRICS}
    max_text = 36
    position = "5d"
    img_token = True  # never masked; the mean of the regions the model sees (scoring a published 12-in-1 / beta
    # checkpoint: of every region of the record, as their feature reader; `TaskDataset(img_feature="all")`)
    region_masking = RegionMasking(zero=0.9)  # paper §3.2: 90 % zeroed, 10 % unaltered
    region_fields = ("cls_prob",)  # the KL target
    label_tasks = ("region",)  # a KL to the detector's class distribution
    region_overlap = ("keep", "zero")  # zero: 12-in-1's variant (see vl_models.config.DataSettings)
    retrieval_head = "new"  # 12-in-1 fine-tunes retrieval with a new vil_logit (vilbert_tasks.yml TASK7/8: VL-logit)
    task_token_table = "bert.embeddings.task_embeddings.weight"

    def fit(self, mcfg, layout, answers, store):
        if layout.cls_dim is None and layout.regions != "grid":  # a grid: `check_labels` says it
            raise ConfigError(f"{store}: ViLBERT pretraining needs cls_prob in the feature store")
        return replace(mcfg, v_feature_size=layout.feature_dim, v_target_size=layout.cls_dim or mcfg.v_target_size)

    def build(self, mcfg):
        return ViLBERTForPreTraining(mcfg)

    def load_checkpoint(self, model, state):
        loaded, heads = load_vilbert_pretraining(state, model.cfg)  # vilbert-multi-task's layout
        model.load_state_dict(loaded.state_dict())
        return "ViLBERT checkpoint" + (f" (task heads not used in pretraining: {', '.join(heads)})" if heads else "")

    def backbone(self, model):
        return model.bert

    def visual_targets(self, regions, original, image):
        if regions.cls_prob is None:  # a grid store (its region loss is off: `check_labels`)
            return {}
        return {"region_prob": regions.cls_prob[0]}

    def losses(self, model, batch, qa_active, visual_weighting):
        out = self.forward(model, batch)
        mlm, m1 = L.masked_lm(out.lm_logits, batch["lm_labels"][batch["lm_labels"] != -1])
        if "region_prob" in batch:
            region, m2 = L.region_kl(out.region_logits, batch["region_prob"][batch["region_selected"].bool()])
        else:  # grid features: no class distribution to learn (weight 0), the graph kept whole for DDP
            region, m2 = out.region_logits.float().sum() * 0, {"region_kl": float("nan")}
        matched = batch["matched"]  # 1 matched, 0 not, -1 no pair label
        align, m3 = L.pair_classification(
            out.alignment_logits, torch.where(matched < 0, matched, 1 - matched), "alignment"
        )
        return {"mlm": mlm, "region": region, "alignment": align}, {**m1, **m2, **m3}

    pair_output, pair_positive = "alignment_logits", 0  # class 0 = aligned

    def pair_head(self, model):
        return model.cls.bi_seq_relationship

    def widths(self, mcfg):
        return mcfg.bi_hidden_size, mcfg.v_hidden_size

    def feature_dim(self, mcfg):
        return mcfg.v_feature_size

    def with_task_tokens(self, mcfg):
        """A table of 12-in-1's 20 rows (vilbert.py ``BertEmbeddings``: ``nn.Embedding(20, hidden)``,
        started by ``init_weights`` as N(0, initializer_range) as every embedding); a config with a
        table keeps its own."""
        return mcfg if mcfg.task_tokens else replace(mcfg, task_tokens=TASK_TOKEN_ROWS)

    def head_dropout(self, mcfg):
        """`VILBertForVLTasks.dropout` (its ``dropout_prob``, 0.1), the dropout it also applies to the
        pooled product: our ``fusion_dropout``."""
        return mcfg.fusion_dropout

    def shared_head(self, kind):
        """12-in-1's heads by kind (`VILBertForVLTasks`): one ``vision_logit`` for every
        referring-expression task (RefCOCO, RefCOCO+, RefCOCOg), one ``vil_logit`` for every
        choice-scoring task (VCR, and retrieval's new scorer)."""
        return SHARED_HEADS.get(kind)

    def task_token(self, mcfg, task):
        """vilbert-multi-task's task ids (the N of ``TASKN`` in its vilbert_tasks.yml, the id
        `task_utils.py` fills the task token with) for a model with a task-token table."""
        if not mcfg.task_tokens:
            return None
        if task not in TASK_TOKENS:
            raise ConfigError(
                f"{task}: no vilbert-multi-task task id (its tokens: "
                f"{', '.join(f'{k} {v}' for k, v in TASK_TOKENS.items())}); the model has a task-token table"
            )
        if TASK_TOKENS[task] >= mcfg.task_tokens:
            raise ConfigError(f"{task}: task token {TASK_TOKENS[task]} beyond the table's {mcfg.task_tokens} rows")
        return TASK_TOKENS[task]


# vilbert_tasks.yml: TASK1 VQA, TASK5 VCR_Q-A, TASK6 VCR_QA-R, TASK7 RetrievalCOCO, TASK8
# RetrievalFlickr30k, TASK9-11 refcoco / refcoco+ / refcocog, TASK12 NLVR2, TASK15 GQA. The joint
# VCR task (Q->A and Q A->R examples in one task) has none: 12-in-1 runs the two as tasks 5 and 6.
TASK_TOKENS = {
    "vqa": 1,
    "vcr-q2a": 5,
    "vcr-qa2r": 6,
    "coco-retrieval": 7,
    "flickr30k": 8,
    "refcoco": 9,
    "refcoco+": 10,
    "refcocog": 11,
    "nlvr2": 12,
    "gqa": 15,
}


TASK_TOKEN_ROWS = 20  # vilbert.py BertEmbeddings: nn.Embedding(20, config.hidden_size) with --task_specific_tokens
SHARED_HEADS = {"regions": "vision_logit", "choice": "vil_logit"}  # `ViLBERT.shared_head`

FAMILY = ViLBERT()
