"""Scoring a fine-tuned (or, for retrieval, pretrained) model on a task split: predictions
in split order (`predict`), the task's official metric and its submission file.

Retrieval scores every caption against every image of the split (`score_pairs`): n_captions
x n_images pair scores, in batches of captions of similar length against one image at a time
(each batch and each image padded to what it uses, `vl_models.data.padding`). What is computed
once and reused: each caption's tokens and its single-modality states (LXMERT's language
encoder; ViLBERT's text layers before the first co-attention block), and each image's regions
(read from the store once) and single-modality states (LXMERT's object-relationship encoder;
ViLBERT's visual layers before the first co-attention block, none in the published configs:
its image embedding). Only the layers where the streams meet run per pair (LXMERT's
cross-modality encoder, ViLBERT's co-attention blocks and what follows them), then the pair
head — or the task head's own scorer where it has one (a vilbert-multi-task checkpoint's
fine-tuned ``vil_logit``) —, with the task's token where the model has task tokens. A progress
callback gets the pairs done, for a bar with an ETA.

Under torchrun (a validation inside `vltrain finetune`, or `vltrain evaluate` started by
torchrun) every rank scores its share (`distributed.shard`: batches of examples, or the
images of a retrieval split), the shares are gathered on every rank in the one-process
order, and rank 0 writes the files: no rank waits for another's whole evaluation.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from pipeline.errors import ConfigError
from pipeline.io import atomic_write_json, check_output, replacing_output
from pipeline.store import FeatureStore
from pipeline.task_data import TaskData
from vl_models import distributed, families, transfer
from vl_models.config import DataSettings, EvaluateConfig
from vl_models.data.padding import padded
from vl_models.models.configuration import check_text_length
from vl_models.models.weights import init_pretraining
from vl_models.train.checkpoint import resolve
from vl_models.train.run_folder import answers_digest
from vl_models.train.trainer import resolve_device
from vl_models.transfer.dataset import TaskDataset, check_given_stores
from vl_models.transfer.heads import RetrievalHead, TransferModel, build_transfer_model, run_heads
from vl_models.transfer.published import read_published
from vl_models.transfer.runs import backbone_state, data_settings, is_finetuned, model_of, our_run
from vl_models.transfer.task import Predictions

log = logging.getLogger(__name__)

Progress = Optional[Callable[[int, int], None]]  # (done, total) in examples or pairs
EVALUATION = "evaluation"  # the ownership marker's kind of an evaluation folder (`pipeline.io.replacing_output`)
METRICS = "metrics.json"
REPORT_KEYS = ("task", "split", "checkpoint", "zero_shot", "rows", "metrics")


def _to(batch: dict, device: str) -> dict:
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def predict(
    model,
    view: TaskDataset,
    device: str = "cpu",
    batch_size: int = 32,
    limit: int = 0,
    progress: Progress = None,
    workers: int = 0,
    readout: Optional[Callable[[torch.Tensor, dict], dict]] = None,
) -> Predictions:
    """The task's predictions on the view's examples (the first `limit` rows' when > 0);
    `readout(logits, batch)`: further per-example arrays to keep beside them (`vltrain
    predict`'s scores)."""
    task = view.task
    was_training = model.training
    model.eval()
    try:
        if getattr(task, "pairwise", False):
            return score_pairs(model, view, device, batch_size, limit, progress)
        rows = view.rows[:limit] if limit else view.rows
        examples = _example_indices(view, len(rows))
        batches = [examples[start : start + batch_size] for start in range(0, len(examples), batch_size)]
        mine = [batches[b] for b in distributed.shard(len(batches))]
        # Its own generator: iterating a loader must not draw from the global RNG (a validation
        # inside a run would shift the run's dropout and a resume would no longer be exact).
        loader = torch.utils.data.DataLoader(
            view, batch_sampler=mine, num_workers=workers, generator=torch.Generator().manual_seed(0)
        )
        scored, done = [], 0
        for batch in loader:
            batch = _to(padded(batch, view.cfg.padding), device)
            logits = model(task.name, batch)
            extra = readout(logits, batch) if readout else {}
            scored.append(
                {
                    k: np.asarray(v)
                    for k, v in {**task.predict(logits, batch), **extra, "index": batch["index"].cpu().numpy()}.items()
                }
            )
            done += len(batch["index"])
            if progress:
                progress(done, sum(map(len, mine)))
        scored = distributed.gather_shards(scored)
        keys = scored[0].keys() if scored else ()
        return Predictions(rows=rows, values={k: np.concatenate([b[k] for b in scored]) for k in keys})
    finally:
        model.train(was_training)


def _example_indices(view: TaskDataset, rows: int) -> list[int]:
    """The example indices of the view's first `rows` rows: one per row, or for a task with
    more (VCR) the first block of one per row, then each row's group of the rest."""
    n = len(view.rows)
    if len(view) == n:
        return list(range(rows))
    per_row = (len(view) - n) // n  # examples after the first block, per row
    return list(range(rows)) + [n + r * per_row + k for r in range(rows) for k in range(per_row)]


@torch.no_grad()
def score_pairs(
    model, view: TaskDataset, device: str, batch_size: int, limit: int = 0, progress: Progress = None
) -> Predictions:
    """Caption x image pair scores (the pair head's logits) over a retrieval split: the
    captions of the split (of its first `limit` images' when > 0) against its images."""
    images = list(dict.fromkeys(view.value("images", i)[0] for i in range(len(view.rows))))
    if limit:
        images = images[:limit]
    chosen = set(images)
    captions = [i for i in range(len(view.rows)) if view.value("images", i)[0] in chosen]
    image_of_caption = np.array([images.index(view.value("images", i)[0]) for i in captions])
    scores = pair_scores(model, view, captions, images, device, batch_size, progress)
    return Predictions(
        rows=view.rows[captions], values={"scores": scores, "image_of_caption": image_of_caption, "images": images}
    )


@torch.no_grad()
def pair_scores(
    model,
    view: TaskDataset,
    captions: Sequence[int],
    images: Sequence[str],
    device: str,
    batch_size: int,
    progress: Progress = None,
) -> np.ndarray:
    """(captions, images) pair scores of the view's rows `captions` (their texts) against the
    images `images` (store keys), as the module's docstring says: under torchrun each rank
    scores its share of the images, gathered on every rank."""
    family = model.family
    base = family.backbone(model.backbone)
    head = model.heads[view.task.name]
    token = model.task_tokens.get(view.task.name)
    padding = view.cfg.padding

    def tokens(n: int) -> dict:  # the task token's ids (a backbone with a task-token table)
        return {} if token is None else {"task_ids": torch.full((n,), token, dtype=torch.long, device=device)}

    # The captions in batches of similar length (shortest first), each padded to its own longest
    # (`padding` "batch"); the scores go back to the captions' order.
    texts = [view.text(view.value("text", i)) for i in captions]
    order = np.argsort([int(t["attention_mask"].sum()) for t in texts], kind="stable")
    chunks = []
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        text = _to(padded(torch.utils.data.default_collate([texts[c] for c in chunk]), padding), device)
        mask = text["attention_mask"]
        states = base.encode_text(text["input_ids"], mask, **tokens(len(chunk)))  # each caption's stream, once
        chunks.append((chunk, states, mask))
    mine = distributed.shard(len(images))
    total, done = len(captions) * len(mine), 0

    def column(key: str) -> np.ndarray:  # every caption's score against one image
        nonlocal done
        region = _to(padded(torch.utils.data.default_collate([view.image(key)]), padding), device)
        feats, pos, vmask = (region[k] for k in ("visual_feats", "visual_pos", "visual_mask"))
        vision = base.encode_vision(feats, pos, vmask)  # each image's stream, once
        out = np.zeros(len(captions), np.float32)
        for chunk, text, tmask in chunks:
            n = len(chunk)
            vis, vm = vision.expand(n, -1, -1), vmask.expand(n, -1)
            if isinstance(head, RetrievalHead):  # the pretraining pair head
                logits = family.cached_pair_logit(model.backbone, text, tmask, vis, vm, **tokens(n))
            else:  # a trained scorer of the pooled pair (a vilbert-multi-task checkpoint's vil_logit)
                pooled = base.cross(text, tmask, vis, vm, **tokens(n), **family.pooled_only).pooled_output
                logits = head.score(pooled).float()
            out[chunk] = logits.cpu().numpy()
            done += n
            if progress:
                progress(done, total)
        return out

    columns = distributed.gather_shards([column(images[j]) for j in mine])
    return np.stack(columns, axis=1) if columns else np.zeros((len(captions), 0), np.float32)


def evaluate_checkpoint(cfg: EvaluateConfig, progress: Progress = None) -> dict:
    """`vltrain evaluate`: score a fine-tuned run's ``cfg.task`` head on a split of a task
    dataset (a run of ours, or a published fine-tuned checkpoint: `vl_models.transfer.published`;
    or, with ``zero_shot``, a pretrained model's pair head on a retrieval task), write
    ``metrics.json`` and the task's submission file into ``cfg.out`` (default: the run folder's
    ``eval/<task>-<split>/``); returns {"metrics", "files", "examples"}. `progress(done, total)`
    is told the examples (retrieval: pairs) scored. The output follows every command's output
    rules (`pipeline.io.check_output`, checked before any work: no symbolic link, no file, no
    folder of someone else's; an evaluation folder of ours is replaced as a whole). The run's
    recorded stores, given stores and vocab are used unless given (``stores``, ``given_stores``,
    ``vocab``); one that is not there is named. ``given_stores``: the ground-truth boxes'
    feature stores (default: the run's), which VCR merges with the detections (RefCOCO scores
    on detections alone). Under torchrun the ranks share the scoring and rank 0 writes (the
    other ranks return no files).

    The examples are made with the settings the model was trained with: a run's own
    (`data_settings`), a published checkpoint's code's (`Published.data_settings`: text length,
    region slots, its IMG token's feature); ``max_regions`` (region slots per image, the IMG
    token not counted) and ``max_text`` (text tokens) replace them where given.
    ``nlvr2_packing`` ("per-image", the default; "mt": vilbert-multi-task's, `nlvr2.mt_packed`):
    how NLVR2's two images fill their rows. The settings used are logged and recorded in
    ``metrics.json`` (``settings``)."""
    device = resolve_device(cfg.device, distributed.world()[2])
    task = transfer.get(cfg.task)
    if cfg.nlvr2_packing is not None and task.name != "nlvr2":
        raise ConfigError(f"--nlvr2-packing: NLVR2's two images' rows; {task.name} has one image per example")
    source = str(resolve(cfg.checkpoint, cfg.step, role="--checkpoint")) if cfg.step else cfg.checkpoint
    if not (Path(source).exists() or Path(source).is_symlink()):
        raise ConfigError(f"--checkpoint {source} does not exist")
    data = TaskData.open(cfg.data, task=task.name)
    ckpt, run = our_run(source, role="--checkpoint")
    out, inputs = _output(cfg, task, source, ckpt)
    model = _load_model(cfg, task, data, source, ckpt, run)
    view, used = _view(cfg, task, data, run, model)
    model.transfer.to(device)
    distributed.init(device)
    predictions = predict(model.transfer, view, device, cfg.batch_size, cfg.limit, progress)
    metrics = task.score(data, predictions)
    if not distributed.is_main():
        return {"metrics": metrics, "files": [], "examples": int(len(predictions.rows))}
    report = {
        "task": task.name,
        "split": cfg.split,
        "checkpoint": str(ckpt or source),
        "zero_shot": cfg.zero_shot,
        "rows": int(len(predictions.rows)),
        "metrics": metrics,
        "settings": used,
    }
    files = _write(out, inputs, task, data, predictions, report)
    return {"metrics": metrics, "files": [str(f) for f in files], "examples": int(len(predictions.rows))}


def _output(cfg: EvaluateConfig, task, source: str, ckpt: Optional[Path]) -> tuple[Path, list[Path]]:
    """(the evaluation folder: ``cfg.out``, default the run folder's ``eval/<task>-<split>/``,
    the inputs it must not overlap), checked before any work (`pipeline.io.check_output`)."""
    out = cfg.out
    if out is None and ckpt is None:
        raise ConfigError("--out: where to write the metrics and predictions (the checkpoint is no run folder's)")
    if out is None:
        out = ckpt.parent.parent / "eval" / f"{task.name}-{cfg.split}{'-zero-shot' if cfg.zero_shot else ''}"
    inputs = [cfg.data, *cfg.stores, *(cfg.given_stores or ()), ckpt or Path(source)]
    check_output(
        out,
        EVALUATION,
        inputs=inputs + ([cfg.vocab] if cfg.vocab else []),
        what="vltrain evaluate",
        also_ours=_earlier_evaluation,
    )
    return out, inputs


class _Loaded(NamedTuple):
    """A checkpoint loaded for scoring: its family and model config, the transfer model, the
    published checkpoint it is (None: a run of ours) and the vocab (None: the run's)."""

    family: Any
    mcfg: Any
    transfer: TransferModel
    published: Optional[Any]
    vocab: Optional[Path]


def _load_model(cfg: EvaluateConfig, task, data: TaskData, source: str, ckpt: Optional[Path], run) -> _Loaded:
    """The model to score: the pretraining pair head (``zero_shot``), a published fine-tuned
    checkpoint, or a fine-tuning run of ours whose `task` head was trained on `data`'s answer
    table; ConfigError for a checkpoint that is none of them."""
    stores, published = cfg.stores, None
    if cfg.zero_shot:
        if not getattr(task, "pairwise", False):
            raise ConfigError(
                f"--zero-shot: {task.name} needs a fine-tuned head; only retrieval tasks "
                f"({', '.join(n for n in transfer.names() if getattr(transfer.get(n), 'pairwise', False))}) "
                "score with the pretraining pair head"
            )
        store = (stores or _run_paths(run, "stores", "--stores"))[0]
        family, mcfg = model_of(cfg.model, None if cfg.model else run, store, 1)
        tmodel = TransferModel(family, family.build(mcfg), {task.name: RetrievalHead(task.candidates)})
        if is_finetuned(run):
            tmodel.backbone.load_state_dict(backbone_state(ckpt))
        else:
            init_pretraining(tmodel.backbone, ckpt or Path(source), family.load_checkpoint)
    elif run is None and (published := read_published(source, cfg.model)) is not None:
        if not stores:
            raise ConfigError(f"--stores: the feature store(s) with the images ({source} names none)")
        published.check_store(FeatureStore.open(stores[0]).layout)
        family, mcfg = published.family, published.mcfg
        tmodel = published.transfer_model(task, len(data.answers))
        log.info("%s", published.note(task))
        return _Loaded(family, mcfg, tmodel, published, cfg.vocab or Path(published.vocab))
    else:
        if not is_finetuned(run) or task.name not in run["tasks"]:
            raise ConfigError(
                f"{source} is no fine-tuning run of {task.name} (its tasks: "
                f"{', '.join((run or {}).get('tasks') or ['none'])}), nor a published fine-tuned checkpoint "
                "(transformers LxmertForQuestionAnswering, airsplay/lxmert, vilbert-multi-task, vilbert_beta); "
                "zero-shot retrieval: --zero-shot"
            )
        if run["answers"][task.name] != answers_digest(data):
            raise ConfigError(
                f"{data.path}: its answer table is not the one the {task.name} head was trained on: "
                "evaluate on a task dataset built with the same answer table (--answers-from)"
            )
        family = families.from_run(run)
        mcfg = family.config_class.from_json(run["model"])
        tmodel = build_transfer_model(family, mcfg, [task], [data], **run_heads(run))
        tmodel.load_state_dict(backbone_state(ckpt, heads=(task.name,)))
    return _Loaded(family, mcfg, tmodel, published, cfg.vocab)


def _data_settings(cfg: EvaluateConfig, task, run, published) -> tuple[DataSettings, str, str]:
    """(the examples' settings, the IMG token's feature, where they come from): the published
    checkpoint's code's or the run's (the defaults for a checkpoint of neither), with
    ``max_regions`` and ``max_text`` where given."""
    max_regions, max_text = cfg.max_regions, cfg.max_text
    if published is not None:
        settings = published.data_settings(task, max_regions, max_text)
        img_feature, origin = published.img_feature, f"{published.layout}: {published.reference}"
    else:
        settings = data_settings(run, task.name) if run else DataSettings()
        given = {k: v for k, v in (("max_regions", max_regions), ("max_text", max_text)) if v is not None}
        settings = replace(settings, **given)
        img_feature, origin = "kept", "the run's settings" if run else "the defaults"
    if max_regions is not None or max_text is not None:
        origin += ", " + ", ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in (("max_regions", max_regions), ("max_text", max_text))
            if v is not None
        )
    return settings, img_feature, origin


def _view(cfg: EvaluateConfig, task, data: TaskData, run, model: _Loaded) -> tuple[TaskDataset, dict]:
    """(the split's examples as the model reads them, the settings used: `_settings_used`),
    logged; ConfigError for an image of the split that no store holds."""
    settings, img_feature, origin = _data_settings(cfg, task, run, model.published)
    given_stores = cfg.given_stores
    if given_stores is None:
        given_stores = (run and _run_paths(run, "given_stores", "--given-stores", required=False)) or ()
        given_stores = given_stores if task.ground_truth == "always" else ()  # the run's, where evaluation reads them
    else:
        check_given_stores([task], list(given_stores), training=False)
    vocab = model.vocab or (run and _run_paths(run, "vocab", "--vocab", required=False)) or ""
    view = TaskDataset(
        data,
        task,
        [Path(s) for s in (cfg.stores or _run_paths(run, "stores", "--stores"))],
        Path(vocab),
        model.family,
        settings,
        cfg.split,
        train=False,
        given_stores=[Path(s) for s in given_stores],
        img_feature=img_feature,
        packing=cfg.nlvr2_packing or "per-image",
    )
    max_text = cfg.max_text
    check_text_length(model.mcfg, view.max_text, f"--max-text {max_text}" if max_text else f"{task.name}'s text length")
    used = _settings_used(view, model.family, origin)
    log.info(
        "scoring %s %s with %s text tokens and %s region slots per image%s (%s)",
        task.name,
        cfg.split,
        used["max_text"],
        used["max_regions"],
        " and the IMG token (the mean of every region of the image)"
        if used.get("img_token") == "all"
        else (" and the IMG token" if model.family.img_token else ""),
        origin,
    )
    if task.name == "nlvr2":
        log.info("NLVR2's images: %s", PACKING_NOTES[used["nlvr2_packing"]])
    missing = view.missing_images()
    if missing:
        raise ConfigError(
            f"{len(missing)} images of {data.path} ({cfg.split}) are in no feature store, e.g. {', '.join(missing[:5])}"
        )
    return view, used


def _write(out: Path, inputs: list[Path], task, data: TaskData, predictions: Predictions, report: dict) -> list[Path]:
    """Write `report` (metrics.json) and the task's submission file into `out`, replacing an
    earlier evaluation there as a whole; the files written."""
    with replacing_output(out, EVALUATION, inputs, what="vltrain evaluate", also_ours=_earlier_evaluation) as tmp:
        tmp.mkdir()
        files = [out / task.write_submission(data, predictions, tmp).name, out / METRICS]
        atomic_write_json(tmp / METRICS, report)
    return files


PACKING_NOTES = {
    "per-image": "each in its own row of region slots",
    "mt": "packed as vilbert-multi-task packs them (the second's regions begin in the first row where the first has "
    "fewer regions than its slots)",
}


def _settings_used(view: TaskDataset, family, origin: str) -> dict:
    """What ``metrics.json`` records of the examples' settings: text tokens, region slots per
    image (the IMG token not counted), the IMG token's feature (a family with one), NLVR2's
    packing, and where they come from."""
    used = {"max_text": int(view.max_text), "max_regions": int(view.cfg.max_regions)}
    if family.img_token:
        used["img_token"] = view.img_feature
    if view.task.name == "nlvr2":
        used["nlvr2_packing"] = view.packing
    return {**used, "from": origin}


def _earlier_evaluation(folder: Path) -> bool:
    """Whether `folder` is an evaluation folder of a vltrain before the ownership marker: its
    files are a metrics.json of ours (`REPORT_KEYS`) and one submission file."""
    try:
        report = json.loads((folder / METRICS).read_text())
    except (OSError, ValueError):
        return False
    files = [p for p in folder.iterdir() if p.name != METRICS]
    return isinstance(report, dict) and set(REPORT_KEYS) <= set(report) and len(files) <= 1


def _run_paths(run: Optional[dict], key: str, flag: str, required: bool = True):
    """A path (or paths) the run recorded under ``train.<key>``, each checked to exist: runs of
    older versions recorded paths relative to the folder they were started in, so from another
    folder they are named, with the flag that gives them instead."""
    value = ((run or {}).get("train") or {}).get(key)
    if not value:
        if required:
            raise ConfigError(f"{flag}: the run records none; name it")
        return value
    for path in [value] if isinstance(value, str) else value:
        if not Path(path).exists():
            raise ConfigError(
                f"the run's {key.replace('_', ' ')} {path} is not there (seen from {Path.cwd()}; a run records the "
                f"paths it was given): name it with {flag}"
            )
    return value
