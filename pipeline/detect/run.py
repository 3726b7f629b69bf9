"""`vlprep extract`: images -> region features in a feature store, as one streaming Ray job.

Input shards (the same deterministic shards as `vlprep download`, or chunks of an image
source for ``--images``) flow through CPU download tasks into detector actors (one per
GPU with ``num_gpus=1``, or CPU actors), whose region features the driver writes through
the feature-store writer: one store shard per input shard, committed before the shard's
``extract/NNNNN_stats.json`` (the done-marker, which also lists every failed image, its
reason and whether it is transient). A rerun skips shards already done; an actor that
dies is restarted by Ray and its task retried; a shard whose task fails is retried and
then reported; one image that fails (an unexpected exception included) fails alone.

``--retry-failed`` re-attempts the failed images of done shards that
`failures.should_retry` selects: for ``--dataset`` the shard's items are derived again
(deterministic shards) and only those are downloaded; for ``--images`` they are read
from the source again. Their records go into the store as a new store shard, then the
shard's stats file is rewritten (atomically): a retry killed in between is redone by the
next one, and the store keeps one record per id. The summary judges the run
(`failures.verdict`). Paths are made absolute in the config (workers on other nodes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from pipeline import __version__
from pipeline.datasets import ReaderOptions
from pipeline.detect.config import DetectorConfig
from pipeline.detect.extractor import RegionFeatureExtractor, SelectionConfig
from pipeline.detect.preprocess import check_preprocess
from pipeline.detect.weights import WEIGHT_SOURCES, load_detector
from pipeline.download.failures import Policy, policy_of, shard_failure, should_retry, verdict
from pipeline.download.fetch import FetchConfig, redact_url
from pipeline.download.images import ImageConfig, ImageError, load_rgb
from pipeline.download.run import absolute, check_failure_rate
from pipeline.download.shard import ShardJob, fetch_rows, shard_stats
from pipeline.errors import ConfigError, InvalidRecordError
from pipeline.image_shards import iter_images, read_shard_rows, shard_name, write_shard
from pipeline.io import atomic_write_json, exclusive_lock, read_json, remove_stale_tmp, sha256_file

log = logging.getLogger(__name__)
EXTRACT_DIR = "extract"
SUMMARY_FILE = "extract_summary.json"


@dataclass(frozen=True)
class ExtractConfig:
    out: Path
    dataset: Optional[str] = None
    inputs: tuple[Path, ...] = ()
    images: Optional[Path] = None
    weights: Optional[Path] = None
    random_weights: bool = False
    detector: str = "vg-r101"
    preprocess: str = "caffe"  # resize convention: caffe (BUTD) or detectron2 (py-bottom-up-attention)
    selection: SelectionConfig = SelectionConfig()
    batch_size: int = 1
    device: str = "auto"
    fp16: bool = False
    actors: Optional[int] = None  # default: one per GPU, else 1
    backend: str = "arrow"
    dtype: str = "float16"
    cls_prob: str = "full"
    attr_prob: str = "full"
    shard_size: int = 1000
    workers: int = 2
    threads: int = 16
    ray_address: Optional[str] = None
    shard_retries: int = 2
    retry_failed: bool = False
    max_failure_rate: float = 0.5  # exit 1 above this failed fraction of the store's images
    keep_images: Optional[Path] = None
    given_boxes: Optional[Path] = None  # JSON/Arrow/Parquet of image_id -> boxes: extract exactly those
    seed: int = 0  # for --random-weights
    reader: ReaderOptions = ReaderOptions()
    fetch: FetchConfig = FetchConfig()
    image: ImageConfig = ImageConfig()

    def __post_init__(self) -> None:
        for name in ("out", "images", "weights", "keep_images", "given_boxes"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, absolute(getattr(self, name)))
        object.__setattr__(self, "inputs", tuple(absolute(p) for p in self.inputs))
        if (self.images is None) == (self.dataset is None):
            raise ConfigError("give either --dataset with --input files, or --images")
        if self.dataset is not None and not self.inputs:
            raise ConfigError("--dataset needs at least one --input")
        if self.images is not None and not Path(self.images).exists():
            raise ConfigError(f"image source not found: {self.images}")
        if self.weights is None and not self.random_weights:
            raise ConfigError(f"--weights is required: {WEIGHT_SOURCES} (or --random-weights for a smoke run)")
        if self.weights is not None and self.random_weights:
            raise ConfigError("give --weights or --random-weights, not both")
        for name in ("batch_size", "shard_size", "workers", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.given_boxes is not None and not Path(self.given_boxes).exists():
            raise ConfigError(f"given-boxes file not found: {self.given_boxes}")
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ConfigError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        check_failure_rate(self.max_failure_rate)
        check_preprocess(self.preprocess)
        if self.keep_images is not None:
            keep, out = Path(self.keep_images), Path(self.out)
            if keep == out or out in keep.parents or keep in out.parents:
                raise ConfigError(f"--keep-images {keep} and --out {out} overlap: the image shards and the feature "
                                  "store need folders of their own")

    def to_json(self) -> dict:
        def plain(value):
            if isinstance(value, Path):
                return str(value)
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        out = plain(asdict(self))
        out["selection"]["boxes"] = str(self.selection.boxes)
        return out


def read_given_boxes(path: Path) -> dict[str, np.ndarray]:
    """image_id -> (N, 4) float32 x1y1x2y2 boxes in original pixels, from JSON
    (``{"id": [[x1, y1, x2, y2], ...]}`` or ``[{"image_id", "boxes"}, ...]``) or an
    Arrow/Parquet table with ``image_id`` and ``boxes`` (list of 4-lists, or flat) columns."""
    path = Path(path)
    if path.suffix in (".parquet", ".arrow", ".feather"):
        import pyarrow.feather as feather
        import pyarrow.parquet as pq

        table = pq.read_table(path) if path.suffix == ".parquet" else feather.read_table(path)
        if not {"image_id", "boxes"} <= set(table.column_names):
            raise ConfigError(f"{path}: needs image_id and boxes columns")
        pairs = zip(table.column("image_id").to_pylist(), table.column("boxes").to_pylist())
    else:
        try:
            obj = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from err
        pairs = obj.items() if isinstance(obj, dict) else ((o.get("image_id"), o.get("boxes")) for o in obj)
    out = {}
    for image_id, boxes in pairs:
        try:
            arr = np.asarray(boxes, np.float32).reshape(-1, 4)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{path}: image {image_id!r}: boxes are not a list of [x1, y1, x2, y2]") from err
        if not len(arr) or not np.isfinite(arr).all() or (arr[:, 2] < arr[:, 0]).any() or (arr[:, 3] < arr[:, 1]).any():
            raise ConfigError(f"{path}: image {image_id!r}: needs >= 1 finite box with x1 <= x2 and y1 <= y2")
        out[str(image_id)] = arr
    return out


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda asked for, but no CUDA device is available")
    return device


class DetectorActor:
    """Holds one detector (loaded once) and turns a shard's image rows into records."""

    def __init__(self, cfg_json: dict, weights: Optional[str], seed: int, selection: SelectionConfig,
                 device: str, fp16: bool, batch_size: int, given_boxes: Optional[dict] = None,
                 preprocess: str = "caffe"):
        import torch

        from pipeline.detect.model import VGDetector

        cfg = DetectorConfig.from_json(cfg_json)
        if weights is not None:
            model, _ = load_detector(Path(weights), cfg)
        else:
            torch.manual_seed(seed)
            model = VGDetector(cfg)
        self.extractor = RegionFeatureExtractor(model, selection, device=device, fp16=fp16, preprocess=preprocess)
        self.batch_size = batch_size
        self.given = given_boxes

    def pid(self) -> int:
        import os

        return os.getpid()

    def extract(self, number: int, rows: list[dict]) -> dict:
        records, failures = [], []
        ready = []
        for row in rows:
            if row["status"] != "ok":
                failures.append(_failure(row, row["error_kind"], row.get("error") or "", bool(row.get("transient"))))
                continue
            if self.given is not None and row["image_id"] not in self.given:
                failures.append(_failure(row, "no given boxes", "the --given-boxes file has no boxes for this image"))
                continue
            try:
                ready.append((row, load_rgb(row["image"])))
            except ImageError as err:
                failures.append(_failure(row, err.kind, err.detail))
            except Exception as err:  # a bug must cost one image, not its shard
                log.exception("image %s: unexpected error while decoding", row["image_id"])
                failures.append(_failure(row, "internal error", f"{type(err).__name__}: {err}"))
        for start in range(0, len(ready), self.batch_size):
            batch = ready[start : start + self.batch_size]
            try:
                records += self._run([img for _, img in batch], [row["image_id"] for row, _ in batch])
            except Exception as err:  # a model failure on one batch: try its images one by one
                if len(batch) == 1:
                    failures.append(_failure(batch[0][0], "extract error", f"{type(err).__name__}: {err}"))
                    continue
                for row, img in batch:
                    try:
                        records += self._run([img], [row["image_id"]])
                    except Exception as one:
                        failures.append(_failure(row, "extract error", f"{type(one).__name__}: {one}"))
        return {"number": number, "records": records, "failures": failures}

    def _run(self, images: list, ids: list[str]) -> list:
        given = [self.given[i] for i in ids] if self.given is not None else None
        return self.extractor(images, ids, given_boxes=given)


def _failure(row: dict, kind: str, detail: str, transient: bool = False) -> dict:
    url = row.get("url")
    return {"image_id": row["image_id"], "url": redact_url(url) if url else None, "kind": kind,
            "detail": (detail or "")[:500], "transient": transient}


def _download_rows(job: ShardJob, fetch_cfg: FetchConfig, image_cfg: ImageConfig, threads: int,
                   keep_images: Optional[str]) -> list[dict]:
    """Ray task: fetch a shard's images into rows (bytes stay in memory / the object store).
    With `keep_images`, the rows are also written there as an image shard; a retry job's
    rows replace theirs in the shard kept before (if none was, none is written: the folder
    only holds whole shards)."""
    started = time.time()
    rows = fetch_rows(list(job.items), [True] * len(job.items), fetch_cfg, image_cfg, threads)
    downloaded = sum(r.pop("_downloaded", 0) for r in rows)
    if not keep_images:
        return rows
    kept, earlier = rows, Path(keep_images) / f"{shard_name(job.number)}.parquet"
    if job.retry_failed:
        if not earlier.is_file():
            return rows
        fresh = {r["image_id"]: r for r in rows}
        kept = [fresh.get(r["image_id"], r) for r in read_shard_rows(earlier)]
    stats = shard_stats(job.number, kept, started, downloaded, policy_of(fetch_cfg, image_cfg),
                        retried=len(rows) if job.retry_failed else 0)
    write_shard(Path(keep_images), job.number, kept, stats)
    return rows


def _image_source_shards(source: Path, size: int) -> Iterator[tuple[int, list[dict]]]:
    batch, number = [], 0
    for item in iter_images(source):
        url = item.meta.get("url")
        batch.append({"image_id": item.image_id, "status": "ok", "image": item.data,
                      "url": redact_url(url) if isinstance(url, str) else None})
        if len(batch) == size:
            yield number, batch
            number, batch = number + 1, []
    if batch:
        yield number, batch


@dataclass
class ExtractProgress:
    images: int = 0
    extracted: int = 0
    shards_done: int = 0
    started: float = field(default_factory=time.time)


def retry_ids(stats: dict, policy: Policy) -> set[str]:
    """Ids of a done shard's failed images that --retry-failed re-attempts under `policy`."""
    return {f["image_id"] for f in stats["failed_images"]
            if should_retry(f["kind"], bool(f.get("transient")), stats.get("policy"), policy)}


def done_extract_shards(out: Path) -> dict[int, dict]:
    folder = out / EXTRACT_DIR
    done = {}
    for path in sorted(folder.glob("[0-9]*_stats.json")) if folder.is_dir() else []:
        number = path.name.split("_")[0]
        if number.isdigit() and path.is_file():
            done[int(number)] = read_json(path, "extract stats (the shard's done-marker)")
    return done


def check_resumed_preprocess(cfg: ExtractConfig) -> None:
    """A store holds features of one resize convention: resuming one with another
    --preprocess is a configuration error (stores written before the option: caffe)."""
    from pipeline.store import Manifest
    from pipeline.store.manifest import MANIFEST_FILE

    if not (cfg.out / MANIFEST_FILE).is_file():
        return
    had = Manifest.read(cfg.out).provenance.get("preprocess", "caffe")
    if had != cfg.preprocess:
        raise ConfigError(f"cannot append to {cfg.out}: its features were extracted with --preprocess {had}, "
                          f"not {cfg.preprocess}; rerun with --preprocess {had} or choose another --out")


def run_extract(cfg: ExtractConfig, on_progress: Optional[Callable[[ExtractProgress], None]] = None) -> dict:
    """Run the extraction; returns the summary (also in `<out>/extract_summary.json`) with
    its verdict. The store's writer holds its lock; a --keep-images folder is locked too."""
    with contextlib.ExitStack() as locks:
        if cfg.keep_images:
            locks.enter_context(exclusive_lock(cfg.keep_images, "image-shard folder"))
        return _run_extract(cfg, on_progress)


def _run_extract(cfg: ExtractConfig, on_progress: Optional[Callable[[ExtractProgress], None]]) -> dict:
    import ray

    from pipeline.download.run import shard_jobs
    from pipeline.store import FeatureStoreWriter

    device = resolve_device(cfg.device)
    det_cfg = DetectorConfig.load(cfg.detector)
    check_resumed_preprocess(cfg)
    provenance = {"producer": f"vlprep {__version__} extract", "detector": det_cfg.name, "preprocess": cfg.preprocess,
                  "box_policy": cfg.selection.describe(), "device": device, "fp16": cfg.fp16}
    if cfg.weights is not None:  # validate the weights before any work starts
        model, report = load_detector(cfg.weights, det_cfg)
        det_cfg = model.cfg
        del model
        provenance.update(weights_sha256=report.sha256, weights_layout=report.layout, weights_file=Path(cfg.weights).name)
    else:
        provenance.update(weights_sha256=f"random-seed-{cfg.seed}", random_weights=True)
        log.warning("--random-weights: features come from an untrained detector (smoke runs only)")
    given = None
    if cfg.given_boxes is not None:
        given = read_given_boxes(cfg.given_boxes)
        provenance["box_policy"] = f"given boxes from {Path(cfg.given_boxes).name} (sha256 {sha256_file(Path(cfg.given_boxes))[:16]})"
    writer = FeatureStoreWriter(
        cfg.out, backend=cfg.backend, shard_size=10**12, resume=True, feature_dim=det_cfg.res5_channels,
        dtype=cfg.dtype, cls_prob=cfg.cls_prob, attr_prob=cfg.attr_prob if det_cfg.num_attributes else "none",
        provenance=provenance, config=cfg.to_json(),
    )
    writer.open()  # takes the store's write lock: from here on, temporary files left behind are a killed run's
    (cfg.out / EXTRACT_DIR).mkdir(exist_ok=True)
    for folder in (cfg.out / EXTRACT_DIR, cfg.keep_images):
        for stale in remove_stale_tmp(folder) if folder else ():
            log.info("removed %s left by a killed run", stale)
    done = done_extract_shards(cfg.out)
    policy = policy_of(cfg.fetch, cfg.image)
    progress = ExtractProgress()
    failed_shards: dict[str, str] = {}
    counts: Counter = Counter()
    malformed: list[str] = []

    started_ray = not ray.is_initialized()
    if started_ray:
        init = {"address": cfg.ray_address} if cfg.ray_address else {"num_cpus": cfg.workers}
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, **init)
    try:
        gpu = device.startswith("cuda")
        n_actors = cfg.actors or (max(1, int(ray.cluster_resources().get("GPU", 0))) if gpu else 1)
        actor_cls = ray.remote(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1, max_restarts=2,
                               max_task_retries=2)(DetectorActor)
        given_ref = ray.put(given) if given is not None else None
        actors = [actor_cls.remote(det_cfg.to_json(), str(cfg.weights) if cfg.weights else None, cfg.seed,
                                   cfg.selection, device, cfg.fp16, cfg.batch_size, given_ref, cfg.preprocess)
                  for _ in range(n_actors)]
        download = ray.remote(num_cpus=1, max_retries=3)(_download_rows)
        in_flight: dict = {}  # ref -> (number, attempt, rows or ShardJob, stats of the shard being retried)
        turn = [0]

        def submit(number: int, work, attempt: int, retrying: Optional[dict]) -> None:
            rows = (download.remote(work, cfg.fetch, cfg.image, cfg.threads, str(cfg.keep_images) if cfg.keep_images else None)
                    if isinstance(work, ShardJob) else work)
            actor = actors[turn[0] % len(actors)]
            turn[0] += 1
            in_flight[actor.extract.remote(number, rows)] = (number, attempt, work, retrying)

        def collect(timeout: float) -> None:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=timeout)
            for ref in ready:
                number, attempt, work, retrying = in_flight.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as err:  # retried, then reported (a full disk stops the run)
                    reason = shard_failure(err)
                    if attempt < cfg.shard_retries:
                        log.warning("shard %05d failed (%s); retrying", number, reason)
                        submit(number, work, attempt + 1, retrying)
                    else:
                        failed_shards[shard_name(number)] = reason
                        log.error("shard %05d failed %d times: %s", number, attempt + 1, reason)
                    continue
                _commit(cfg, writer, result, progress, policy, retrying)
            if on_progress:
                on_progress(progress)

        if cfg.images is not None:
            source = _image_source_shards(Path(cfg.images), cfg.shard_size)
        else:
            source = ((job.number, job) for job in shard_jobs(_as_download_cfg(cfg), malformed, counts))
        for number, work in source:
            retrying = done.get(number)
            if retrying is not None:
                ids = retry_ids(retrying, policy) if cfg.retry_failed else set()
                if not ids:
                    progress.shards_done += 1
                    continue
                work = (ShardJob(number, tuple(i for i in work.items if i.image_id in ids), retry_failed=True)
                        if isinstance(work, ShardJob) else [r for r in work if r["image_id"] in ids])
            while len(in_flight) >= 2 * len(actors) + 1:
                collect(timeout=0.2)
            submit(number, work, 0, retrying)
        while in_flight:
            collect(timeout=0.2)
    except BaseException:
        writer.abort()  # keeps the committed shards; the error that stopped us is the one shown
        raise
    else:
        writer.close()
    finally:
        if started_ray:
            ray.shutdown()
    summary = _summarize(cfg, failed_shards, malformed, counts)
    atomic_write_json(cfg.out / SUMMARY_FILE, summary)
    return summary


def _as_download_cfg(cfg: ExtractConfig):
    from pipeline.download.run import DownloadConfig

    return DownloadConfig(dataset=cfg.dataset, inputs=cfg.inputs, out=cfg.out, shard_size=cfg.shard_size,
                          reader=cfg.reader, fetch=cfg.fetch, image=cfg.image)


def _commit(cfg: ExtractConfig, writer, result: dict, progress: ExtractProgress, policy: Policy,
            retrying: Optional[dict] = None) -> None:
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
            failed_images.append({"image_id": rec.image_id, "url": None, "kind": "invalid record",
                                  "detail": f"{err.field}: {err.reason}", "transient": False})
    writer.commit_shard()
    attempted = len(result["records"]) + len(result["failures"])
    stats = {"shard": shard_name(result["number"]), "count": attempted, "extracted": written,
             "already_present": present, "retried": 0}
    if retrying is not None:
        redone = {rec.image_id for rec in result["records"]} | {f["image_id"] for f in result["failures"]}
        failed_images = [f for f in retrying["failed_images"] if f["image_id"] not in redone] + failed_images
        stats.update(count=retrying["count"], extracted=retrying["extracted"] + written,
                     already_present=retrying["already_present"] + present,
                     retried=retrying.get("retried", 0) + attempted)
    failures = Counter(f["kind"] for f in failed_images)
    stats.update(failures=dict(failures.most_common()), failed_images=failed_images, policy=policy,
                 finished=time.time())
    atomic_write_json(cfg.out / EXTRACT_DIR / f"{shard_name(result['number'])}_stats.json", stats)
    progress.images += attempted
    progress.extracted += written
    progress.shards_done += 1


def _summarize(cfg: ExtractConfig, failed_shards: dict, malformed: list[str], counts: Counter) -> dict:
    shards = done_extract_shards(cfg.out)
    failures: Counter = Counter()
    for stats in shards.values():
        failures.update(stats["failures"])
    images = sum(s["count"] for s in shards.values())
    extracted = sum(s["extracted"] + s["already_present"] for s in shards.values())
    return {
        "store": str(cfg.out),
        "shards_done": len(shards),
        "shards_failed": failed_shards,
        "images": images,
        "extracted": extracted,
        "failures": dict(failures.most_common()),
        "malformed_rows": counts["malformed"],
        "malformed_examples": malformed,
        **verdict(images, extracted, failures, failed_shards, cfg.max_failure_rate, counts["malformed"]),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
