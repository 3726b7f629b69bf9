"""Published fine-tuned checkpoints, read as they are on users' disks, for `vltrain evaluate`
and as `vltrain finetune --init`:

* **transformers `LxmertForQuestionAnswering`** folders (the authors' ``unc-nlp/lxmert-vqa-
  uncased`` and ``lxmert-gqa-uncased``): ``config.json`` (the model's sizes) and
  ``model.safetensors`` or ``pytorch_model.bin`` with ``lxmert.*`` and ``answer_head.logit_fc.*``;
* **airsplay/lxmert fine-tuning snapshots** (``BEST.pth`` / ``LAST.pth`` of its VQA, GQA and
  NLVR2 tasks): the task model's bare state dict, ``lxrt_encoder.model.bert.*`` (with
  ``.module`` inside the keys after ``--multiGPU``) and ``logit_fc.*``; it holds no config, so
  ``--model`` names one (``lxmert-base``: 9/5/5 layers, 768 wide, 12 heads);
* **vilbert-multi-task `VILBertForVLTasks`** state dicts (12-in-1's ``multi_task_model.bin`` and
  the single-task fine-tuned models of that code): ``bert.*`` (with
  ``bert.embeddings.task_embeddings`` when trained with ``--task_specific_tokens``: our config's
  ``task_tokens`` is then its row count and each task gets its 12-in-1 token,
  `ModelFamily.task_token`), the pretraining heads ``cls.*`` and every task head of that class:
  ``vil_prediction`` (VQA), ``vil_prediction_gqa`` (GQA), ``vil_binary_prediction`` (NLVR2),
  ``vil_logit`` (VCR, retrieval), ``vision_logit`` (RefCOCO), ``vil_tri_prediction`` (SNLI-VE),
  ``linguisic_logit`` (none); ``--model`` names the config (``vilbert-base``: its
  ``bert_base_6layer_6conect.json``);
* **vilbert_beta `VILBertForVLTasks`** (the ViLBERT paper's own fine-tuned models, its first
  code release): ``bert.*``, ``cls.*`` and ``vil_prediction`` (a weight-normed
  ``Linear -> ReLU -> Dropout -> Linear``, `heads.WeightNormAnswerHead`), ``vil_logit``,
  ``vision_logit``, ``linguisic_logit``; ``--model`` as above.

The LXMERT layouts hold an LXMERT encoder (our LXMERT backbone's ``lxmert.*`` under the same
names) and one task head of LXMERT's ``Linear -> GeLU -> LayerNorm -> Linear`` shape: an answer
classifier on the pooled [CLS] (VQA, GQA; its rows are the answer table published beside the
checkpoint, ``trainval_label2ans.json``: build the task dataset with ``vlprep build-task
--answers-from`` that file) or NLVR2's classifier on the two images' pooled outputs
concatenated (2h -> 2h -> 2). The ViLBERT layouts hold our whole ViLBERT pretraining model
(``bert.*``, ``cls.*``: the same names) and several heads; a task reads the one its reference
task reads (`head_for`: VQA ``vil_prediction``, GQA ``vil_prediction_gqa``, NLVR2
``vil_binary_prediction``, VCR and retrieval ``vil_logit``, RefCOCO ``vision_logit``, as
`task_utils.py` of each code picks its output by task type); the others are not used.

Loading is strict: every tensor of the file fills a parameter of the model or of the task
head, of the same shape, and every parameter of those is filled, or is one of the checkpoint's
task heads that the task does not read (named in the load note); anything else is a
`ConfigError` naming the keys. The pretraining heads our LXMERT backbone also has (masked LM,
matching, object / attribute / feature and QA heads) have no tensors in its fine-tuned
checkpoints and are not used by a task head: they stay as initialized, and the load says so.

A published checkpoint is scored on the inputs its code gave it (`Published.data_settings`):
the text length and region slots of its task, as the fine-tuning recipes of that code write
them with their citations (`REFERENCE_RECIPES`, read by `recipes.recipe_settings`: the task's
own recipe, then the multi-task one's per-task values) — vilbert-multi-task's
``vilbert_tasks.yml`` (101 region slots: 100 regions and the IMG token; VQA 23 tokens, GQA 26,
NLVR2 40, RefCOCO/+/g 20, retrieval 30, VCR Q->A 60, QA->R 80), LXMERT's 36 regions and 20
tokens; vilbert_beta, which no recipe of ours follows, from its ``vlbert_tasks.yml``
(`BETA_SETTINGS`). Both ViLBERT codes' feature reader makes the IMG token the mean of every
region the image's record holds, before their datasets cut the regions to the slots
(`img_feature` "all"). ``vltrain evaluate --max-regions / --max-text`` override them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Optional

import torch

from pipeline.errors import ConfigError
from vl_models import families
from vl_models.config import DataSettings
from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.models.configuration import LxmertConfig, ViLBERTConfig
from vl_models.models.weights import VILBERT_TASK_HEADS, check_keys, read_state_dict, retie
from vl_models.train.recipes import recipe_settings
from vl_models.transfer.heads import ChoiceHead, TransferModel, WeightNormAnswerHead, build_head

HF_QA = "transformers LxmertForQuestionAnswering"
AIRSPLAY = "airsplay/lxmert fine-tuning snapshot"
VILBERT_MT = "vilbert-multi-task VILBertForVLTasks"
VILBERT_BETA = "vilbert_beta VILBertForVLTasks"
HEAD_KEYS = tuple(f"logit_fc.{i}.{p}" for i in (0, 2, 3) for p in ("weight", "bias"))
LXMERT_HEAD = "logit_fc"  # the one head of the LXMERT layouts, under `Published.heads`

# The checkpoint head each head kind reads in the ViLBERT layouts (vilbert-multi-task's
# `task_utils.py` picks the output by task type: VL-classifier, VL-binary-classifier, V-logit,
# VL-logit; GQA has its own classifier, VL-classifier-GQA). Per task name where it differs.
VILBERT_HEAD_OF_KIND = {
    "answers": "vil_prediction",
    "pair": "vil_binary_prediction",
    "regions": "vision_logit",
    "choice": "vil_logit",
    "retrieval": "vil_logit",
}
VILBERT_HEAD_OF_TASK = {"gqa": "vil_prediction_gqa"}
BETA_HEADS = ("vil_prediction", "vil_logit", "vision_logit", "linguisic_logit")  # vilbert_beta's class
_OUR_NAMES = {"vision_logit": "logit.", "vil_logit": "logit."}  # Linear(., 1) heads: our `logit` layer

# The fine-tuning recipes that write each layout's task settings (text length, region slots),
# first match first ("{task}": the task's name); the last names the layout's region slots for a
# task no recipe trains (vilbert-multi-task's joint VCR task: its Q->A and QA->R lengths are
# the task's own, `vcr.py`).
REFERENCE_RECIPES = {
    VILBERT_MT: ("vilbert-{task}", "vilbert-12in1"),
    HF_QA: ("lxmert-{task}",),
    AIRSPLAY: ("lxmert-{task}",),
}
REFERENCE_OF = {  # where those settings come from, for the log and metrics.json
    VILBERT_MT: "the settings of vilbert-multi-task's vilbert_tasks.yml (recipes vilbert-<task>, vilbert-12in1)",
    VILBERT_BETA: "the settings of vilbert_beta's vlbert_tasks.yml",
    HF_QA: "airsplay/lxmert's settings (recipes lxmert-<task>)",
    AIRSPLAY: "airsplay/lxmert's settings (recipes lxmert-<task>)",
}
# jiasenlu/vilbert_beta vlbert_tasks.yml (no recipe of ours follows that code): max_region_num 100
# for every task (99 regions and the IMG token); max_seq_length VQA 16, VCR_Q-A 60, VCR_QA-R 80,
# RetrievalFlickr30k 30, refcoco+ 20.
BETA_SETTINGS = {
    "max_regions": 99,
    "max_text": {"vqa": 16, "vcr-q2a": 60, "vcr-qa2r": 80, "flickr30k": 30, "refcoco+": 20},
}


@dataclass(frozen=True)
class Published:
    """A published fine-tuned checkpoint: its layout, model config, the tensors of the part of
    our backbone it fills (`encoder_of`) under our names, and its task heads (``heads``: the
    checkpoint's head name -> its tensors under our head's names)."""

    source: Path
    layout: str
    mcfg: Any
    encoder: dict
    heads: dict = field(default_factory=dict)

    @property
    def family(self):
        return families.of_config(self.mcfg)

    @property
    def vilbert(self) -> bool:
        """A ViLBERT layout (several task heads, the whole pretraining model)."""
        return self.layout in (VILBERT_MT, VILBERT_BETA)

    @property
    def head(self) -> dict:
        """The task head of an LXMERT layout (its only one)."""
        return self.heads[LXMERT_HEAD]

    @property
    def head_kind(self) -> str:
        """The task-head kind an LXMERT layout's head fits: an answer classifier on the pooled
        vector, or NLVR2's pair classifier."""
        return "pair" if self.head["logit_fc.0.weight"].shape[1] == 2 * self.mcfg.hidden_size else "answers"

    @property
    def answers(self) -> int:
        """Rows of an LXMERT layout's answer classifier (0 for a pair classifier)."""
        return int(self.head["logit_fc.3.weight"].shape[0]) if self.head_kind == "answers" else 0

    @property
    def vocab(self) -> Path:
        """The folder's own vocab where it has one; else bert-base-uncased's (the references')."""
        for name in ("vocab.txt", "tokenizer.json"):
            if self.source.is_dir() and (self.source / name).is_file():
                return self.source
        return bundled_bert_vocab()

    @property
    def img_feature(self) -> str:
        """The IMG token's feature its code computes (`TaskDataset`'s ``img_feature``): "all",
        the mean of every region of the image's record (both ViLBERT codes' feature reader,
        before the datasets cut the regions to the slots); "kept" for a layout without one."""
        return "all" if self.vilbert else "kept"

    @property
    def reference(self) -> str:
        """Where `reference_settings` come from, in words."""
        return REFERENCE_OF[self.layout]

    def reference_settings(self, task) -> dict:
        """The text length and region slots (``max_text``, ``max_regions``: regions, the IMG
        token not counted) its code scores `task` with (see the module's docstring); a key
        left out is the task's or the model family's default (VCR's joint task: its own Q->A
        and QA->R lengths)."""
        if self.layout == VILBERT_BETA:
            text = BETA_SETTINGS["max_text"].get(task.name)
            return {"max_regions": BETA_SETTINGS["max_regions"], **({"max_text": text} if text else {})}
        names = [pattern.format(task=task.name) for pattern in REFERENCE_RECIPES[self.layout]]
        found: dict = {}
        for name in names:
            for key, value in recipe_settings(name, task.name).items():
                found.setdefault(key, value)
        if "max_regions" not in found:  # a task no recipe trains: the layout's region slots
            found.update({k: v for k, v in recipe_settings(names[-1]).items() if k == "max_regions"})
        return found

    def data_settings(self, task, max_regions: Optional[int] = None, max_text: Optional[int] = None) -> DataSettings:
        """`reference_settings` of `task` as data settings, `max_regions` / `max_text` in their
        place where given."""
        values = self.reference_settings(task)
        values.update({k: v for k, v in (("max_regions", max_regions), ("max_text", max_text)) if v is not None})
        return DataSettings(**values)

    def head_for(self, task) -> Optional[str]:
        """The name of the checkpoint's head that `task` reads (None: none fits)."""
        if not self.vilbert:
            return LXMERT_HEAD if task.head == self.head_kind else None
        name = VILBERT_HEAD_OF_TASK.get(task.name, VILBERT_HEAD_OF_KIND.get(task.head))
        return name if name in self.heads else None

    def answers_of(self, name: str) -> int:
        """Rows of the answer classifier `name` of the checkpoint."""
        state = self.heads[name]
        return int(state["main.3.weight_v" if "main.3.weight_v" in state else "logit_fc.3.weight"].shape[0])

    def check_task(self, task, answers: int) -> None:
        """ConfigError unless this checkpoint has a head for `task` (with `answers` rows)."""
        name = self.head_for(task)
        if name is None:
            if self.vilbert:
                raise ConfigError(
                    f"{self.source}: a {self.layout} has no head for {task.name} ({task.head}); its heads: "
                    f"{', '.join(self.heads)}"
                )
            fits = "an answer classifier (vqa, gqa)" if self.head_kind == "answers" else "a pair classifier (nlvr2)"
            raise ConfigError(f"{self.source}: its task head is {fits}, not a {task.name} head ({task.head})")
        if task.head == "answers" and answers != self.answers_of(name):
            raise ConfigError(
                f"{self.source}: its answer head has {self.answers_of(name)} rows, the task dataset's answer "
                f"table {answers} ({name}): build the task dataset with the checkpoint's own table (vlprep "
                "build-task --answers-from, the answer table published beside it)"
            )

    def check_store(self, layout) -> None:
        """ConfigError unless the feature store's regions are as wide as the checkpoint's input."""
        width = self.family.feature_dim(self.mcfg)
        if layout.feature_dim != width:
            raise ConfigError(
                f"{self.source}: it reads {width}-d region features, the feature store holds "
                f"{layout.feature_dim}-d ones"
            )

    def encoder_of(self, backbone) -> torch.nn.Module:
        """The module of the family's pretraining model the checkpoint fills: LXMERT's encoder
        (``backbone.lxmert``), or the whole ViLBERT pretraining model (``bert.*``, ``cls.*``)."""
        return backbone if self.vilbert else self.family.backbone(backbone)

    def load_encoder(self, backbone) -> None:
        """Fill the family backbone's part the checkpoint holds (`encoder_of`), strictly."""
        module = self.encoder_of(backbone)
        state = dict(self.encoder)
        retie(module, state)
        what = "ViLBERT model" if self.vilbert else "LXMERT encoder"
        check_keys(module.state_dict(), state, f"the {what} of {self.mcfg.name!r} ({self.layout})")
        module.load_state_dict(state, strict=True)

    def load_head(self, head: torch.nn.Module, name: str = LXMERT_HEAD) -> None:
        """Fill a task head from the checkpoint's head `name`, strictly."""
        check_keys(head.state_dict(), self.heads[name], f"the task head {name} ({self.layout})")
        head.load_state_dict(self.heads[name], strict=True)

    def new_head(self, task, answers: int) -> torch.nn.Module:
        """A head of the shape the checkpoint's head for `task` has (`check_task` first)."""
        pooled, vision = self.family.widths(self.mcfg)
        if self.layout == VILBERT_BETA and task.head == "answers":
            return WeightNormAnswerHead(pooled, answers)
        if self.vilbert and task.head == "retrieval":  # its vil_logit scores the pooled pair
            return ChoiceHead(pooled, task.candidates)
        return build_head(task.head, pooled, vision, task.candidates, answers, self.mcfg.layer_norm_eps)

    def transfer_model(self, task, answers: int) -> TransferModel:
        """`task`'s model with this checkpoint's encoder and head (`check_task` first), with
        the task's token where the model has a task-token table."""
        self.check_task(task, answers)
        head = self.new_head(task, answers)
        model = TransferModel(
            self.family,
            self.family.build(self.mcfg),
            {task.name: head},
            {task.name: self.family.task_token(self.mcfg, task.name)},
        )
        self.load_encoder(model.backbone)
        self.load_head(head, self.head_for(task))
        return model

    def note(self, *tasks) -> str:
        """What the load filled and what it left, for the log (`tasks`: those the model has)."""
        if not self.vilbert:
            return (
                f"{self.layout} {self.source}: its LXMERT encoder and {self.head_kind} head (the pretraining "
                "heads are not in a fine-tuned checkpoint: left as initialized, no task head uses them)"
            )
        used = [h for h in dict.fromkeys(self.head_for(t) for t in tasks) if h is not None]
        unused = [h for h in self.heads if h not in used]
        tokens = f", task tokens ({self.mcfg.task_tokens} rows)" if self.mcfg.task_tokens else ""
        return (
            f"{self.layout} {self.source}: its ViLBERT model (bert.*, cls.*{tokens})"
            + (f" and its {', '.join(used)} head" if used else "")
            + f"; not used: {', '.join(unused) or 'no head'}, biOutput q_dense1/q_dense2 (in the reference's "
            "model, never in its forward pass)"
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
    broken = [k for k, v in keys.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if broken:  # checked as pretraining checks what it saves: scoring on them would answer nonsense
        raise ConfigError(
            f"{weights}: {len(broken)} tensor(s) hold NaN or infinite values ({', '.join(broken[:5])}); not loaded"
        )
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
    if any(k.startswith("bert.") for k in keys) and any(k.split(".", 1)[0] in VILBERT_TASK_HEADS for k in keys):
        return _vilbert(path, keys, model)
    return None


def _vilbert(path: Path, keys: dict, model: Optional[str]) -> Published:
    """A `VILBertForVLTasks` state dict: vilbert_beta's (a weight-normed ``vil_prediction``) or
    vilbert-multi-task's."""
    layout = VILBERT_BETA if any(k.startswith("vil_prediction.main.") for k in keys) else VILBERT_MT
    encoder = {k: v for k, v in keys.items() if k.startswith(("bert.", "cls.")) and k != "bert.embeddings.position_ids"}
    heads: dict = {}
    for key, value in keys.items():
        name, _, rest = key.partition(".")
        if name in VILBERT_TASK_HEADS:
            heads.setdefault(name, {})[_OUR_NAMES.get(name, "") + rest] = value
    other = sorted(k for k in keys if k not in encoder and k.split(".", 1)[0] not in VILBERT_TASK_HEADS)
    other = [k for k in other if k != "bert.embeddings.position_ids"]
    foreign = sorted(set(heads) - set(BETA_HEADS)) if layout == VILBERT_BETA else []
    if other or foreign:
        named = other + [f"{h}.*" for h in foreign]
        raise ConfigError(
            f"{path}: a {layout} with tensors of neither its model nor its task heads: {', '.join(named[:12])}"
            + (f" ... ({len(named)} in all)" if len(named) > 12 else "")
        )
    mcfg = _config(path, model, layout)
    table = encoder.get("bert.embeddings.task_embeddings.weight")
    mcfg = replace(mcfg, task_tokens=0 if table is None else int(table.shape[0]))
    return Published(path, layout, mcfg, encoder, {h: heads[h] for h in VILBERT_TASK_HEADS if h in heads})


def _published(path: Path, layout: str, mcfg, encoder: dict, head: dict, other: list) -> Published:
    if other:
        raise ConfigError(
            f"{path}: a {layout} with tensors of neither its encoder nor its task head: {', '.join(other[:12])}"
            + (f" ... ({len(other)} in all)" if len(other) > 12 else "")
        )
    if sorted(head) != sorted(HEAD_KEYS):
        raise ConfigError(f"{path}: its task head is not LXMERT's Linear-GeLU-LayerNorm-Linear: {', '.join(head)}")
    encoder.pop("embeddings.position_ids", None)  # a buffer some transformers versions save
    return Published(path, layout, mcfg, encoder, {LXMERT_HEAD: head})


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


_MODEL_HINT = {
    AIRSPLAY: "lxmert-base: the published 9/5/5 layers at BERT-base width",
    VILBERT_MT: "vilbert-base: its bert_base_6layer_6conect.json",
    VILBERT_BETA: "vilbert-base: its bert_base_6layer_6conect.json",
}


def _config(path: Path, model: Optional[str], layout: str):
    """The model config: --model, else the transformers folder's config.json."""
    kind = ViLBERTConfig if layout in (VILBERT_MT, VILBERT_BETA) else LxmertConfig
    if model:
        mcfg = families.load_config(model)
        if not isinstance(mcfg, kind):
            raise ConfigError(f"--model {model}: a {layout} is a {kind.model_type} model, not a {mcfg.model_type} one")
        return mcfg
    config = (path if path.is_dir() else path.parent) / "config.json"
    if layout != HF_QA or not config.is_file():
        raise ConfigError(
            f"{path}: a {layout} holds no model config: name it with --model "
            f"({_MODEL_HINT.get(layout, _MODEL_HINT[AIRSPLAY])})"
        )
    try:
        hf = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ConfigError(f"{config}: not a readable JSON config ({err})") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{config}: a model config is a JSON object, not a {type(hf).__name__}")
    return lxmert_config_of_hf(hf, name=path.name)


def lxmert_config_of_hf(hf: dict, name: str) -> LxmertConfig:
    """Our LXMERT config from a transformers ``LxmertConfig`` config.json (the same field
    names); a GELU other than BERT's exact one is refused (ours computes that one)."""
    if hf.get("model_type") != LxmertConfig.model_type:
        raise ConfigError(f"{name}: config.json is not an LXMERT config (model_type {hf.get('model_type')!r})")
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ConfigError(f"{name}: hidden_act {hf['hidden_act']!r}: only BERT's exact GELU ('gelu') is implemented")
    ours = {f.name for f in fields(LxmertConfig)} - {"name"}
    return LxmertConfig(name=name, **{k: v for k, v in hf.items() if k in ours})
