"""`vlprep download`: a dataset's items -> deterministic shards -> Ray tasks -> image shards.

The stage logic of a download; the distributor (`pipeline.distribute`) runs the shards.
The driver holds the folder's write lock for the whole run (a second writer gets
`BusyError` at once), checks the folder was made from the same inputs (``run.json``),
cuts the items into shards (`shard.shard_jobs`), skips shards already complete (their
stats file exists) unless ``--retry-failed`` finds failures to re-attempt in them
(`pipeline.failures.should_retry`), and runs one Ray task per remaining shard (`shard.download_shard`,
which writes the shard and its stats, recording the node that did it), on the nodes that
offer ``--download-resource`` when it is given. The tasks report item progress to a small Ray
actor the driver's progress bar reads. `summary.json` totals every shard in the folder,
this run's and earlier ones', and judges it (`failures.verdict`: too many failed items,
or failed shards, fail the run).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from pipeline import __version__
from pipeline.config import Config, one_of
from pipeline.datasets import READERS, Malformed, ReaderOptions, check_inputs, read_items
from pipeline.distribute import (
    DistributeConfig,
    MalformedRows,
    Progress,
    absolute,
    capacity,
    ray_session,
    run_shards,
    summary,
    task_resources,
)
from pipeline.download.fetch import FetchConfig
from pipeline.download.shard import ShardJob, download_shard, policy_of, shard_jobs
from pipeline.errors import ConfigError
from pipeline.failures import Policy, should_retry
from pipeline.image_shards import done_shards
from pipeline.images import ImageConfig
from pipeline.io import atomic_write_json, exclusive_lock, read_json, remove_stale_tmp

log = logging.getLogger(__name__)
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class DownloadConfig(Config):
    dataset: str
    inputs: tuple[Path, ...]
    out: Path
    distribute: DistributeConfig = DistributeConfig()
    reader: ReaderOptions = ReaderOptions()
    fetch: FetchConfig = FetchConfig()
    image: ImageConfig = ImageConfig()

    def __post_init__(self) -> None:
        object.__setattr__(self, "out", absolute(self.out))
        object.__setattr__(self, "inputs", tuple(absolute(p) for p in self.inputs))
        one_of("dataset", self.dataset, READERS)
        check_inputs(self.inputs)

    def fingerprint(self) -> dict:
        """What fixes the shard contents: a rerun must match it to resume the folder."""
        return {
            "dataset": self.dataset,
            "inputs": [{"path": str(Path(p).resolve()), "bytes": _input_bytes(Path(p))} for p in self.inputs],
            "shard_size": self.distribute.shard_size,
            "reader": {k: str(v) for k, v in asdict(self.reader).items()},
        }


def _input_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


@dataclass
class DownloadProgress(Progress):
    """Item counters on top of the shard counters."""

    total_items: Optional[int] = None  # counted beside the real work, for the bar's total and ETA
    items: int = 0
    ok: int = 0
    bytes: int = 0
    skipped_items: int = 0  # in shards complete before this run


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
        atomic_write_json(
            run_file,
            {"producer": f"vlprep {__version__} download", "fingerprint": fingerprint, "config": cfg.to_json()},
        )
    for stale in remove_stale_tmp(cfg.out):
        log.info("removed %s left by a killed run", stale.name)


class _RayProgress:
    """A Ray actor the shard tasks report item progress to (batched, every ~0.5 s), on the
    driver's node (a lost worker node must not take it along)."""

    def __init__(self):
        self.items = self.ok = self.bytes = 0

    def add(self, items: int, ok: int, nbytes: int) -> None:
        self.items += items
        self.ok += ok
        self.bytes += nbytes

    def get(self) -> tuple[int, int, int]:
        return self.items, self.ok, self.bytes


def _shard_task(job: ShardJob, out: str, fetch_cfg: FetchConfig, image_cfg: ImageConfig, reporter) -> dict:
    """Ray task body: never raises for sample errors; shard errors propagate to be retried."""
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

    stats = download_shard(job, Path(out), fetch_cfg, image_cfg, progress)
    with lock:
        reporter.add.remote(*pending[:3])
    return stats


def needs_retry(stats: dict, policy: Policy) -> bool:
    """Whether a complete shard has failures --retry-failed re-attempts under `policy`."""
    return bool(stats.get("transient_failures")) or any(
        should_retry(kind, False, stats.get("policy"), policy) for kind in stats.get("failures", {})
    )


def run_download(cfg: DownloadConfig, on_progress: Optional[Callable[[DownloadProgress], None]] = None) -> dict:
    """Run the download; returns the summary (also written to `<out>/summary.json`) with
    its verdict. Raises `BusyError` at once if another process is writing `cfg.out`."""
    with exclusive_lock(cfg.out, "image-shard folder"):
        return _run_download(cfg, on_progress)


def _run_download(cfg: DownloadConfig, on_progress: Optional[Callable[[DownloadProgress], None]]) -> dict:
    import ray  # here, not at the top: configs and the CLI load without Ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _prepare_out(cfg)
    done = done_shards(cfg.out)
    policy = policy_of(cfg.fetch, cfg.image)
    malformed = MalformedRows()
    progress = DownloadProgress()
    input_items = 0
    threading.Thread(target=_count_items, args=(cfg, progress), daemon=True).start()

    def jobs() -> Iterator[ShardJob]:
        nonlocal input_items
        for job in shard_jobs(cfg.dataset, cfg.inputs, cfg.reader, cfg.distribute.shard_size, malformed):
            input_items += len(job.items)
            previous = done.get(job.number)
            if previous is not None:
                if not (cfg.distribute.retry_failed and needs_retry(previous, policy)):
                    progress.skipped_items += previous["count"]
                    continue
                job = ShardJob(job.number, (), retry_failed=True, previous_policy=previous.get("policy"))
            yield job

    with ray_session(cfg.distribute):
        resources = task_resources(cfg.distribute)
        task = ray.remote(**resources, max_retries=3)(_shard_task)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)  # the driver's
        reporter = ray.remote(num_cpus=0, scheduling_strategy=here)(_RayProgress).remote()

        def report() -> None:
            progress.items, progress.ok, progress.bytes = ray.get(reporter.get.remote())
            if on_progress:
                on_progress(progress)

        failed_shards = run_shards(
            jobs(),
            submit=lambda job: task.remote(job, str(cfg.out), cfg.fetch, cfg.image, reporter),
            commit=lambda job, stats: log.debug(
                "shard %s done (%.2f s in the task)", stats["shard"], stats["duration_s"]
            ),
            retries=cfg.distribute.shard_retries,
            progress=progress,
            on_progress=report,
            max_in_flight=2 * max(1, int(ray.available_resources().get("CPU", cfg.distribute.workers))),
            capacity=capacity(cfg.distribute, resources),
        )
    result = _summarize(cfg, input_items, malformed, failed_shards, time.time() - progress.started)
    atomic_write_json(cfg.out / SUMMARY_FILE, result)
    return result


def _count_items(cfg: DownloadConfig, progress: DownloadProgress) -> None:
    """The number of items, for the progress bar's total and ETA (beside the real work)."""
    try:
        total = sum(1 for r in read_items(cfg.dataset, cfg.inputs, cfg.reader) if not isinstance(r, Malformed))
    except Exception as err:  # the main pass reads the same input and reports this error itself
        log.debug("counting the items for the progress bar failed: %s", err)
        return
    progress.total_items = total


def _summarize(
    cfg: DownloadConfig, input_items: int, malformed: MalformedRows, failed_shards: dict, seconds: float
) -> dict:
    shards = done_shards(cfg.out)
    total = sum(s["count"] for s in shards.values())
    successes = sum(s["successes"] for s in shards.values())
    return {
        "dataset": cfg.dataset,
        "out": str(cfg.out),
        "input_items": input_items,
        "shards_complete": len(shards),
        "items_in_shards": total,
        "successes": successes,
        "success_rate": round(successes / total, 4) if total else None,
        "transient_failures": sum(s.get("transient_failures", 0) for s in shards.values()),
        "bytes_downloaded": sum(s["bytes_downloaded"] for s in shards.values()),
        "bytes_stored": sum(s["bytes_stored"] for s in shards.values()),
        "this_run_seconds": round(seconds, 2),
        **summary(shards, failed_shards, malformed, total, successes, cfg.distribute.max_failure_rate),
    }
