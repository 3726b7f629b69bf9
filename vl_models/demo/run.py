"""`run_demo`: the demo's stages in order into one folder, each announced as ``[i/n]`` and timed,
and the report they add up to (``report.json``, ``report.md``)."""

from __future__ import annotations

import json
import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from vl_models.data.tokenize import bundled_bert_vocab
from vl_models.demo.ask import ask_models
from vl_models.demo.config import (
    MIXTURE_KINDS,
    MODELS,
    TRANSFER_BATCH,
    TRANSFER_FILES,
    TRANSFER_LR,
    TRANSFER_STEPS,
    DemoConfig,
)
from vl_models.demo.families import run_families
from vl_models.demo.report import markdown, pictures
from vl_models.demo.stages import build_task_datasets, extract_features, make_mixture, make_world

log = logging.getLogger(__name__)


class _Stages:
    """The stages as they run: each announced as ``[i/n] message`` and its seconds kept in `times`."""

    def __init__(self, times: dict, total: int, say: Callable[[str], None]) -> None:
        self.times, self.total, self.say = times, total, say

    @contextmanager
    def stage(self, name: str, message: str) -> Iterator[None]:
        self.say(f"[{len(self.times) + 1}/{self.total}] {message}")
        self.times[name] = {"started": time.perf_counter()}
        yield
        self.times[name]["seconds"] = round(time.perf_counter() - self.times[name].pop("started"), 1)


def run_demo(cfg: DemoConfig, say: Callable[[str], None] = log.info) -> dict:
    """Run every stage into `cfg.out`; returns the report (also written as JSON and Markdown)."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        **cfg.to_json(),
        "n_images": cfg.preset("n_images"),
        "steps": cfg.preset("steps"),
        "jobs_used": cfg.jobs_used(),
    }
    report: dict = {"config": settings, "stages": {}}
    stages = _Stages(report["stages"], 6 if cfg.transfer else 5, say)
    report.update(_data(cfg, out, stages))
    tasks = _tasks(out, stages) if cfg.transfer else None
    report.update(_models(cfg, out, stages, tasks))
    report.update(_pictures_and_answers(cfg, out, stages))
    report["total_seconds"] = round(sum(s["seconds"] for s in report["stages"].values()), 1)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    return report


def _data(cfg: DemoConfig, out: Path, stages: _Stages) -> dict:
    """The world, its features (extracted from it served on 127.0.0.1) and the mixtures."""
    from pipeline.synthetic import served

    world = out / "world"
    with stages.stage("world", f"writing a shapes world of {cfg.preset('n_images')} scenes"):
        summary = make_world(world, cfg.preset("n_images"), cfg.seed)
    with served(world) as base_url:
        with stages.stage("extract", f"vlprep extract --dataset conceptual_captions (images served at {base_url})"):
            extracted = extract_features(cfg, world, out / "features")
    with stages.stage("mixtures", "vlprep build-mixture (captions + questions; captions alone)"):
        mixtures = {
            name: make_mixture(world, out / "features", out / name, kinds) for name, kinds in MIXTURE_KINDS.items()
        }
    return {"world": summary, "extract": extracted, "mixtures": mixtures}


def _tasks(out: Path, stages: _Stages) -> dict:
    """The transfer tasks' datasets."""
    with stages.stage("tasks", f"vlprep build-task: the world's {', '.join(TRANSFER_FILES)}"):
        return build_task_datasets(out)


def _models(cfg: DemoConfig, out: Path, stages: _Stages, tasks: Optional[dict]) -> dict:
    """Each model family pretrained, evaluated and (with `tasks`) fine-tuned; the report's
    ``pretrain``, ``evaluation``, ``models`` (seconds) and ``transfer``."""
    jobs, steps = cfg.jobs_used(), cfg.preset("steps")
    vocab = Path(cfg.vocab) if cfg.vocab else bundled_bert_vocab()
    message = (
        f"{', '.join(MODELS[kind] for kind in cfg.models)}: vltrain pretrain ({steps} steps), zero-shot retrieval "
        "and QA, pretrained vs untrained"
        + (f"; vltrain finetune on each task, pretrained vs scratch, {TRANSFER_STEPS} steps" if cfg.transfer else "")
        + (f" ({jobs} model families side by side)" if jobs > 1 else "")
    )
    with stages.stage("models", message):
        families = run_families(cfg, out, vocab, jobs, stages.say)
    result = {
        "pretrain": {kind: r["pretrain"] for kind, r in families.items()},
        "evaluation": {kind: r["evaluation"] for kind, r in families.items()},
        "models": {kind: r["seconds"] for kind, r in families.items()},
    }
    if tasks is not None:
        result["transfer"] = {
            "tasks": tasks,
            "seeds": cfg.fine_tuning_seeds(),
            "steps": TRANSFER_STEPS,
            "batch_size": TRANSFER_BATCH,
            "lr": TRANSFER_LR,
            "scores": {kind: r["transfer"] for kind, r in families.items()},
        }
    return result


def _pictures_and_answers(cfg: DemoConfig, out: Path, stages: _Stages) -> dict:
    """The pictures and, with transfer, the fine-tuned models' answers about a held-out scene."""
    message = "pictures and report" + (": asking the fine-tuned models about a held-out scene" if cfg.transfer else "")
    with stages.stage("report", message):
        result = {"pictures": pictures(out / "world", out, cfg.models)}
        if cfg.transfer:
            result["predict"] = ask_models(cfg, out)
            result["pictures"]["predict"] = result["predict"]["picture"]
    return result
