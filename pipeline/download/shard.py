"""Download shards: a dataset's items cut into deterministic `ShardJob`s (`shard_jobs`),
and what one shard task does with them — fetch and process its items with a thread pool
(`fetch_rows`), then write the image shard (`download_shard`, the task of `vlprep
download`) or hand the rows on to the detector (`download_rows`, the download task of
`vlprep extract`, which can keep them as an image shard too).

The tasks take plain data and return plain data. Sample errors are data: a failed item
becomes a row with status "failed", a named reason and whether it is transient —
whatever goes wrong with one item (an unexpected exception included, as "internal
error") never takes its shard down. Items of one shard that share a URL are fetched
once. Rows never hold URL credentials.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from pipeline.datasets import Malformed, ReaderOptions, read_items
from pipeline.distribute import MalformedRows, chunks, shard_name, this_node
from pipeline.download.fetch import FetchConfig, Fetched, FetchError, HostLimiter, fetch, read_local, redact_url
from pipeline.download.source_item import SourceItem
from pipeline.failures import Policy, should_retry
from pipeline.image_shards import item_row, read_shard_rows, row_item, write_shard
from pipeline.images import ImageConfig, ImageError, process_image

log = logging.getLogger(__name__)

# (items done, items ok, bytes downloaded) since the last call
ProgressFn = Callable[[int, int, int], None]


@dataclass(frozen=True)
class ShardJob:
    number: int
    items: tuple[SourceItem, ...]
    retry_failed: bool = False  # reprocess the retryable failures of the existing shard (failures.should_retry)
    previous_policy: Optional[Policy] = None  # the options the existing shard was made under, from its stats


def policy_of(fetch: FetchConfig, image: ImageConfig) -> Policy:
    """The options a policy refusal depends on, as recorded in shard stats."""
    return {
        "allow_private_network": fetch.allow_private_network,
        "allowed_networks": sorted(fetch.allowed_networks),
        "max_bytes": fetch.max_bytes,
        "max_redirects": fetch.max_redirects,
        "max_pixels": image.max_pixels,
        "min_side": image.min_side,
        "max_aspect_ratio": image.max_aspect_ratio,
    }


def shard_jobs(
    dataset: str, inputs: Sequence[Path], reader: ReaderOptions, shard_size: int, malformed: MalformedRows
) -> Iterator[ShardJob]:
    """The deterministic shards of a dataset's items (`distribute.chunks`); malformed
    input rows are counted in `malformed`, not shard items."""

    def items() -> Iterator[SourceItem]:
        for result in read_items(dataset, inputs, reader):
            if isinstance(result, Malformed):
                malformed.add(result)
            else:
                yield result

    for number, batch in chunks(items(), shard_size):
        yield ShardJob(number, tuple(batch))


def _failure(kind: str, detail: str, transient: bool, attempts: Optional[int] = None) -> dict:
    return {"status": "failed", "error_kind": kind, "error": detail[:500], "transient": transient, "attempts": attempts}


def process_item(item: SourceItem, fetched: "Future[Fetched] | Fetched", image_cfg: ImageConfig) -> dict:
    """The row for one item, given its fetch (done or failed). Never raises: an unexpected
    exception becomes the item's "internal error" failure, and is logged."""
    row = {**item_row(item), "url": redact_url(item.url) if item.url is not None else None}
    try:
        return {**row, **_outcome(item, fetched, image_cfg)}
    except Exception as err:  # a bug must cost one item, not its shard
        log.exception("item %s (%s): unexpected error", item.image_id, row["url"] or item.path)
        return {**row, **_failure("internal error", f"{type(err).__name__}: {err}", False)}


def _outcome(item: SourceItem, fetched: "Future[Fetched] | Fetched", image_cfg: ImageConfig) -> dict:
    try:
        got = fetched.result() if isinstance(fetched, Future) else fetched
    except FetchError as err:
        return _failure(err.kind, err.detail, err.transient)
    try:
        img = process_image(got.data, image_cfg)
    except ImageError as err:
        return _failure(err.kind, err.detail, False, got.attempts)
    return {
        "status": "ok",
        "transient": False,
        "image": img.data,
        "format": img.format,
        "width": img.width,
        "height": img.height,
        "original_width": img.original_width,
        "original_height": img.original_height,
        "sha256": img.sha256,
        "attempts": got.attempts,
        "http_status": got.status or None,
        "final_url": got.final_url if item.url else None,
        "_downloaded": len(got.data),
    }


def fetch_rows(
    items: list[SourceItem],
    redo: list[bool],
    fetch_cfg: FetchConfig,
    image_cfg: ImageConfig,
    progress: Optional[ProgressFn] = None,
) -> list[Optional[dict]]:
    """Rows for the items marked in `redo` (None for the others), in item order, fetched
    by `fetch_cfg.threads` threads."""
    threads = fetch_cfg.threads
    limiter = HostLimiter(fetch_cfg.per_host)

    def fetch_one(item: SourceItem) -> Fetched:
        return (
            read_local(item.path, fetch_cfg.max_bytes) if item.path is not None else fetch(item.url, fetch_cfg, limiter)
        )

    # Items sharing a location are fetched once.
    by_location: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        if redo[i]:
            by_location.setdefault(item.location, []).append(i)
    todo = iter(by_location.items())
    rows: list[Optional[dict]] = [None] * len(items)
    # Threads only fetch; this thread decodes/resizes/encodes in completion order (one CPU
    # stream per task, no GIL convoy), with at most 2 x threads fetched images waiting.
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: dict[Future, list[int]] = {}

        def fill() -> None:
            while len(pending) < 2 * threads:
                nxt = next(todo, None)
                if nxt is None:
                    return
                pending[pool.submit(fetch_one, items[nxt[1][0]])] = nxt[1]

        fill()
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                for i in pending.pop(future):
                    rows[i] = process_item(items[i], future, image_cfg)
                    if progress:
                        progress(1, int(rows[i]["status"] == "ok"), rows[i].get("_downloaded", 0))
            fill()
    return rows


def download_shard(
    job: ShardJob,
    out: Path,
    fetch_cfg: FetchConfig,
    image_cfg: ImageConfig,
    progress: Optional[ProgressFn] = None,
) -> dict:
    """Download, process and write one shard; returns its stats (also in NNNNN_stats.json).
    A retry job rewrites the existing shard, re-attempting only its retryable failures."""
    started = time.time()
    policy = policy_of(fetch_cfg, image_cfg)
    previous = read_shard_rows(out / f"{shard_name(job.number)}.parquet") if job.retry_failed else None
    items = [row_item(r) for r in previous] if previous is not None else list(job.items)
    redo = [
        previous is None
        or (
            r["status"] == "failed" and should_retry(r["error_kind"], bool(r["transient"]), job.previous_policy, policy)
        )
        for r in (previous or items)
    ]
    rows = fetch_rows(items, redo, fetch_cfg, image_cfg, progress)
    for i, row in enumerate(rows):
        if row is None:  # kept from the previous run of this shard
            rows[i] = previous[i]
    downloaded = sum(r.pop("_downloaded", 0) for r in rows)
    stats = shard_stats(job.number, rows, started, downloaded, policy, retried=sum(redo) if previous is not None else 0)
    write_shard(out, job.number, rows, stats)
    return stats


def download_rows(
    job: ShardJob, fetch_cfg: FetchConfig, image_cfg: ImageConfig, keep_images: Optional[str]
) -> list[dict]:
    """Fetch a shard's images into rows (the bytes stay in memory / the object store).
    With `keep_images`, the rows are also written there as an image shard; a retry job's
    rows replace theirs in the shard kept before (if none was, none is written: the folder
    only holds whole shards)."""
    started = time.time()
    rows = fetch_rows(list(job.items), [True] * len(job.items), fetch_cfg, image_cfg)
    downloaded = sum(r.pop("_downloaded", 0) for r in rows)
    if not keep_images:
        return rows
    kept, earlier = rows, Path(keep_images) / f"{shard_name(job.number)}.parquet"
    if job.retry_failed:
        if not earlier.is_file():
            return rows
        fresh = {r["image_id"]: r for r in rows}
        kept = [fresh.get(r["image_id"], r) for r in read_shard_rows(earlier)]
    stats = shard_stats(
        job.number,
        kept,
        started,
        downloaded,
        policy_of(fetch_cfg, image_cfg),
        retried=len(rows) if job.retry_failed else 0,
    )
    write_shard(Path(keep_images), job.number, kept, stats)
    return rows


def shard_stats(
    number: int, rows: list[dict], started: float, downloaded: int, policy: Policy, retried: int = 0
) -> dict:
    """A shard's stats; `policy` records the options its failures happened under (for
    --retry-failed: a failure kept from an earlier run still holds under them), ``node_id``
    and ``hostname`` where it was made (`distribute.this_node`)."""
    failures = Counter(r["error_kind"] for r in rows if r["status"] != "ok")
    return {
        "shard": shard_name(number),
        "count": len(rows),
        "successes": len(rows) - sum(failures.values()),
        "failures": dict(failures.most_common()),
        "transient_failures": sum(1 for r in rows if r["status"] != "ok" and r["transient"]),
        "policy": policy,
        "retried": retried,
        "bytes_downloaded": downloaded,
        "bytes_stored": sum(len(r["image"]) for r in rows if r.get("image")),
        "duration_s": round(time.time() - started, 3),
        "started": started,
        "finished": time.time(),
        **this_node(),
    }
