"""`vlprep demo`: the whole pipeline on the embedded shapes world, offline, on CPU.

1. writes a shapes world (`pipeline.synthetic`) and serves its images on 127.0.0.1;
2. `vlprep extract --dataset conceptual_captions` on its CC-style TSVs through the real
   download path, with the committed tiny shapes detector, into a feature store;
3. `vlprep build-mixture`: COCO-style captions + VQA-style questions (renamed to the store's
   ids by the world's image map), held-out scenes as the val split — LXMERT's mixture; ViLBERT's
   has the captions alone, as Conceptual Captions has;
4. with transfer (the seeds' Table 1 in miniature; `--no-transfer` skips it), `vlprep
   build-task` on the world's VQA, NLVR2, Flickr30k, RefCOCO+ and VCR files;
5. per model family, the families side by side in processes of their own where there are
   cores for it (`--jobs`): `vltrain pretrain` of small ViLBERT or LXMERT (64 wide, from
   scratch, initialized at their width's scale), every task on from step 0, the image-text
   alignment / matching loss at weight 3; zero-shot caption -> image retrieval on held-out
   scenes for the pretrained model and the same model untrained, and LXMERT's QA score; with
   transfer, `vltrain finetune` on each task from the pretraining run and from scratch: the
   same model config, vocab, short budget (steps, batch, learning rate) and seeds, validated
   on the task's val / dev split, the best score of each run kept;
6. `report.json`, `report.md`, `scenes.png` (detections, as `vlprep show` draws them) and
   the training curves.

The demo orchestrates both packages, so it lives above them (imports run one way: `pipeline`
never imports `vl_models`). It reaches the `vlprep` command line as a plugin: the entry point
``demo = "vl_models.demo:register"`` of the group ``vlprep.commands`` (pyproject.toml), which
`pipeline.cli` loads when it starts.
"""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console

from pipeline.config import Config, at_least
from pipeline.errors import ConfigError
from pipeline.log import named_errors
from vl_models.config import TrainConfig
from vl_models.data.tokenize import bundled_bert_vocab

# `vlprep` imports this module at every start (to attach the command): the stages import
# their torch-, Ray- and Arrow-heavy modules inside the functions that run them.

log = logging.getLogger(__name__)

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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A static file server for `folder` on 127.0.0.1 (free port), in a daemon thread."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def run_demo(cfg: DemoConfig, say: Callable[[str], None] = log.info) -> dict:
    """Run every stage into `cfg.out`; returns the report (also written as JSON and Markdown)."""
    from pipeline.synthetic import write_cc_tsvs, write_world

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = Path(cfg.vocab) if cfg.vocab else bundled_bert_vocab()
    settings = {
        **cfg.to_json(),
        "n_images": cfg.preset("n_images"),
        "steps": cfg.preset("steps"),
        "jobs_used": cfg.jobs_used(),
    }
    report: dict = {"config": settings, "stages": {}}

    stages = 6 if cfg.transfer else 5

    def stage(name: str, message: str):
        say(f"[{len(report['stages']) + 1}/{stages}] {message}")
        report["stages"][name] = {"started": time.perf_counter()}
        return report["stages"][name]

    def done(entry: dict) -> None:
        entry["seconds"] = round(time.perf_counter() - entry.pop("started"), 1)

    world = out / "world"
    entry = stage("world", f"writing a shapes world of {cfg.preset('n_images')} scenes")
    if not (world / "summary.json").exists():
        write_world(world, cfg.preset("n_images"), cfg.seed)
    report["world"] = json.loads((world / "summary.json").read_text())
    done(entry)

    server, base_url = serve(world)
    try:
        write_cc_tsvs(world, base_url)
        entry = stage("extract", f"vlprep extract --dataset conceptual_captions (images served at {base_url})")
        report["extract"] = _extract(cfg, world, out / "features")
        done(entry)
    finally:
        server.shutdown()

    entry = stage("mixtures", "vlprep build-mixture (captions + questions; captions alone)")
    report["mixtures"] = {
        name: _mixture(world, out / "features", out / name, kinds) for name, kinds in MIXTURE_KINDS.items()
    }
    done(entry)

    if cfg.transfer:
        entry = stage("tasks", f"vlprep build-task: the world's {', '.join(TRANSFER_FILES)}")
        tasks = _task_datasets(out)
        done(entry)

    jobs, steps = settings["jobs_used"], settings["steps"]
    entry = stage(
        "models",
        f"{', '.join(MODELS[kind] for kind in cfg.models)}: vltrain pretrain ({steps} steps), zero-shot retrieval "
        "and QA, pretrained vs untrained"
        + (f"; vltrain finetune on each task, pretrained vs scratch, {TRANSFER_STEPS} steps" if cfg.transfer else "")
        + (f" ({jobs} model families side by side)" if jobs > 1 else ""),
    )
    families = _families(cfg, out, vocab, jobs, say)
    done(entry)
    report["pretrain"] = {kind: r["pretrain"] for kind, r in families.items()}
    report["evaluation"] = {kind: r["evaluation"] for kind, r in families.items()}
    report["models"] = {kind: r["seconds"] for kind, r in families.items()}
    if cfg.transfer:
        report["transfer"] = {
            "tasks": tasks,
            "seeds": cfg.fine_tuning_seeds(),
            "steps": TRANSFER_STEPS,
            "batch_size": TRANSFER_BATCH,
            "lr": TRANSFER_LR,
            "scores": {kind: r["transfer"] for kind, r in families.items()},
        }

    entry = stage(
        "report",
        "pictures and report" + (": asking the fine-tuned models about a held-out scene" if cfg.transfer else ""),
    )
    report["pictures"] = _pictures(world, out, cfg.models)
    if cfg.transfer:
        report["predict"] = _ask(cfg, out)
        report["pictures"]["predict"] = report["predict"]["picture"]
    done(entry)
    report["total_seconds"] = round(sum(s["seconds"] for s in report["stages"].values()), 1)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.md").write_text(markdown(report))
    return report


def _extract(cfg: DemoConfig, world: Path, store: Path) -> dict:
    from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
    from pipeline.detect.config import BoxCount, ExtractConfig, SelectionConfig
    from pipeline.detect.run import run_extract
    from pipeline.distribute import DistributeConfig
    from pipeline.download.fetch import FetchConfig

    summary = run_extract(
        ExtractConfig(
            out=store,
            dataset="conceptual_captions",
            inputs=(world / "Train_GCC-training.tsv", world / "Validation_GCC-1.1.0-Validation.tsv"),
            weights=Path(cfg.weights) if cfg.weights is not None else shapes_tiny_weights(),
            detector=cfg.detector,
            selection=SelectionConfig("butd", BoxCount.parse("10-20")),
            batch_size=8,
            device="cpu",
            distribute=DistributeConfig(shard_size=250, workers=2),
            fetch=FetchConfig(allow_private_network=True),
        )
    )
    return {k: summary[k] for k in ("images", "extracted", "failures", "shards_failed", "malformed_rows")}


def mixture_spec(world: Path, kinds: tuple[str, ...] = ("coco_captions", "vqa")) -> dict:
    """Captions (COCO-style JSON), region descriptions (Visual Genome JSON, train images only)
    and questions (VQA-style JSON) of the world, the sources of the given kinds; val2014 = held
    out. File paths are absolute: the spec loads wherever it is written (relative ones would be
    taken relative to the spec's folder)."""
    world = Path(world).absolute()
    a = world / "annotations"
    spec = {
        "name": "shapes-demo",
        "image_map": [str(world / "image_map.tsv")]
        + ([str(world / "vg" / "image_map.tsv")] if "vg_regions" in kinds else []),
        "answers": {"top_k": 100},
        "sources": [
            {"name": "captions", "kind": "coco_captions", "files": [str(a / "captions_train2014.json")]},
            {
                "name": "captions_val",
                "kind": "coco_captions",
                "files": [str(a / "captions_val2014.json")],
                "split": "val",
            },
            {"name": "vg", "kind": "vg_regions", "files": [str(world / "vg" / "region_descriptions.json")]},
            {
                "name": "vqa",
                "kind": "vqa",
                "files": [
                    str(a / "v2_OpenEnded_mscoco_train2014_questions.json"),
                    str(a / "v2_mscoco_train2014_annotations.json"),
                ],
            },
            {
                "name": "vqa_val",
                "kind": "vqa",
                "split": "val",
                "files": [
                    str(a / "v2_OpenEnded_mscoco_val2014_questions.json"),
                    str(a / "v2_mscoco_val2014_annotations.json"),
                ],
            },
        ],
    }
    spec["sources"] = [s for s in spec["sources"] if s["kind"] in kinds]
    return spec


def _mixture(world: Path, store: Path, mix: Path, kinds: tuple[str, ...]) -> dict:
    import yaml

    from pipeline.mixture import Mixture
    from pipeline.mixture.build import MixtureSpec, build_mixture

    spec_path = mix.parent / f"{mix.name}_spec.yaml"
    spec_path.write_text(yaml.safe_dump(mixture_spec(world, kinds), sort_keys=False))
    manifest = build_mixture(MixtureSpec.load(spec_path), mix, stores=(store,), drop_missing=True)
    return {"totals": manifest["totals"], "answers": len(Mixture.open(mix).answers)}


def _train_config(cfg: DemoConfig, kind: str, out: Path, vocab: Path, steps: int) -> TrainConfig:
    from vl_models import families

    pair = families.get(kind).pair_task  # the task whose head scores retrieval: weighted up
    return TrainConfig.of(
        model=MODELS[kind],
        stores=(str(out / "features"),),
        mixture=str(out / MIXTURES[kind]),
        out=str(out / "runs" / kind),
        vocab=str(vocab),
        steps=steps,
        batch_size=32,
        lr=1e-3,
        warmup=max(1, steps // 20),
        checkpoint_every=max(1, steps // 2),
        eval_every=steps,
        log_every=max(1, steps // 60),
        max_text=24,
        max_regions=20,
        seed=cfg.seed,
        resume="yes",
        weights={pair: 3.0},
    )


def _pretrain(cfg: DemoConfig, kind: str, out: Path, vocab: Path, say: Callable[[str], None]) -> dict:
    from vl_models.train import run_folder
    from vl_models.train.trainer import run

    steps = cfg.preset("steps")
    started = time.perf_counter()
    tcfg = _train_config(cfg, kind, out, vocab, steps)
    run(
        tcfg,
        on_step=lambda step, m, total: (
            step % max(1, steps // 5) == 0
            and say(
                f"      {kind} step {step}/{steps}: "
                + ", ".join(f"{k[5:]} {v:.3f}" for k, v in m.items() if k.startswith("loss_"))
            )
        ),
    )
    # the last training row, of this call or (a run resumed at its end) an earlier one
    log_file = Path(tcfg.out) / run_folder.METRICS
    rows = [json.loads(line) for line in log_file.read_text().splitlines() if line.strip()]
    last = [r for r in rows if "lr" in r][-1]
    return {
        "model": MODELS[kind],
        "steps": steps,
        "seconds": round(time.perf_counter() - started, 1),
        "final": {k: v for k, v in last.items() if k.startswith("loss_")},
    }


def _evaluate(cfg: DemoConfig, kind: str, out: Path, vocab: Path) -> dict:
    """The same evaluation for the trained model and a fresh one built with the same seed."""
    import torch

    from pipeline.mixture import Mixture
    from vl_models import families
    from vl_models.eval.evaluate import evaluate
    from vl_models.train import checkpoint
    from vl_models.train.trainer import build_model, split_data

    tcfg = _train_config(cfg, kind, out, vocab, cfg.preset("steps"))
    mixture = Mixture.open(out / MIXTURES[kind])
    answers = mixture.answers
    family = families.get(kind)
    val = split_data(tcfg, mixture, family, "val")  # as the run validated
    result = {}
    for name in ("untrained", "pretrained"):
        torch.manual_seed(cfg.seed)
        _, _, model = build_model(tcfg, len(answers))
        if name == "pretrained":
            model.load_state_dict(checkpoint.load_latest(out / "runs" / kind)["model"])
        scores = evaluate(family, model, val, retrieval_images=RETRIEVAL_IMAGES, captions_per_image=RETRIEVAL_CAPTIONS)
        result["retrieval_images"] = scores.pop("eval_retrieval_images", 0)  # 0: under two images to rank
        result[name] = {
            k[5:]: round(v, 4)
            for k, v in scores.items()
            if k.startswith("eval_retrieval")
            or k in ("eval_qa_score", "eval_alignment_acc", "eval_matching_acc", "eval_mlm_acc")
        }
    return result


def _task_datasets(out: Path) -> dict:
    """`vlprep build-task` on the world's files of each transfer task (kept when built
    before): per task its row counts, validation split and metric."""
    from pipeline.task_data import task_manifest
    from vl_models import transfer
    from vl_models.transfer.build import build_task

    world = out / "world"
    tasks = {}
    for name, files in TRANSFER_FILES.items():
        task, folder = transfer.get(name), out / "tasks" / name
        manifest = task_manifest(folder) or build_task(
            task,
            [world / "annotations" / f for f in files],
            folder,
            image_map=world / "image_map.tsv",
            min_count=VQA_MIN_COUNT if name == "vqa" else None,
        )
        tasks[name] = {
            "train": manifest["splits"][task.train_split],
            "val_split": task.val_split,
            "val": manifest["splits"][task.val_split],
            "metric": task.metric[len(f"eval_{name}_") :],
            **({"answers": manifest["answers"]["count"]} if manifest["answers"] else {}),
        }
    return tasks


def _families(cfg: DemoConfig, out: Path, vocab: Path, jobs: int, say: Callable[[str], None]) -> dict:
    """`_family` of each model family: one after the other in this process, or with `jobs`
    > 1 side by side in processes of their own (spawned, each with its share of this
    process's torch threads), whose messages and log records come back here."""
    if jobs <= 1:
        return {kind: _family(cfg, kind, out, vocab, say) for kind in cfg.models}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    relay = threading.Thread(target=_relay, args=(queue, say), daemon=True)
    relay.start()
    threads = max(1, torch.get_num_threads() // jobs)
    level = logging.getLogger().getEffectiveLevel()
    try:
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_child, initargs=(queue, threads, level))
        with pool:
            futures = {kind: pool.submit(_family, cfg, kind, out, vocab) for kind in cfg.models}
            return {kind: future.result() for kind, future in futures.items()}
    finally:
        queue.put(None)
        relay.join()


_child_queue = None  # in a family's process: where its messages and log records go


def _child(queue, threads: int, level: int) -> None:
    """Set up a family's process: torch threads, messages and log records to the parent."""
    import logging.handlers

    import torch

    global _child_queue
    _child_queue = queue
    torch.set_num_threads(threads)
    handler = logging.handlers.QueueHandler(queue)
    handler.setFormatter(logging.Formatter("%(message)s"))  # the parent's handlers add the rest
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _relay(queue, say: Callable[[str], None]) -> None:
    """In the parent: the families' messages to `say`, their log records to this process's logging."""
    for item in iter(queue.get, None):
        if isinstance(item, logging.LogRecord):
            logging.getLogger(item.name).handle(item)
        else:
            say(item)


def _family(cfg: DemoConfig, kind: str, out: Path, vocab: Path, say: Optional[Callable[[str], None]] = None) -> dict:
    """One model family's part of the demo: pretraining, the zero-shot evaluation, and with
    `cfg.transfer` fine-tuning on every task from scratch and from the pretraining run, with
    the same budget and seeds (the best validation score of each run, the task's official
    metric); the seconds each took."""
    say = say or _child_queue.put
    seconds = {}

    def timed(part: str, work: Callable[[], object]):
        started = time.perf_counter()
        value = work()
        seconds[part] = round(time.perf_counter() - started, 1)
        return value

    result = {
        "pretrain": timed("pretrain", lambda: _pretrain(cfg, kind, out, vocab, say)),
        "evaluation": timed("evaluate", lambda: _evaluate(cfg, kind, out, vocab)),
    }
    if cfg.transfer:
        scores = timed(
            "transfer",
            lambda: {
                name: {
                    init: [_finetune(cfg, kind, name, init, seed, out, vocab) for seed in cfg.fine_tuning_seeds()]
                    for init in ("scratch", "pretrained")
                }
                for name in TRANSFER_FILES
            },
        )
        say(
            f"      {MODELS[kind]}: "
            + "; ".join(f"{t} {_mean(r['scratch']):.1f} -> {_mean(r['pretrained']):.1f}" for t, r in scores.items())
        )
        result["transfer"] = scores
    return {**result, "seconds": seconds}


def _mean(values: list) -> float:
    return sum(values) / len(values)


def _finetune(
    cfg: DemoConfig,
    kind: str,
    task_name: str,
    init: str,
    seed: int,
    out: Path,
    vocab: Path,
    steps: int = TRANSFER_STEPS,
) -> float:
    """One fine-tuning run; returns its best validation score (the trainer's best checkpoint).
    Another budget than the demo's (`bench/demo_transfer_budget.py`) runs into a folder of its own."""
    from vl_models import transfer
    from vl_models.config import FinetuneConfig
    from vl_models.train import checkpoint
    from vl_models.transfer.finetune import run_finetune

    pairwise = getattr(transfer.get(task_name), "pairwise", False)
    run = out / "transfer" / kind / f"{task_name}-{init}-seed{seed}"
    if steps != TRANSFER_STEPS:
        run = run.with_name(f"{run.name}-steps{steps}")
    pretrained = init == "pretrained"
    run_finetune(
        FinetuneConfig.of(
            tasks=(task_name,),
            task_data=(str(out / "tasks" / task_name),),
            stores=(str(out / "features"),),
            out=str(run),
            init=str(out / "runs" / kind) if pretrained else None,
            model=None if pretrained else MODELS[kind],
            vocab=str(vocab),
            epochs=None,
            steps=steps,
            batch_size=TRANSFER_BATCH,
            lr=TRANSFER_LR,
            warmup=0.1,
            max_text=24,
            max_regions=20,
            seed=seed,
            eval_every=steps // TRANSFER_EVALS,
            keep_last=1,
            checkpoint_every=steps,
            log_every=steps,
            resume="yes",
            eval_items=TRANSFER_RETRIEVAL_IMAGES if pairwise else 0,
        )
    )  # max_text 24: every text of the world fits
    return round(checkpoint.load(checkpoint.pointed(run, checkpoint.BEST))["best"]["value"], 2)


def _pictures(world: Path, out: Path, models: tuple[str, ...]) -> dict:
    from pipeline.detect.show import render, side_by_side
    from pipeline.store import FeatureStore
    from pipeline.synthetic import attribute_names, object_names
    from vl_models.train.plot import plot_run

    store = FeatureStore.open(out / "features")
    tiles = []
    for i in range(4):
        rec = store.get(f"cc3m-val-{i:08d}")
        image = (world / "images" / f"shapes_val_{i:08d}.jpg").read_bytes()
        tiles.append(
            render(rec, image, max_regions=6, min_conf=0.3, objects=object_names(), attributes=attribute_names())
        )
    side_by_side(tiles).save(out / "scenes.png")
    curves = {kind: str(plot_run(out / "runs" / kind, out / f"{kind}_curves.png").relative_to(out)) for kind in models}
    return {"scenes": "scenes.png", **{f"{k}_curves": v for k, v in curves.items()}}


PREDICT_TASKS = ("vqa", "refcoco+")  # what the demo asks its fine-tuned models about a held-out scene


def _ask(cfg: DemoConfig, out: Path) -> dict:
    """`vltrain predict` as a user tries it after the demo: each family's fine-tuned (from
    pretraining) VQA and RefCOCO+ models asked about one held-out scene, from its JPEG — a
    question and a referring expression the world has for it, with their true answer and box —
    and the answers drawn into ``predict.png``."""
    from collections import Counter

    import numpy as np

    from pipeline.detect.show import side_by_side
    from pipeline.task_data import TaskData
    from vl_models.eval.metrics import box_iou_pairs
    from vl_models.predict import load_predictor, picture

    refs = TaskData.open(out / "tasks" / "refcoco+")
    ref = int(refs.rows("val")[0])
    key = refs.images(ref)[0]  # cc3m-val-NNNNNNNN: the held-out scene images/shapes_val_NNNNNNNN.jpg
    scene = out / "world" / "images" / f"shapes_val_{key.rsplit('-', 1)[1]}.jpg"
    vqa = TaskData.open(out / "tasks" / "vqa")
    question = next(int(r) for r in vqa.rows("val") if vqa.images(int(r))[0] == key)
    queries = {
        "vqa": {"image": str(scene), "question": vqa.column("text")[question]},
        "refcoco+": {"image": str(scene), "expression": refs.column("text")[ref]},
    }
    truth_box = np.asarray(refs.column("box")[ref], np.float64)
    asked, tiles = {}, []
    for kind in cfg.models:
        asked[kind] = {}
        for task in PREDICT_TASKS:
            run = out / "transfer" / kind / f"{task}-pretrained-seed{cfg.seed}"
            predictor = load_predictor(run, step="best")
            result = predictor.ask([queries[task]])[0]
            if task == "vqa":
                truth = Counter(vqa.column("answers")[question]).most_common(1)[0][0]  # the annotators' choice
                asked[kind][task] = {"answer": result["answer"], "score": round(result["score"], 3), "truth": truth}
            else:
                iou = float(box_iou_pairs(np.asarray([result["box"]]), truth_box[None])[0])
                asked[kind][task] = {"box": [round(v, 1) for v in result["box"]], "iou": round(iou, 3)}
            tiles.append(picture(predictor, queries[task], result, f"{MODELS[kind]}, fine-tuned on {task}"))
    side_by_side(tiles, gap=8).save(out / "predict.png")
    command = (
        f"vltrain predict --checkpoint {out / 'transfer' / cfg.models[-1] / f'vqa-pretrained-seed{cfg.seed}'} "
        f'--step best --image {scene} --question "{queries["vqa"]["question"]}"'
    )
    return {
        "scene": str(scene.relative_to(out)),
        "question": queries["vqa"]["question"],
        "expression": queries["refcoco+"]["expression"],
        "truth_box": [float(v) for v in truth_box],
        "answers": asked,
        "picture": "predict.png",
        "command": command,
    }


def markdown(report: dict) -> str:
    cfg, ev = report["config"], report["evaluation"]
    n = next(iter(ev.values()))["retrieval_images"]
    lines = [
        f"# vlprep demo ({'quick' if cfg['quick'] else 'full'}): the shapes world end to end",
        "",
        f"{cfg['n_images']} scenes, {cfg['steps']} pretraining steps per model, seed {cfg['seed']}; "
        f"{report['total_seconds']:.0f} s in all.",
        "",
        "| stage | seconds |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {s['seconds']:.1f} |" for name, s in report["stages"].items()]
    if report.get("models"):
        lines += [
            "",
            "Seconds per model family: "
            + "; ".join(
                f"{MODELS[kind]} " + ", ".join(f"{part} {s:.1f}" for part, s in parts.items())
                for kind, parts in report["models"].items()
            )
            + (f" ({cfg['jobs_used']} side by side)." if cfg.get("jobs_used", 1) > 1 else "."),
        ]
    ext = report["extract"]
    lines += [
        "",
        f"Extraction: {ext['extracted']} of {ext['images']} images (failures: {ext['failures'] or 'none'}); "
        "mixtures: " + "; ".join(f"{name} {m['totals']}" for name, m in report["mixtures"].items()) + ".",
        "",
        f"Zero-shot caption -> image retrieval over {n} held-out scenes, queried with "
        f"{next(iter(ev.values()))['pretrained'].get('retrieval_queries', n)} of their captions "
        f"(chance R@1 = {1 / n:.3f}):",
        "",
        "| model | R@1 | R@5 | R@10 | QA score |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, rows in ev.items():
        for name in ("untrained", "pretrained"):
            m = rows[name]
            qa = f"{m['qa_score']:.3f}" if "qa_score" in m else "–"
            lines.append(
                f"| {MODELS[kind]}, {name} | {m.get('retrieval_R@1', 0):.3f} | {m.get('retrieval_R@5', 0):.3f} "
                f"| {m.get('retrieval_R@10', 0):.3f} | {qa} |"
            )
    if "transfer" in report:
        lines += [""] + transfer_table(report["transfer"])
    if "predict" in report:
        lines += [""] + predict_lines(report["predict"])
    lines += ["", "![detections](scenes.png)", ""] + [
        f"![{k}]({v})" for k, v in report["pictures"].items() if k not in ("scenes", "predict")
    ]
    return "\n".join(lines) + "\n"


def predict_lines(p: dict) -> list[str]:
    """The demo's last step as Markdown lines: what the fine-tuned models said about a held-out scene."""
    lines = [
        f"Asked about the held-out scene `{p['scene']}` (`vltrain predict`, from the JPEG): "
        f'"{p["question"]}" (truth: {next(iter(p["answers"].values()))["vqa"]["truth"]}) and '
        f'"{p["expression"]}":',
        "",
        "| model (fine-tuned from pretraining) | VQA answer (score) | grounded box (IoU with the truth) |",
        "|---|---|---|",
    ]
    for kind, a in p["answers"].items():
        lines.append(
            f"| {MODELS[kind]} | {a['vqa']['answer']} ({a['vqa']['score']:.2f}) | "
            f"{', '.join(f'{v:.0f}' for v in a['refcoco+']['box'])} ({a['refcoco+']['iou']:.2f}) |"
        )
    return lines + ["", f"![predictions]({p['picture']})", "", "Try it yourself:", "", f"    {p['command']}"]


def transfer_table(t: dict) -> list[str]:
    """The transfer stage as Markdown lines: task x (family, scratch | pretrained), the mean
    best validation score over the seeds (each seed's in brackets when there are several)."""
    seeds = t["seeds"]
    lines = [
        f"Transfer: fine-tuning from the pretraining runs vs from scratch (the same model config and vocab; "
        f"{t['steps']} steps of {t['batch_size']}, lr {t['lr']:g}, seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(map(str, seeds))}); the best validation score, official metric:",
        "",
        "| task (train / val rows, metric) | "
        + " | ".join(f"{MODELS[k]} {init}" for k in t["scores"] for init in ("scratch", "pretrained"))
        + " |",
        "|---|" + "---:|" * 2 * len(t["scores"]),
    ]
    for name, info in t["tasks"].items():
        cells = []
        for kind in t["scores"]:
            for init in ("scratch", "pretrained"):
                values = t["scores"][kind][name][init]
                each = f" ({', '.join(f'{v:.1f}' for v in values)})" if len(values) > 1 else ""
                cells.append(f"{_mean(values):.1f}{each}")
        lines.append(
            f"| {name} ({info['train']} / {info['val']} {info['val_split']}, {info['metric']}) | "
            + " | ".join(cells)
            + " |"
        )
    return lines


# --------------------------------------------------------------------------- the vlprep command


def demo(
    out: Path = typer.Option(
        Path("vlprep_demo"), help="Folder for everything the demo writes (a rerun with the same settings resumes)."
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help=(
            "About 3.5 minutes on 2 cores, the transfer stage included: 400 scenes, 1,200 steps per model (what "
            "CI runs)."
        ),
    ),
    seed: int = typer.Option(0, help="Seed of the world, the sampling and the models."),
    n_images: int = typer.Option(None, help="Scenes in the world (default 2000; --quick 400)."),
    steps: int = typer.Option(None, help="Pretraining steps per model (default 2500; --quick 1200)."),
    vocab: Path = typer.Option(None, help="WordPiece vocab (default: bert-base-uncased's, shipped with vlprep)."),
    weights: Path = typer.Option(
        None,
        help=(
            "Detector weights for the extract stage (default: the committed shapes detector; another must be trained "
            "on the shapes world)."
        ),
    ),
    detector: str = typer.Option("shapes-tiny", help="Detector config of --weights (a name or a JSON path)."),
    transfer: bool = typer.Option(
        True,
        "--transfer/--no-transfer",
        help=(
            "Fine-tune both models on the world's VQA, NLVR2, Flickr30k, RefCOCO+ and VCR, pretrained vs from scratch "
            "(--no-transfer: skip the stage)."
        ),
    ),
    transfer_seeds: int = typer.Option(
        1,
        help=(
            "Fine-tuning seeds per task and model (each adds a run from pretraining and one from scratch per task and "
            "model)."
        ),
    ),
    models: str = typer.Option(
        ",".join(MODELS),
        help="The model families to pretrain, evaluate and fine-tune, comma-separated: vilbert, lxmert or both.",
    ),
    jobs: int = typer.Option(
        None,
        help=(
            "Model families trained side by side, each in a process of its own with its share of the torch threads "
            "(default: one per family, up to the cores; 1: one after the other)."
        ),
    ),
) -> None:
    """The whole pipeline on the embedded shapes world, offline, on CPU: write a synthetic
    world and serve it on 127.0.0.1, `vlprep extract` through the real download path with the
    committed tiny shapes detector, `vlprep build-mixture` (captions + questions for LXMERT,
    captions alone for ViLBERT), `vltrain pretrain` of small ViLBERT and LXMERT from scratch,
    then zero-shot caption -> image retrieval on held-out scenes for the pretrained and the
    untrained models, and LXMERT's QA score; last, `vlprep build-task` and `vltrain finetune`
    of both models on the world's VQA, NLVR2, Flickr30k, RefCOCO+ and VCR, from their
    pretraining and from scratch with the same budget (--no-transfer skips it).

    Writes OUT/report.md and report.json (the numbers), OUT/scenes.png (detections) and the
    training curves; docs/demo.md shows a run and its timings. --models vilbert (or lxmert)
    runs one model family alone.

    Example:

        vlprep demo --quick --out vlprep_demo
    """
    from rich.markdown import Markdown

    stdout = Console()
    report = run_demo(
        DemoConfig(
            out=out,
            quick=quick,
            seed=seed,
            n_images=n_images,
            steps=steps,
            vocab=vocab,
            weights=weights,
            detector=detector,
            transfer=transfer,
            transfer_seeds=transfer_seeds,
            models=tuple(m.strip() for m in models.split(",") if m.strip()),
            jobs=jobs,
        ),
        say=stdout.print,
    )
    stdout.print()
    stdout.print(Markdown((out / "report.md").read_text().split("![")[0]))
    stdout.print(
        f"report: {out / 'report.md'} ({report['total_seconds']:.0f} s); pictures: "
        + ", ".join(str(out / p) for p in report["pictures"].values())
    )
    stdout.print(  # its stores, task datasets, mixtures and runs on a local page (pip install 'vlprep[serve]')
        f"look at it all and ask the models in a browser: vlprep serve {out / 'features'} --tasks {out} "
        f"--runs {out} --images {out / 'world'}",
        soft_wrap=True,
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    """Attach `vlprep demo` to the vlprep app (the ``vlprep.commands`` entry point)."""
    app.command("demo")(named_errors(demo))
