"""Published fine-tuned checkpoints, read as they are on users' disks, for `vltrain evaluate`
and as `vltrain finetune --init`:

* **transformers `LxmertForQuestionAnswering`** folders (the authors' ``unc-nlp/lxmert-vqa-
  uncased`` and ``lxmert-gqa-uncased``): ``config.json`` (the model's sizes) and
  ``model.safetensors`` or ``pytorch_model.bin`` with ``lxmert.*`` and ``answer_head.logit_fc.*``;
* **airsplay/lxmert fine-tuning snapshots** (``BEST.pth`` / ``LAST.pth`` of its VQA, GQA and
  NLVR2 tasks): the task model's bare state dict, ``lxrt_encoder.model.bert.*`` (with
  ``.module`` inside the keys after ``--multiGPU``) and ``logit_fc.*``; it holds no config, so
  ``--model`` names one (``lxmert-base``: 9/5/5 layers, 768 wide, 12 heads).

Both hold an LXMERT encoder (our LXMERT backbone's ``lxmert.*`` under the same names) and one
task head of LXMERT's ``Linear -> GeLU -> LayerNorm -> Linear`` shape: an answer classifier on
the pooled [CLS] (VQA, GQA; its rows are the answer table published beside the checkpoint,
``trainval_label2ans.json``: build the task dataset with ``vlprep build-task --answers-from``
that file) or NLVR2's classifier on the two images' pooled outputs concatenated (2h -> 2h -> 2).

Loading is strict: every tensor of the file fills a parameter of the encoder or of the task
head, of the same shape, and every parameter of those two is filled; anything else is a
`ConfigError` naming the keys. The pretraining heads our backbone also has (masked LM,
matching, object / attribute / feature and QA heads) have no tensors in a fine-tuned
checkpoint and are not used by a task head: they stay as initialized, and the load says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import torch

from pipeline.errors import ConfigError
from vl_models import families
from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.models.configuration import LxmertConfig
from vl_models.models.weights import check_keys, read_state_dict
from vl_models.transfer.heads import TransferModel, build_head

HF_QA = "transformers LxmertForQuestionAnswering"
AIRSPLAY = "airsplay/lxmert fine-tuning snapshot"
HEAD_KEYS = tuple(f"logit_fc.{i}.{p}" for i in (0, 2, 3) for p in ("weight", "bias"))


@dataclass(frozen=True)
class Published:
    """A published fine-tuned checkpoint: its layout, model config, the encoder's tensors
    under our backbone's names and the task head's under ours (``logit_fc.*``)."""

    source: Path
    layout: str
    mcfg: LxmertConfig
    encoder: dict
    head: dict

    @property
    def family(self):
        return families.of_config(self.mcfg)

    @property
    def head_kind(self) -> str:
        """The task-head kind it fits: an answer classifier on the pooled vector, or NLVR2's pair classifier."""
        return "pair" if self.head["logit_fc.0.weight"].shape[1] == 2 * self.mcfg.hidden_size else "answers"

    @property
    def answers(self) -> int:
        """Rows of the answer classifier (0 for a pair classifier)."""
        return int(self.head["logit_fc.3.weight"].shape[0]) if self.head_kind == "answers" else 0

    @property
    def vocab(self) -> Path:
        """The folder's own vocab where it has one; else bert-base-uncased's (both references')."""
        for name in ("vocab.txt", "tokenizer.json"):
            if self.source.is_dir() and (self.source / name).is_file():
                return self.source
        return bundled_bert_vocab()

    def check_task(self, task, answers: int) -> None:
        """ConfigError unless this checkpoint's head is `task`'s kind (with `answers` rows)."""
        if task.head != self.head_kind:
            fits = "an answer classifier (vqa, gqa)" if self.head_kind == "answers" else "a pair classifier (nlvr2)"
            raise ConfigError(f"{self.source}: its task head is {fits}, not a {task.name} head ({task.head})")
        if self.head_kind == "answers" and answers != self.answers:
            raise ConfigError(
                f"{self.source}: its answer head has {self.answers} rows, the task dataset's answer table "
                f"{answers}: build the task dataset with the checkpoint's own table (vlprep build-task "
                "--answers-from trainval_label2ans.json, the file published beside it)"
            )

    def check_store(self, layout) -> None:
        """ConfigError unless the feature store's regions are as wide as the checkpoint's input."""
        if layout.feature_dim != self.mcfg.visual_feat_dim:
            raise ConfigError(
                f"{self.source}: it reads {self.mcfg.visual_feat_dim}-d region features, the feature store holds "
                f"{layout.feature_dim}-d ones"
            )

    def load_encoder(self, backbone) -> None:
        """Fill the family backbone's LXMERT encoder (``backbone.lxmert``), strictly."""
        encoder = self.family.backbone(backbone)
        check_keys(encoder.state_dict(), self.encoder, f"the LXMERT encoder of {self.mcfg.name!r} ({self.layout})")
        encoder.load_state_dict(self.encoder, strict=True)

    def load_head(self, head: torch.nn.Module) -> None:
        check_keys(head.state_dict(), self.head, f"the task head ({self.layout})")
        head.load_state_dict(self.head, strict=True)

    def transfer_model(self, task, answers: int) -> TransferModel:
        """`task`'s model with this checkpoint's encoder and head (`check_task` first)."""
        self.check_task(task, answers)
        pooled, vision = self.family.widths(self.mcfg)
        head = build_head(task.head, pooled, vision, task.candidates, answers, self.mcfg.layer_norm_eps)
        model = TransferModel(self.family, self.family.build(self.mcfg), {task.name: head})
        self.load_encoder(model.backbone)
        self.load_head(head)
        return model

    def note(self) -> str:
        return (
            f"{self.layout} {self.source}: its LXMERT encoder and {self.head_kind} head (the pretraining "
            "heads are not in a fine-tuned checkpoint: left as initialized, no task head uses them)"
        )


def read_published(source: Optional[str], model: Optional[str] = None) -> Optional[Published]:
    """The checkpoint at `source` when it is a published fine-tuned model of a known layout
    (`model`: the config of a layout that holds none); None for anything else."""
    if not source:
        return None
    path = Path(source)
    weights = path if path.is_file() else _weights_file(path)
    if weights is None or weights.suffix not in (".safetensors", ".bin", ".pth", ".pt"):
        return None
    state = read_state_dict(weights)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return None
    keys = {_unwrapped(k): v for k, v in state.items()}
    if any(k.startswith("lxrt_encoder.model.bert.") for k in keys):
        encoder = {k[len("lxrt_encoder.model.bert.") :]: v for k, v in keys.items() if k.startswith("lxrt_encoder.")}
        head = {k: v for k, v in keys.items() if k.startswith("logit_fc.")}
        other = sorted(k for k in keys if not k.startswith(("lxrt_encoder.model.bert.", "logit_fc.")))
        return _published(path, AIRSPLAY, _config(path, model, AIRSPLAY), encoder, head, other)
    if any(k.startswith("answer_head.logit_fc.") for k in keys) and any(k.startswith("lxmert.") for k in keys):
        if any(k.startswith(("cls.", "obj_predict_head.")) for k in keys):
            return None  # a pretraining checkpoint (LxmertForPreTraining): `init_pretraining` reads it
        encoder = {k[len("lxmert.") :]: v for k, v in keys.items() if k.startswith("lxmert.")}
        head = {k[len("answer_head.") :]: v for k, v in keys.items() if k.startswith("answer_head.")}
        other = sorted(k for k in keys if not k.startswith(("lxmert.", "answer_head.")))
        return _published(path, HF_QA, _config(path, model, HF_QA), encoder, head, other)
    return None


def _published(path: Path, layout: str, mcfg, encoder: dict, head: dict, other: list) -> Published:
    if other:
        raise ConfigError(
            f"{path}: a {layout} with tensors of neither its encoder nor its task head: {', '.join(other[:12])}"
            + (f" ... ({len(other)} in all)" if len(other) > 12 else "")
        )
    if sorted(head) != sorted(HEAD_KEYS):
        raise ConfigError(f"{path}: its task head is not LXMERT's Linear-GeLU-LayerNorm-Linear: {', '.join(head)}")
    encoder.pop("embeddings.position_ids", None)  # a buffer some transformers versions save
    return Published(path, layout, mcfg, encoder, head)


def _unwrapped(key: str) -> str:
    """A key without DataParallel's ``module.``: leading (a wrapped model) or inside (airsplay's
    ``--multiGPU`` wraps the encoder only: ``lxrt_encoder.model.module.bert.*``)."""
    return re.sub(r"(^|\.)module\.", r"\1", key)


def _weights_file(folder: Path) -> Optional[Path]:
    if not folder.is_dir():
        return None
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


def _config(path: Path, model: Optional[str], layout: str) -> LxmertConfig:
    """The model config: --model, else the transformers folder's config.json."""
    if model:
        mcfg = families.load_config(model)
        if not isinstance(mcfg, LxmertConfig):
            raise ConfigError(f"--model {model}: a {layout} is an LXMERT model, not a {mcfg.model_type} one")
        return mcfg
    config = (path if path.is_dir() else path.parent) / "config.json"
    if layout == AIRSPLAY or not config.is_file():
        raise ConfigError(
            f"{path}: a {layout} holds no model config: name it with --model (lxmert-base: the published "
            "9/5/5 layers at BERT-base width)"
        )
    return lxmert_config_of_hf(json.loads(config.read_text()), name=path.name)


def lxmert_config_of_hf(hf: dict, name: str) -> LxmertConfig:
    """Our LXMERT config from a transformers ``LxmertConfig`` config.json (the same field
    names); a GELU other than BERT's exact one is refused (ours computes that one)."""
    if hf.get("model_type") != LxmertConfig.model_type:
        raise ConfigError(f"{name}: config.json is not an LXMERT config (model_type {hf.get('model_type')!r})")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ConfigError(f"{name}: hidden_act {hf['hidden_act']!r}: only BERT's exact GELU ('gelu') is implemented")
    ours = {f.name for f in fields(LxmertConfig)} - {"name"}
    return LxmertConfig(name=name, **{k: v for k, v in hf.items() if k in ours})
