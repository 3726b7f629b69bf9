"""`vlprep extract`: images -> region features in a feature store, as one streaming Ray job.

The orchestration of an extract run; the distributor (`pipeline.distribute`) runs the
shards, `pipeline.detect.actor` holds the detector. Input shards (the same deterministic
shards as `vlprep download`, or chunks of an image source for ``--images``) flow through
CPU download tasks (`download.shard.download_rows`, on the nodes offering
``--download-resource`` when given) into detector actors (``--device auto``: one per
GPU of the cluster, with ``num_gpus=1``, when it has GPUs; else CPU actors reserving
``--actor-cpus`` each), whose region features the driver writes through the
feature-store writer: one store shard per input shard, committed before the shard's
``extract/NNNNN_stats.json`` (the done-marker, which also lists every failed image, its
reason and whether it is transient, and the node whose actor did the work). A rerun
skips shards already done; an actor that dies (its process or its node lost) is
restarted by Ray wherever there is room and its task retried; a shard whose task fails
is retried and then reported; one image that fails (an unexpected exception included)
fails alone.

``--retry-failed`` re-attempts the failed images of done shards that
`pipeline.failures.should_retry` selects: for ``--dataset`` the shard's items are derived again
(deterministic shards) and only those are downloaded; for ``--images`` they are read
from the source again. Their records go into the store as a new store shard, then the
shard's stats file is rewritten (atomically): a retry killed in between is redone by the
next one, and the store keeps one record per id. The summary judges the run
(`failures.verdict`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from pipeline import __version__
from pipeline.detect.actor import DetectorActor, image_failure, resolve_device
from pipeline.detect.backends import Detector, load_model, resolve
from pipeline.detect.config import ExtractConfig
from pipeline.detect.given_boxes import read_given_boxes
from pipeline.distribute import (
    MalformedRows,
    Progress,
    capacity,
    chunks,
    done_shards,
    ray_session,
    run_shards,
    shard_name,
    stats_path,
    summary,
    task_resources,
)
from pipeline.download.fetch import redact_url
from pipeline.download.shard import ShardJob, download_rows, policy_of, shard_jobs
from pipeline.errors import ConfigError, InvalidRecordError
from pipeline.failures import Policy, should_retry
from pipeline.image_shards import iter_images
from pipeline.io import atomic_write_json, exclusive_lock, remove_stale_tmp, sha256_file
from pipeline.store import FeatureStoreWriter, Manifest
from pipeline.store.manifest import MANIFEST_FILE

log = logging.getLogger(__name__)
EXTRACT_DIR = "extract"
SUMMARY_FILE = "extract_summary.json"


@dataclass(frozen=True)
class ExtractJob:
    """One shard of an extract run: its image rows, or its items to download first."""

    number: int
    work: Union[ShardJob, list[dict]]
    retrying: Optional[dict] = None  # the done shard's stats, when --retry-failed redoes some of its images


@dataclass
class ExtractProgress(Progress):
    """Image counters on top of the shard counters."""

    images: int = 0
    extracted: int = 0


def retry_ids(stats: dict, policy: Policy) -> set[str]:
    """Ids of a done shard's failed images that --retry-failed re-attempts under `policy`."""
    return {
        f["image_id"]
        for f in stats["failed_images"]
        if should_retry(f["kind"], bool(f.get("transient")), stats.get("policy"), policy)
    }


def done_extract_shards(out: Path) -> dict[int, dict]:
    return done_shards(out / EXTRACT_DIR, "extract stats (the shard's done-marker)")


def check_resumed_preprocess(cfg: ExtractConfig) -> None:
    """A store holds features of one resize convention: resuming one with another
    --preprocess is a configuration error (stores written before the option: caffe)."""
    if not (cfg.out / MANIFEST_FILE).is_file():
        return
    had = Manifest.read(cfg.out).provenance.get("preprocess", "caffe")
    if had != cfg.preprocess:
        raise ConfigError(
            f"cannot append to {cfg.out}: its features were extracted with --preprocess {had}, "
            f"not {cfg.preprocess}; rerun with --preprocess {had} or choose another --out"
        )


def extractor_options(cfg: ExtractConfig) -> dict:
    """The backend's own options of a run (what `build_extractor` takes besides the shared ones)."""
    return {"grid_pool": cfg.grid_pool} if cfg.grid_pool is not None else {}


def _image_rows(source: Path) -> Iterator[dict]:
    """The rows of an image source (``--images``), as the detector actors take them."""
    for item in iter_images(source):
        url = item.meta.get("url")
        yield {
            "image_id": item.image_id,
            "status": "ok",
            "image": item.data,
            "url": redact_url(url) if isinstance(url, str) else None,
        }


def run_extract(cfg: ExtractConfig, on_progress: Optional[Callable[[ExtractProgress], None]] = None) -> dict:
    """Run the extraction; returns the summary (also in `<out>/extract_summary.json`) with
    its verdict. The store's writer holds its lock; a --keep-images folder is locked too."""
    with contextlib.ExitStack() as locks:
        if cfg.keep_images:
            locks.enter_context(exclusive_lock(cfg.keep_images, "image-shard folder"))
        return _run_extract(cfg, on_progress)


def _run_extract(cfg: ExtractConfig, on_progress: Optional[Callable[[ExtractProgress], None]]) -> dict:
    import ray  # here, not at the top: configs and the CLI load without Ray

    detector = resolve(cfg.detector)
    backend = detector.backend
    check_resumed_preprocess(cfg)
    options = extractor_options(cfg)
    if cfg.weights is not None:  # validate the weights before any work starts
        model, report = load_model(detector, cfg.weights)
        detector = Detector(backend, model.cfg)  # as loaded (a file without an attribute head has none)
        del model
        weights = {"weights_sha256": report.sha256, "weights_layout": report.layout, "weights_file": cfg.weights.name}
    else:
        weights = {"weights_sha256": f"random-seed-{cfg.seed}", "random_weights": True}
        log.warning("--random-weights: features come from an untrained detector (smoke runs only)")
    provenance = {
        "producer": f"vlprep {__version__} extract",
        "detector": detector.name,
        "extractor": detector.to_json(),
        "preprocess": cfg.preprocess,
        "box_policy": backend.describe_selection(cfg.selection, options),
        "max_regions": backend.max_regions(detector.config, cfg.selection, options),
        "fp16": cfg.fp16,
        **weights,
    }
    if cfg.labelmap is not None:  # the names of objects_id / attrs_id travel with the store
        provenance["labels"] = backend.label_names(detector.config, cfg.labelmap)
    given = None
    if cfg.given_boxes is not None:
        given = read_given_boxes(cfg.given_boxes)
        provenance["box_policy"] = (
            f"given boxes from {Path(cfg.given_boxes).name} (sha256 {sha256_file(Path(cfg.given_boxes))[:16]})"
        )
        provenance["max_regions"] = max((len(b) for b in given.values()), default=None)
    with ray_session(cfg.distribute):
        device = resolve_device(
            cfg.device, ray.cluster_resources().get("GPU", 0)
        )  # the cluster's GPUs, not the driver's
        writer = FeatureStoreWriter(
            cfg.out,
            backend=cfg.backend,
            shard_size=10**12,
            resume=True,
            feature_dim=backend.feature_dim(detector.config),
            dtype=cfg.dtype,
            cls_prob=cfg.cls_prob,
            attr_prob=cfg.attr_prob if backend.attributes(detector.config) else "none",
            provenance={**provenance, "device": device},
            config=cfg.to_json(),
            regions=backend.regions,
        )
        writer.open()  # takes the store's write lock: from here on, temporary files left behind are a killed run's
        try:
            failed_shards, malformed = _extract_shards(cfg, writer, detector, device, given, options, on_progress)
        except BaseException:
            writer.abort()  # keeps the committed shards; the error that stopped us is the one shown
            raise
    writer.close()
    result = _summarize(cfg, failed_shards, malformed)
    atomic_write_json(cfg.out / SUMMARY_FILE, result)
    return result


def _extract_shards(
    cfg: ExtractConfig,
    writer: FeatureStoreWriter,
    detector: Detector,
    device: str,
    given: Optional[dict],
    options: dict,
    on_progress: Optional[Callable[[ExtractProgress], None]],
) -> tuple[dict, MalformedRows]:
    """Run the shards not done yet through download tasks and detector actors (inside the
    run's `ray_session`); returns the failed shards and the malformed input rows."""
    import ray

    (cfg.out / EXTRACT_DIR).mkdir(exist_ok=True)
    for folder in (cfg.out / EXTRACT_DIR, cfg.keep_images):
        for stale in remove_stale_tmp(folder) if folder else ():
            log.info("removed %s left by a killed run", stale)
    done = done_extract_shards(cfg.out)
    policy = policy_of(cfg.fetch, cfg.image)
    progress = ExtractProgress()
    malformed = MalformedRows()

    def jobs() -> Iterator[ExtractJob]:
        if cfg.images is not None:
            source = chunks(_image_rows(Path(cfg.images)), cfg.distribute.shard_size)
        else:
            source = (
                (job.number, job)
                for job in shard_jobs(cfg.dataset, cfg.inputs, cfg.reader, cfg.distribute.shard_size, malformed)
            )
        for number, work in source:
            retrying = done.get(number)
            if retrying is not None:
                ids = retry_ids(retrying, policy) if cfg.distribute.retry_failed else set()
                if not ids:
                    progress.shards_done += 1
                    continue
                work = (
                    ShardJob(number, tuple(i for i in work.items if i.image_id in ids), retry_failed=True)
                    if isinstance(work, ShardJob)
                    else [r for r in work if r["image_id"] in ids]
                )
            yield ExtractJob(number, work, retrying)

    gpu = device.startswith("cuda")
    n_actors = cfg.actors or (max(1, int(ray.cluster_resources().get("GPU", 0))) if gpu else 1)
    # A GPU actor reserves one GPU and no CPU; a CPU actor --actor-cpus. Ray restarts a dead
    # actor (its process, or its node, lost) wherever there is room, and retries its tasks.
    placement = {"num_gpus": 1, "num_cpus": 0} if gpu else {"num_cpus": cfg.actor_cpus}
    actor_cls = ray.remote(**placement, max_restarts=-1, max_task_retries=2)(DetectorActor)
    given_ref = ray.put(given) if given is not None else None
    actors = [
        actor_cls.remote(
            detector.to_json(),
            str(cfg.weights) if cfg.weights else None,
            cfg.seed,
            cfg.selection,
            device,
            cfg.fp16,
            cfg.batch_size,
            given_ref,
            cfg.preprocess,
            options,
        )
        for _ in range(n_actors)
    ]
    downloads = task_resources(cfg.distribute)
    download = ray.remote(**downloads, max_retries=3)(download_rows)
    keep_images = str(cfg.keep_images) if cfg.keep_images else None
    turn = itertools.count()

    def submit(job: ExtractJob):
        rows = (
            download.remote(job.work, cfg.fetch, cfg.image, keep_images) if isinstance(job.work, ShardJob) else job.work
        )
        return actors[next(turn) % len(actors)].extract.remote(job.number, rows)

    failed_shards = run_shards(
        jobs(),
        submit,
        commit=lambda job, result: _commit(cfg, writer, result, progress, policy, job.retrying),
        retries=cfg.distribute.shard_retries,
        max_in_flight=2 * len(actors) + 1,
        progress=progress,
        on_progress=(lambda: on_progress(progress)) if on_progress else None,
        capacity=capacity(cfg.distribute, *[placement] * n_actors, *[downloads] * (cfg.images is None)),
    )
    return failed_shards, malformed


def _commit(
    cfg: ExtractConfig,
    writer: FeatureStoreWriter,
    result: dict,
    progress: ExtractProgress,
    policy: Policy,
    retrying: Optional[dict] = None,
) -> None:
    """Write a shard's records, commit them as one store shard, then its stats (done-marker).
    For a retry (`retrying`: the shard's stats so far) the stats are merged: the retried
    images' old failures are replaced by this outcome."""
    written = present = 0
    failed_images = list(result["failures"])
    for rec in result["records"]:
        try:
            if writer.write(rec):
                written += 1
            else:
                present += 1
        except InvalidRecordError as err:  # e.g. a given box outside its image
            failed_images.append(
                image_failure({"image_id": rec.image_id}, "invalid record", f"{err.field}: {err.reason}")
            )
    writer.commit_shard()
    attempted = len(result["records"]) + len(result["failures"])
    stats = {
        "shard": shard_name(result["number"]),
        "count": attempted,
        "extracted": written,
        "already_present": present,
        "retried": 0,
        **result["node"],
    }
    if retrying is not None:
        redone = {rec.image_id for rec in result["records"]} | {f["image_id"] for f in result["failures"]}
        failed_images = [f for f in retrying["failed_images"] if f["image_id"] not in redone] + failed_images
        stats.update(
            count=retrying["count"],
            extracted=retrying["extracted"] + written,
            already_present=retrying["already_present"] + present,
            retried=retrying.get("retried", 0) + attempted,
        )
    failures = Counter(f["kind"] for f in failed_images)
    stats.update(
        failures=dict(failures.most_common()), failed_images=failed_images, policy=policy, finished=time.time()
    )
    atomic_write_json(stats_path(cfg.out / EXTRACT_DIR, result["number"]), stats)
    progress.images += attempted
    progress.extracted += written


def _summarize(cfg: ExtractConfig, failed_shards: dict, malformed: MalformedRows) -> dict:
    shards = done_extract_shards(cfg.out)
    images = sum(s["count"] for s in shards.values())
    extracted = sum(s["extracted"] + s["already_present"] for s in shards.values())
    return {
        "store": str(cfg.out),
        "shards_done": len(shards),
        "images": images,
        "extracted": extracted,
        **summary(shards, failed_shards, malformed, images, extracted, cfg.distribute.max_failure_rate),
    }
