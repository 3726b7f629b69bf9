"""The demo's settings: `DemoConfig` (what `vlprep demo`'s flags set), the presets, the model
families and their mixtures, and the fixed budgets of evaluation and fine-tuning."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipeline.config import Config, at_least
from pipeline.errors import ConfigError

PRESETS = {  # images in the world, optimizer steps per model
    "full": {"n_images": 2000, "steps": 2500},
    "quick": {"n_images": 400, "steps": 1200},
}
MODELS = {"vilbert": "vilbert-small", "lxmert": "lxmert-small"}
MIXTURE_KINDS = {  # mixture folder -> the world's text sources in it
    "mixture_captions": ("coco_captions",),
    "mixture_lxmert": ("coco_captions", "vg_regions", "vqa"),
}
# ViLBERT: captions alone, as Conceptual Captions; LXMERT: COCO captions, VG region descriptions and questions
MIXTURES = {"vilbert": "mixture_captions", "lxmert": "mixture_lxmert"}
RETRIEVAL_IMAGES = 40
RETRIEVAL_CAPTIONS = 5  # queries per image: up to this many of its captions
TRANSFER_FILES = {  # task -> its files in the world's annotations/, in the order build-task reads them
    "vqa": (
        "v2_OpenEnded_mscoco_train2014_questions.json",
        "v2_mscoco_train2014_annotations.json",
        "v2_OpenEnded_mscoco_val2014_questions.json",
        "v2_mscoco_val2014_annotations.json",
    ),
    "nlvr2": ("nlvr2_train.json", "nlvr2_dev.json"),
    "flickr30k": ("dataset_flickr30k.json",),
    "refcoco+": ("refcoco+/refs(unc).p", "refcoco+/instances.json"),
    "vcr": ("vcr/train.jsonl", "vcr/val.jsonl"),
}
VQA_MIN_COUNT = 3  # the world's answers (colours, shapes, counts, yes/no) occur far more often
# One fine-tuning run: a short budget (a small fine-tuning set: 1,600 examples), validated twice.
TRANSFER_STEPS, TRANSFER_BATCH, TRANSFER_LR, TRANSFER_EVALS = 50, 32, 1e-3, 2
TRANSFER_RETRIEVAL_IMAGES = 20  # retrieval validation: the held-out split's first images, all their captions


@dataclass(frozen=True)
class DemoConfig(Config):
    out: Path
    quick: bool = False
    seed: int = 0
    n_images: Optional[int] = None  # default from the preset
    steps: Optional[int] = None
    vocab: Optional[Path] = None  # default: bert-base-uncased's vocab, shipped with vl_models
    weights: Optional[Path] = None  # default: the committed shapes detector
    detector: str = "shapes-tiny"
    transfer: bool = True  # fine-tune on the world's downstream tasks, pretrained vs from scratch
    transfer_seeds: int = 1  # fine-tuning seeds per table cell: seed, seed + 1, ...
    models: tuple[str, ...] = tuple(MODELS)  # the model families to pretrain, evaluate and fine-tune
    jobs: Optional[int] = None  # model families trained side by side (default: one per family, up to the cores)

    def __post_init__(self) -> None:
        at_least(
            self,
            {name: 1 for name in ("n_images", "steps", "transfer_seeds", "jobs") if getattr(self, name) is not None},
        )
        object.__setattr__(self, "models", tuple(self.models))
        unknown = [m for m in self.models if m not in MODELS]
        if unknown or not self.models or len(set(self.models)) != len(self.models):
            raise ConfigError(f"--models: each of {', '.join(MODELS)} at most once, at least one (got {self.models})")

    def jobs_used(self) -> int:
        """Processes for the model families: `jobs`, or one per family up to the cores."""
        return min(len(self.models), self.jobs or os.cpu_count() or 1)

    def fine_tuning_seeds(self) -> list[int]:
        return [self.seed + k for k in range(self.transfer_seeds)]

    def preset(self, key: str) -> int:
        value = getattr(self, key)
        return value if value is not None else PRESETS["quick" if self.quick else "full"][key]
