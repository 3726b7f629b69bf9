"""LXMERT (Tan & Bansal 2019): language, object-relationship and cross-modality encoders;
masked LM, matching (1 = matched), object / attribute classification and feature
regression on masked regions, and image QA (matched question items only)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.errors import ConfigError
from vl_models.data.masking import RegionMasking
from vl_models.data.padding import REGION_SLOTS
from vl_models.families.base import RETRIEVAL_METRICS, ModelFamily
from vl_models.models.configuration import LxmertConfig
from vl_models.models.modeling_lxmert import LxmertForPreTraining
from vl_models.models.weights import load_lxmert_pretraining
from vl_models.tasks import losses as L

LABEL_SAMPLE = 256  # records per store whose label ids `check_label_ids` reads


class Lxmert(ModelFamily):
    name = "lxmert"
    config_class = LxmertConfig
    tasks = ("mlm", "matching", "obj", "attr", "feat", "qa")
    pair_task = "matching"
    eval_metrics = {
        "eval_mlm_acc": "max",
        "eval_matching_acc": "max",
        "eval_obj_acc": "max",
        "eval_attr_acc": "max",
        "eval_qa_acc": "max",
        "eval_qa_score": "max",
        **RETRIEVAL_METRICS,
    }
    max_text = 20
    position = "4d"
    region_masking = RegionMasking(zero=0.8, replace=0.1)  # 10 % another image's feature, 10 % unaltered
    answers = True
    region_fields = ("objects_id", "objects_conf", "attrs_id", "attrs_conf")
    label_tasks = ("obj", "attr")  # the detector's object and attribute ids (feat regresses the features)
    region_positions = "feat_positions"  # LXMERT decodes features (and labels) of the masked regions

    def fit(self, mcfg, layout, answers, store):
        return replace(
            mcfg,
            visual_feat_dim=layout.feature_dim,
            num_qa_labels=max(answers, 1),
            num_object_labels=(layout.cls_dim or mcfg.num_object_labels + 1) - 1,
            num_attr_labels=(layout.attr_dim or mcfg.num_attr_labels + 1) - 1,
        )

    def check_label_ids(self, mcfg, stores):
        """The object and attribute ids of each store's first `LABEL_SAMPLE` records against
        `mcfg`'s label counts, where the store has no probability table to set the count (a
        store imported from LXMERT's TSVs keeps the ids alone): an id beyond the count would
        fail the obj / attr loss mid-step, whatever its weight."""
        from pipeline.store import FeatureStore

        counts = {"objects_id": ("cls_prob", "num_object_labels"), "attrs_id": ("attr_prob", "num_attr_labels")}
        for path in stores:
            store = FeatureStore.open(path)
            unset = {f: c for f, c in counts.items() if store.layout.prob_dim(c[0]) is None}
            for i in range(min(LABEL_SAMPLE, len(store)) if unset and store.layout.regions != "grid" else 0):
                record = store.record_at(i)
                for field, (table, name) in unset.items():
                    ids = getattr(record, field)
                    if ids is not None and ids.size and int(ids.max()) >= getattr(mcfg, name):
                        raise ConfigError(
                            f"{path}: image {record.image_id} has {field} {int(ids.max())}, beyond the "
                            f"{getattr(mcfg, name)} labels of the model config {mcfg.name} ({name}; the store has "
                            f"no {table} to set it): train a model config with as many labels as the store's "
                            "detector (lxmert-base: Visual Genome's 1600 objects and 400 attributes)"
                        )

    def build(self, mcfg):
        return LxmertForPreTraining(mcfg)

    def load_checkpoint(self, model, state):
        model.load_state_dict(load_lxmert_pretraining(state, model.cfg).state_dict())  # HF or original .pth
        return "LXMERT pretraining checkpoint"

    def backbone(self, model):
        return model.lxmert

    def visual_targets(self, regions, original, image):
        slots = regions.mask.shape[1]

        def first(value, fill, dtype):
            return value[0] if value is not None else np.full(slots, fill, dtype)

        return {
            "obj_ids": first(regions.objects_id, -1, np.int64),
            "obj_conf": first(regions.objects_conf, 0, np.float32),
            "attr_ids": first(regions.attrs_id, -1, np.int64),
            "attr_conf": first(regions.attrs_conf, 0, np.float32),
            "original_feats": original,
        }

    def losses(self, model, batch, qa_active, visual_weighting):
        out = self.forward(model, batch)
        mlm, m1 = L.masked_lm(out.lm_logits, batch["lm_labels"][batch["lm_labels"] != -1])
        matched, m2 = L.pair_classification(out.matched_logits, batch["matched"], "matching")
        targets = L.LxmertVisualTargets(
            obj_ids=batch["obj_ids"],
            obj_conf=batch["obj_conf"],
            attr_ids=batch["attr_ids"],
            attr_conf=batch["attr_conf"],
            features=batch["original_feats"],
            selected=batch["region_selected"],
            real=batch["visual_mask"].bool(),
            slots=batch[REGION_SLOTS].sum() if REGION_SLOTS in batch else None,  # a tensor: no device sync
        )
        visual, m3 = L.lxmert_visual(out.obj_logits, out.attr_logits, out.feat_pred, targets, visual_weighting)
        qa, m4 = L.qa(out.answer_logits, batch["qa_label"], active=qa_active)
        return {"mlm": mlm, "matching": matched, **visual, "qa": qa}, {**m1, **m2, **m3, **m4}

    pair_output, pair_positive = "matched_logits", 1  # class 1 = matched
    pooled_only = {"pooled_only": True}

    def pair_head(self, model):
        return model.cls.seq_relationship

    def widths(self, mcfg):
        return mcfg.hidden_size, mcfg.hidden_size

    def feature_dim(self, mcfg):
        return mcfg.visual_feat_dim

    def qa_head(self, model):
        return model.answer_head.logit_fc

    def answer_logits(self, outputs):
        return outputs.answer_logits


FAMILY = Lxmert()
