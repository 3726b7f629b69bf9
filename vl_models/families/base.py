"""What the trainer, the dataset, evaluation and export need to know about one model
architecture, in one object: a `ModelFamily`.

A family says
* which config class describes the model (its JSON ``model_type`` is the family's name),
  and how the data fixes some of its dimensions (`fit`), and builds it (`build`);
* how an example looks to it (the data view): the box encoding (4-d or 5-d), whether an
  IMG token leads the regions, the default text length, the region-masking flavour and the
  regression / classification targets of its masked regions (`visual_targets`);
* its pretraining losses (`losses`, named by `tasks`), its image-text pair score
  (`pair_logit` / `pair_score`, for retrieval), its QA head if it has one (`answer_logits`);
* what fine-tuning heads read (`encode`: pooled pair vector, region states, pair logit;
  `widths`), the dropout before a per-region scorer (`head_dropout`), the scorer a retrieval
  fine-tune trains by default (`retrieval_head`), the head layers tasks trained together share
  (`shared_head`), a task's token for a model with task tokens (`task_token`; a new table:
  `with_task_tokens`) and the region-feature width it reads (`feature_dim`);
* its validation scores and their direction (`eval_metrics`), the module `torch.compile`
  wraps (`backbone`), and whether DDP must look for unused parameters.

Families are found by name in the registry (`vl_models.families.get`); adding a model is one
new file that defines a family and calls `register`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence

import numpy as np
import torch

from pipeline.errors import ConfigError
from pipeline.store.buffer import RegionBatch
from pipeline.store.layout import StoreLayout
from vl_models.data.masking import RegionMasking

# Caption -> image retrieval over the val split, scored by the pair head (every family).
RETRIEVAL_METRICS = {f"eval_retrieval_R@{k}": "max" for k in (1, 5, 10)}


@dataclass
class Encoded:
    """A backbone's outputs for B x C candidates (flattened, candidate-major within an example)."""

    pooled: torch.Tensor  # (B*C, H) the pooled pair vector
    vision: Optional[torch.Tensor]  # (B*C, N, H_v) the region states (None when not asked for)
    pair: torch.Tensor  # (B*C,) the pair head's logit (higher: the text matches the image)


class ModelFamily:
    """Base of the families; subclasses set the class attributes and the methods."""

    name: ClassVar[str]
    config_class: ClassVar[type]
    tasks: ClassVar[tuple[str, ...]]  # pretraining losses, named as in --loss-weight / --task-from
    eval_metrics: ClassVar[dict[str, str]]  # validation score -> "max" | "min" (better)
    max_text: ClassVar[int]  # default text tokens per item
    position: ClassVar[str]  # box encoding: "4d" (x1y1x2y2) or "5d" (+ area)
    img_token: ClassVar[bool] = False  # a whole-image token before the regions
    region_masking: ClassVar[RegionMasking]
    region_overlap: ClassVar[tuple[str, ...]] = ("keep",)  # the masking variants it supports
    region_fields: ClassVar[tuple[str, ...]] = ()  # the optional record fields `visual_targets` reads
    label_tasks: ClassVar[tuple[str, ...]] = ()  # pretraining losses that learn a detector's labels
    answers: ClassVar[bool] = False  # a QA head over the mixture's answer table (`answer_logits`)
    pair_task: ClassVar[str]  # the task (in `tasks`) whose head gives `pair_score`
    pair_loss: ClassVar[str] = "ce"  # NLVR2's loss in the family's own reference (`heads.PairHead`)
    # Retrieval's fine-tuned scorer by default (`vl_models.config.RETRIEVAL_HEADS`): "pretraining" (the pair
    # head; a family whose reference fine-tunes no retrieval) or "new" (a new Linear(H, 1) on the pooled pair).
    retrieval_head: ClassVar[str] = "pretraining"
    task_token_table: ClassVar[Optional[str]] = None  # the task-token table's key in `build`'s state dict

    def fit(self, mcfg: Any, layout: StoreLayout, answers: int, store: str) -> Any:
        """`mcfg` with the dimensions the data fixes (feature width, label counts, answer
        table size); ConfigError naming `store` when the store lacks what the model needs."""
        raise NotImplementedError

    def check_labels(self, layout: StoreLayout, weights: dict, store: str) -> None:
        """ConfigError when a loss of `label_tasks` is on (its weight in `weights`, 1 by
        default) and the store is a grid: grid features carry no detector labels (no object or
        attribute ids, no class distribution) to learn."""
        on = [t for t in self.label_tasks if weights.get(t, 1.0) > 0]
        if layout.regions == "grid" and on:
            raise ConfigError(
                f"{store} holds grid features, which carry no detector labels, and {self.name}'s "
                f"{' and '.join(on)} loss{'es' if len(on) > 1 else ''} learn{'' if len(on) > 1 else 's'} them: "
                f"turn {'them' if len(on) > 1 else 'it'} off ({' '.join(f'--loss-weight {t}=0' for t in on)}) or "
                "train on a detector's store"
            )

    def check_label_ids(self, mcfg: Any, stores: Sequence[str]) -> None:
        """ConfigError up front when a store's detector label ids do not fit the label counts
        of `mcfg` (the fitted config); a family whose losses read no label ids checks nothing."""

    def build(self, mcfg: Any) -> torch.nn.Module:
        """The pretraining model (all heads)."""
        raise NotImplementedError

    def load_checkpoint(self, model: torch.nn.Module, state: dict) -> str:
        """Fill `model` strictly from a checkpoint of this model's own published format (a
        state dict); returns what was loaded, for the log (`--init`; BERT checkpoints are
        read for every family by `weights.init_pretraining`)."""
        raise NotImplementedError(f"{self.name} reads no checkpoint format of its own")

    def backbone(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module `--compile` compiles in place (the heads decode at data-dependent positions)."""
        raise NotImplementedError

    def visual_targets(self, regions: RegionBatch, original: np.ndarray, image: str) -> dict:
        """The masked-region targets of one example, from its padded (unmasked) regions."""
        raise NotImplementedError

    region_positions: ClassVar[str] = "region_positions"  # the model's keyword for the regions to decode

    def forward(self, model, batch: dict, decode: bool = True):
        """The model's outputs on a batch, decoding tokens and regions at the masked positions;
        with ``decode=False`` the decoders are skipped (nothing to predict: pair and answer
        heads only)."""
        if decode:
            tokens, regions = batch["lm_labels"] != -1, batch["region_selected"].bool()
        else:
            tokens, regions = no_positions(batch)
        return model(
            batch["input_ids"],
            batch["visual_feats"],
            batch["visual_pos"],
            batch["attention_mask"],
            batch["visual_mask"],
            lm_positions=tokens,
            **{self.region_positions: regions},
        )

    def losses(self, model, batch: dict, qa_active: bool, visual_weighting: str) -> tuple[dict, dict]:
        """(per-task losses, metrics) of one batch, keyed by `tasks`."""
        raise NotImplementedError

    pair_output: ClassVar[str]  # the pretraining output holding the pair head's two logits
    pair_positive: ClassVar[int]  # which of the two means "the text matches the image"

    def pair_head(self, model: torch.nn.Module) -> torch.nn.Module:
        """The pair head (pooled pair vector -> its two logits)."""
        raise NotImplementedError

    def pair_logit(self, outputs) -> torch.Tensor:
        """(B,) the pair head's log-odds that the text matches the image, from `forward`'s outputs."""
        return self._margin(getattr(outputs, self.pair_output))

    def _margin(self, logits: torch.Tensor) -> torch.Tensor:
        logits, p = logits.float(), self.pair_positive
        return logits[:, p] - logits[:, 1 - p]

    def cached_pair_logit(
        self,
        model,
        text: torch.Tensor,
        text_mask: torch.Tensor,
        vision: torch.Tensor,
        vision_mask: torch.Tensor,
        **task_ids,
    ) -> torch.Tensor:
        """`pair_logit` from single-modality states computed once (the backbone's `encode_text` /
        `encode_vision`): only the layers where the streams meet run per pair (retrieval).
        ``task_ids``: the task tokens `encode_text` had (a backbone with a task-token table)."""
        out = self.backbone(model).cross(text, text_mask, vision, vision_mask, **task_ids, **self.pooled_only)
        return self._margin(self.pair_head(model)(out.pooled_output))

    # `cross`'s keywords for an output of the pooled pair vector alone (LXMERT's: it then skips
    # what only the token and region states need).
    pooled_only: ClassVar[dict] = {}

    def pair_score(self, model, batch: dict) -> torch.Tensor:
        """(B,) the probability that the text matches the image (the pair head's two-way softmax)."""
        return torch.sigmoid(self.pair_logit(self.forward(model, batch, decode=False)).float())

    def widths(self, mcfg) -> tuple[int, int]:
        """(pooled pair vector, region state) widths of the backbone: the transfer heads' inputs."""
        raise NotImplementedError

    def encode(self, model, batch: dict, task_token: Optional[int] = None, vision: bool = True) -> Encoded:
        """The backbone's outputs for fine-tuning heads (`Encoded`): `batch` holds C candidates
        per example ((B, C, ...) tensors), flattened to B*C pairs, with their ``token_type_ids``
        where the batch has them. `task_token`: the task's token id (`task_token`), given to
        every pair. Of the pretraining heads only the pair head runs. `vision=False`: the head
        reads no region state (``Encoded.vision`` may be None: `pooled_only`)."""
        flat = [
            batch[k].flatten(0, 1) for k in ("input_ids", "visual_feats", "visual_pos", "attention_mask", "visual_mask")
        ]
        extra = {}
        if "token_type_ids" in batch:
            extra["token_type_ids"] = batch["token_type_ids"].flatten(0, 1)
        if task_token is not None:
            extra["task_ids"] = torch.full((flat[0].shape[0],), task_token, dtype=torch.long, device=flat[0].device)
        out = self.backbone(model)(*flat, **extra, **({} if vision else self.pooled_only))
        return Encoded(
            pooled=out.pooled_output,
            vision=out.vision_output,
            pair=self._margin(self.pair_head(model)(out.pooled_output)),
        )

    def task_token(self, mcfg: Any, task: str) -> Optional[int]:
        """The id of `task`'s task token for a model of config `mcfg` (None: the model has no
        task tokens)."""
        return None

    def with_task_tokens(self, mcfg: Any) -> Any:
        """`mcfg` with a task-token table (``vltrain finetune --task-tokens``; `mcfg` itself when
        it has one); ConfigError for a family without task tokens."""
        raise ConfigError(
            f"--task-tokens: {self.name} has no task tokens (vilbert-multi-task's --task_specific_tokens is "
            "ViLBERT's); leave it out (a --recipe's value: --no-task-tokens)"
        )

    def head_dropout(self, mcfg: Any) -> float:
        """The dropout probability on the region states before a per-region scorer (`heads.RegionHead`)."""
        return mcfg.hidden_dropout_prob

    def shared_head(self, kind: str) -> Optional[str]:
        """The name of the scoring layer that the task heads of `kind` (`heads.KINDS`) share when
        their tasks train together (one module, one set of parameters), as the family's reference
        shares its heads across tasks; None: each task its own."""
        return None

    def feature_dim(self, mcfg: Any) -> int:
        """The region-feature width the model reads."""
        raise NotImplementedError

    def qa_head(self, model: torch.nn.Module):
        """The pretraining QA head's ``Linear, GeLU, LayerNorm, Linear`` (an `nn.Sequential`)
        that fine-tuning answer heads start from; None for a family without one."""
        return None

    def answer_logits(self, outputs) -> torch.Tensor:
        """The QA head's logits in `forward`'s outputs (families with `answers`)."""
        raise NotImplementedError(f"{self.name} has no QA head")

    def __repr__(self) -> str:
        return f"<model family {self.name}>"


def no_positions(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and region position masks with nothing selected (decoders skipped)."""
    return (
        torch.zeros_like(batch["attention_mask"], dtype=torch.bool),
        torch.zeros_like(batch["visual_mask"], dtype=torch.bool),
    )
