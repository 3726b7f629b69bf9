"""`vltrain predict`'s settings: `PredictConfig`, a frozen dataclass that checks itself when
built, so a bad combination is a `ConfigError` naming its flag before any model is loaded.

No torch here: `vltrain --help` builds the command's flags from these fields
(`vl_models.predict.command`) without loading a model. The fields, as the help's panels group
them: the model (checkpoint, step, vocab, task_data, device, batch_size); the query (image,
images, image_id, question, statement, expression, caption, text, choice, rationale, answer,
task, top_k, or a queries file); the outputs (out, show); the detector of new images (store,
weights, detector, detector_threads, allow_private_network).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipeline.config import Config, check_device
from pipeline.errors import ConfigError


@dataclass(frozen=True)
class PredictConfig(Config):
    """What `vltrain predict` asks, of which model, and where the answers go."""

    checkpoint: str  # a run folder (its latest checkpoint, or `step`) or a checkpoint file
    # the query, as flags: one of question, statement, expression, caption, text
    image: tuple[str, ...] = ()  # files or http(s) URLs (two for a statement)
    images: tuple[str, ...] = ()  # what a caption ranks: files, folders, URLs
    image_id: tuple[str, ...] = ()  # images of the feature store, by id
    question: Optional[str] = None
    statement: Optional[str] = None
    expression: Optional[str] = None
    caption: tuple[str, ...] = ()
    text: Optional[str] = None
    choice: tuple[str, ...] = ()  # VCR: the 4 answer choices
    rationale: tuple[str, ...] = ()  # VCR: the 4 rationales
    answer: Optional[int] = None  # VCR QA->R: the answer the rationales are conditioned on
    task: Optional[str] = None  # the head, where several fit
    top_k: Optional[int] = None  # answers (None: 5) or ranked items (None: all)
    queries: Optional[Path] = None  # or the queries of a JSON-lines file
    out: Optional[Path] = None  # the results as JSON lines (None: standard output)
    show: Optional[Path] = None  # a PNG of one query's answer
    step: Optional[str] = None  # a step's checkpoint, or best
    store: Optional[Path] = None  # the store whose detector runs on new images (None: the run's)
    weights: Optional[Path] = None  # the detector weights, where the recorded file is not here
    detector: Optional[str] = None  # the detector config, where the recorded one is not here
    vocab: Optional[Path] = None  # None: the run's
    task_data: tuple[str, ...] = ()  # TASK=FOLDER: a head's task dataset, where the run's is not here
    allow_private_network: bool = False  # fetch image URLs on private networks too
    device: str = "cpu"
    batch_size: int = 16  # examples per forward
    detector_threads: Optional[int] = None  # None: the store's extract actors'

    def __post_init__(self) -> None:
        for name in ("image", "images", "image_id", "caption", "choice", "rationale", "task_data"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("queries", "out", "show", "store", "weights", "vocab"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, Path(getattr(self, name)))
        flagged = bool(self.caption) or any(
            v is not None for v in (self.question, self.statement, self.expression, self.text)
        )
        if (self.queries is None) != flagged:
            raise ConfigError("ask with the flags (--question, --statement, ...) or with --queries FILE, one of them")
        if self.show is not None and self.queries is not None:
            raise ConfigError("--show draws one query: leave out --queries")
        for value, flag in (
            (self.batch_size, "--batch-size"),
            (self.detector_threads, "--detector-threads"),
            (self.top_k, "--top-k"),
        ):
            if value is not None and value < 1:
                raise ConfigError(
                    f"{flag} must be >= 1, got {value}"
                    + " (leave it out: 5 answers, whole rankings)" * (flag == "--top-k")
                )
        if self.show is not None and self.show.suffix.lower() != ".png":
            raise ConfigError(f"--show {self.show}: the picture is a PNG; give a .png path")
        self.task_folders  # raises for an entry that is no TASK=FOLDER
        check_device("device", self.device)
        if self.out is not None and self.show is not None and self.out.resolve() == self.show.resolve():
            raise ConfigError(f"--out and --show are the same file ({self.out}); give each its own")

    @property
    def task_folders(self) -> dict[str, str]:
        """``task_data`` as task name -> task dataset folder."""
        folders = {}
        for entry in self.task_data:
            name, sep, folder = entry.partition("=")
            if not sep or not name or not folder:
                raise ConfigError(f"--data {entry!r}: TASK=FOLDER")
            folders[name] = folder
        return folders
