"""`vlprep download`: dataset items -> deterministic shards -> Ray tasks -> image shards.

The driver holds the folder's write lock for the whole run (a second writer gets
`BusyError` at once), streams the reader, cuts items into shards of `shard_size` in
input order (shard k = items k*N .. k*N+N-1, so reruns see the same shards), skips shards
already complete (their stats file exists) unless ``--retry-failed`` finds failures to
re-attempt in them (`failures.should_retry`), and runs one Ray task per remaining shard
with a bounded number in flight. A task that raises is retried `shard_retries` times, then
reported; a worker that dies is replaced by Ray and its task rerun. `summary.json` totals
every shard in the folder, this run's and earlier ones', and judges it
(`failures.verdict`: too many failed items, or failed shards, fail the run).

Paths are made absolute in the config: with ``--ray-address`` the tasks run on other
nodes, which must see the same paths (shared storage).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

from pipeline import __version__
from pipeline.datasets import READERS, Malformed, ReaderOptions, read_items
from pipeline.download.failures import Policy, policy_of, shard_failure, should_retry, verdict
from pipeline.download.fetch import FetchConfig
from pipeline.download.images import ImageConfig
from pipeline.download.shard import ShardJob, download_shard
from pipeline.errors import ConfigError
from pipeline.image_shards import done_shards
from pipeline.io import atomic_write_json, exclusive_lock, read_json, remove_stale_tmp

log = logging.getLogger(__name__)
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
MAX_LISTED_MALFORMED = 100


@dataclass(frozen=True)
class DownloadConfig:
    dataset: str
    inputs: tuple[Path, ...]
    out: Path
    shard_size: int = 1000
    workers: int = 2  # Ray CPUs when starting a local cluster
    threads: int = 32  # per task
    ray_address: Optional[str] = None
    shard_retries: int = 2
    retry_failed: bool = False
    max_failure_rate: float = 0.5  # exit 1 above this failed fraction of the folder's items
    reader: ReaderOptions = ReaderOptions()
    fetch: FetchConfig = FetchConfig()
    image: ImageConfig = ImageConfig()

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", absolute(self.out))
        object.__setattr__(self, "inputs", tuple(absolute(p) for p in self.inputs))
        if self.dataset not in READERS:
            raise ConfigError(f"unknown dataset {self.dataset!r}; known: {', '.join(READERS)}")
        if not self.inputs:
            raise ConfigError("give at least one --input")
        missing = [str(p) for p in self.inputs if not Path(p).exists()]
        if missing:
            raise ConfigError(f"input not found: {', '.join(missing)}")
        for name in ("shard_size", "workers", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1")
        if self.fetch.max_bytes < 1 or self.fetch.deadline <= 0:
            raise ConfigError("max_bytes and deadline must be positive")
        check_failure_rate(self.max_failure_rate)

    def fingerprint(self) -> dict:
        """What fixes the shard contents: a rerun must match it to resume the folder."""
        return {
            "dataset": self.dataset,
            "inputs": [{"path": str(Path(p).resolve()), "bytes": _input_bytes(Path(p))} for p in self.inputs],
            "shard_size": self.shard_size,
            "reader": {k: str(v) for k, v in asdict(self.reader).items()},
        }

    def to_json(self) -> dict:
        out = asdict(self)
        out["inputs"] = [str(p) for p in self.inputs]
        out["out"] = str(self.out)
        out["reader"] = {k: str(v) for k, v in asdict(self.reader).items()}
        return out


def absolute(path: os.PathLike) -> Path:
    """`path` made absolute against the current directory (without resolving symlinks)."""
    return Path(os.path.abspath(path))


def check_failure_rate(rate: float) -> None:
    if not 0 <= rate <= 1:
        raise ConfigError(f"--max-failure-rate must be between 0 and 1, got {rate:g}")


def _input_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


@dataclass
class Progress:
    """Live counters; the driver's progress bar reads them."""

    total_items: Optional[int] = None
    items: int = 0
    ok: int = 0
    bytes: int = 0
    skipped_items: int = 0  # in shards complete before this run
    started: float = field(default_factory=time.time)


def shard_jobs(cfg: DownloadConfig, malformed: list[str], counts: Counter) -> Iterator[ShardJob]:
    """The deterministic shards of a dataset's items (malformed rows counted and listed)."""
    batch = []
    number = 0
    for result in read_items(cfg.dataset, cfg.inputs, cfg.reader):
        if isinstance(result, Malformed):
            counts["malformed"] += 1
            if len(malformed) < MAX_LISTED_MALFORMED:
                malformed.append(str(result))
            log.warning("malformed input row %s", result)
            continue
        batch.append(result)
        if len(batch) == cfg.shard_size:
            yield ShardJob(number, tuple(batch))
            number, batch = number + 1, []
    if batch:
        yield ShardJob(number, tuple(batch))


def _prepare_out(cfg: DownloadConfig) -> None:
    """Check (or write) run.json and remove what killed runs left; under the folder's lock."""
    run_file = cfg.out / RUN_FILE
    fingerprint = cfg.fingerprint()
    if run_file.exists():
        previous = read_json(run_file, "run record").get("fingerprint")
        if previous != fingerprint:
            raise ConfigError(
                f"{cfg.out} holds shards made from other inputs or settings ({RUN_FILE} differs); "
                "use a new --out, or rerun with the same dataset, inputs and --shard-size"
            )
    else:
        atomic_write_json(run_file, {"producer": f"vlprep {__version__} download", "fingerprint": fingerprint,
                                     "config": cfg.to_json()})
    for stale in remove_stale_tmp(cfg.out):
        log.info("removed %s left by a killed run", stale.name)


class _RayProgress:
    """A Ray actor the shard tasks report item progress to (batched, every ~0.5 s)."""

    def __init__(self):
        self.items = self.ok = self.bytes = 0

    def add(self, items: int, ok: int, nbytes: int) -> None:
        self.items += items
        self.ok += ok
        self.bytes += nbytes

    def get(self) -> tuple[int, int, int]:
        return self.items, self.ok, self.bytes


def _shard_task(job: ShardJob, out: str, fetch_cfg: FetchConfig, image_cfg: ImageConfig, threads: int, reporter):
    """Ray task body: never raises for sample errors; shard errors propagate to be retried."""
    import threading

    pending = [0, 0, 0, time.monotonic()]
    lock = threading.Lock()

    def progress(items: int, ok: int, nbytes: int) -> None:
        with lock:
            pending[0] += items
            pending[1] += ok
            pending[2] += nbytes
            if time.monotonic() - pending[3] < 0.5:
                return
            batch, pending[:] = pending[:3], [0, 0, 0, time.monotonic()]
        reporter.add.remote(*batch)

    stats = download_shard(job, Path(out), fetch_cfg, image_cfg, threads, progress)
    with lock:
        reporter.add.remote(*pending[:3])
    return stats


def needs_retry(stats: dict, policy: Policy) -> bool:
    """Whether a complete shard has failures --retry-failed re-attempts under `policy`."""
    return bool(stats.get("transient_failures")) or any(
        should_retry(kind, False, stats.get("policy"), policy) for kind in stats.get("failures", {}))


def run_download(cfg: DownloadConfig, on_progress: Optional[Callable[[Progress], None]] = None) -> dict:
    """Run the download; returns the summary (also written to `<out>/summary.json`) with
    its verdict. Raises `BusyError` at once if another process is writing `cfg.out`."""
    with exclusive_lock(cfg.out, "image-shard folder"):
        return _run_download(cfg, on_progress)


def _run_download(cfg: DownloadConfig, on_progress: Optional[Callable[[Progress], None]]) -> dict:
    import ray

    _prepare_out(cfg)
    done = done_shards(cfg.out)
    policy = policy_of(cfg.fetch, cfg.image)
    malformed: list[str] = []
    counts: Counter = Counter()
    progress = Progress()
    failed_shards: dict[str, str] = {}
    run_started = time.time()

    def count_items() -> None:  # for the progress bar's total and ETA, beside the real work
        try:
            total = sum(1 for r in read_items(cfg.dataset, cfg.inputs, cfg.reader) if not isinstance(r, Malformed))
        except Exception as err:  # the main pass reads the same input and reports this error itself
            log.debug("counting the items for the progress bar failed: %s", err)
            return
        progress.total_items = total

    threading.Thread(target=count_items, daemon=True).start()

    init_kwargs = {"address": cfg.ray_address} if cfg.ray_address else {"num_cpus": cfg.workers}
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, **init_kwargs)
    log.debug("ray ready after %.2f s", time.time() - run_started)
    try:
        task = ray.remote(num_cpus=1, max_retries=3)(_shard_task)
        reporter = ray.remote(num_cpus=0)(_RayProgress).remote()
        in_flight: dict = {}  # ObjectRef -> (job, attempt)
        limit = 2 * max(1, int(ray.available_resources().get("CPU", cfg.workers)))

        def submit(job: ShardJob, attempt: int) -> None:
            ref = task.remote(job, str(cfg.out), cfg.fetch, cfg.image, cfg.threads, reporter)
            in_flight[ref] = (job, attempt)

        def collect(timeout: float) -> None:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=timeout)
            for ref in ready:
                job, attempt = in_flight.pop(ref)
                try:
                    stats = ray.get(ref)
                    log.debug("shard %s done at %.2f s (%.2f s in the task)", stats["shard"], time.time() - run_started,
                              stats["duration_s"])
                except Exception as err:  # a shard error: retried, then reported (a full disk stops the run)
                    reason = shard_failure(err)
                    if attempt < cfg.shard_retries:
                        log.warning("shard %05d failed (%s); retrying", job.number, reason)
                        submit(job, attempt + 1)
                    else:
                        failed_shards[f"{job.number:05d}"] = reason
                        log.error("shard %05d failed %d times: %s", job.number, attempt + 1, reason)
            items, ok, nbytes = ray.get(reporter.get.remote())
            progress.items, progress.ok, progress.bytes = items, ok, nbytes
            if on_progress:
                on_progress(progress)

        for job in shard_jobs(cfg, malformed, counts):
            counts["items"] += len(job.items)
            previous = done.get(job.number)
            if previous is not None:
                if not (cfg.retry_failed and needs_retry(previous, policy)):
                    progress.skipped_items += previous["count"]
                    continue
                job = ShardJob(job.number, (), retry_failed=True, previous_policy=previous.get("policy"))
            while len(in_flight) >= limit:
                collect(timeout=0.2)
            submit(job, 0)
        while in_flight:
            collect(timeout=0.2)
    finally:
        if started_ray:
            log.debug("all shards done at %.2f s", time.time() - run_started)
            ray.shutdown()
            log.debug("ray stopped at %.2f s", time.time() - run_started)
    summary = _summarize(cfg, counts, malformed, failed_shards, time.time() - run_started)
    atomic_write_json(cfg.out / SUMMARY_FILE, summary)
    return summary


def _summarize(cfg: DownloadConfig, counts: Counter, malformed: list[str], failed_shards: dict, seconds: float) -> dict:
    shards = done_shards(cfg.out)
    failures: Counter = Counter()
    for stats in shards.values():
        failures.update(stats["failures"])
    total = sum(s["count"] for s in shards.values())
    successes = sum(s["successes"] for s in shards.values())
    judged = verdict(total, successes, failures, failed_shards, cfg.max_failure_rate, counts["malformed"])
    return {
        "dataset": cfg.dataset,
        "out": str(cfg.out),
        "input_items": counts["items"],
        "malformed_rows": counts["malformed"],
        "malformed_examples": malformed,
        "shards_complete": len(shards),
        "shards_failed": failed_shards,
        "items_in_shards": total,
        "successes": successes,
        "success_rate": round(successes / total, 4) if total else None,
        "failures": dict(failures.most_common()),
        "transient_failures": sum(s.get("transient_failures", 0) for s in shards.values()),
        "bytes_downloaded": sum(s["bytes_downloaded"] for s in shards.values()),
        "bytes_stored": sum(s["bytes_stored"] for s in shards.values()),
        **judged,
        "this_run_seconds": round(seconds, 2),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
