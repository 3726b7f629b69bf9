"""The one distributor: a stage's shards run on Ray, for `vlprep download` and `extract` alike.

The shard is the unit of work, retry and resume. A stage cuts its input into numbered
shards (`chunks`: shard k holds items k*N .. k*N+N-1 in input order, so a rerun sees the
same shards), skips those whose done-marker exists (`done_shards`: ``NNNNN_stats.json``,
written last), and hands the rest to `run_shards` with two functions of its own: `submit`
starts a job's Ray work and returns its object ref, `commit` stores a finished job's
result. The distributor

* runs on Ray (`ray_session`): a local cluster of ``--workers`` CPUs, or the cluster at
  ``--ray-address`` (whose nodes must see the same paths: configs make theirs `absolute`);
  ``--download-resource`` places download tasks on the nodes that offer that custom
  resource (`task_resources`);
* keeps at most `max_in_flight` jobs running at once;
* fails with `NoCapacityError` (exit 75, resumable) when for ``--capacity-timeout``
  seconds the cluster's live nodes lack the resources the run needs (a node died, or
  none with them joined): the shards committed so far are kept, the same command
  resumes once such nodes are up;
* retries a job whose work raised ``--shard-retries`` times, then reports it
  (`shard_failure`: the task's own error in one line, without Ray's wrapper; a full disk
  is not retried but stops the run);
* treats work lost with the cluster's capacity (`capacity_lost`: an actor unreachable or
  restarting, a node or worker process gone) as no failed attempt: it is submitted again
  until Ray has restarted the work elsewhere, for up to ``--capacity-timeout`` seconds per
  shard (a real cluster's default health checks take ~15 s to declare a node dead, and
  each call to an actor on it fails in a few seconds meanwhile);
* says in one plain line when a node is lost (`Capacity`), instead of Ray's coloured
  ``(raylet)`` messages (`print_ray_messages`);
* counts done and failed shards in a `Progress` the driver's progress bar reads.

`this_node` is what a shard's stats record about where its work ran (Ray node id and
host name). `summary` is the part of the run summary every stage writes (failures per
reason, failed shards, malformed input rows, the verdict of `failures.verdict`, the
time). Ray is imported when a run starts, so configs (`DistributeConfig`) and the CLI
load without it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol, TypeVar

from pipeline.config import Config, at_least
from pipeline.errors import DISK_FULL, ConfigError, NoCapacityError
from pipeline.failures import verdict
from pipeline.io import read_json

log = logging.getLogger(__name__)
STATS_SUFFIX = "_stats.json"  # a shard's done-marker: NNNNN_stats.json, written last
MAX_LISTED_MALFORMED = 100
BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")  # Ray's own: not a --download-resource
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
RESUBMIT_DELAY = 1.0  # seconds before work lost with the cluster's capacity is submitted again
T = TypeVar("T")


@dataclass(frozen=True)
class DistributeConfig(Config):
    """How a stage's shards are cut and run (the ``Shards and Ray`` flags)."""

    shard_size: int = 1000  # items per shard: the unit of work, retry and resume
    workers: int = 2  # CPUs of the local Ray cluster (ignored with ray_address)
    ray_address: Optional[str] = None  # join this cluster instead of starting one
    shard_retries: int = 2  # retries of a shard whose task raised, before it is reported
    retry_failed: bool = False  # re-attempt the retryable failed items of done shards
    max_failure_rate: float = 0.5  # the run fails (exit 1) above this failed fraction of the output's items
    download_resource: Optional[str] = None  # a custom Ray resource every download task takes one unit of
    capacity_timeout: float = 300.0  # --ray-address: seconds short of live nodes for the work before NoCapacityError

    def __post_init__(self) -> None:
        at_least(self, {"shard_size": 1, "workers": 1, "shard_retries": 0, "capacity_timeout": 0})
        if self.download_resource is not None and self.download_resource in ("", *BUILTIN_RESOURCES):
            raise ConfigError(
                f"--download-resource must name a custom Ray resource (one a node's `ray start "
                f"--resources` offers), not {self.download_resource!r}"
            )
        if not 0 <= self.max_failure_rate <= 1:
            raise ConfigError(f"--max-failure-rate must be between 0 and 1, got {self.max_failure_rate:g}")


def task_resources(cfg: DistributeConfig) -> dict:
    """The resources one download task asks Ray for (`ray.remote` options): a CPU, and one
    unit of ``--download-resource`` when given (so only the nodes offering it download)."""
    return {"num_cpus": 1, **({"resources": {cfg.download_resource: 1}} if cfg.download_resource else {})}


def this_node() -> dict:
    """Where the calling code runs, for a shard's stats: ``node_id`` (the Ray node's id;
    None outside a Ray worker or driver) and ``hostname``."""
    ray = sys.modules.get("ray")  # not imported: not in a Ray process
    node = ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None
    return {"node_id": node, "hostname": socket.gethostname()}


def absolute(path: os.PathLike) -> Path:
    """`path` made absolute against the current directory (without resolving symlinks):
    with ``--ray-address`` the tasks run on other nodes, which must see the same paths."""
    return Path(os.path.abspath(path))


def shard_name(number: int) -> str:
    return f"{number:05d}"


def stats_path(folder: Path, number: int) -> Path:
    """Where shard `number`'s done-marker lives in `folder`."""
    return Path(folder) / f"{shard_name(number)}{STATS_SUFFIX}"


def done_shards(folder: Path, what: str, complete: Callable[[int], bool] = lambda number: True) -> dict[int, dict]:
    """Shard number -> stats, for every shard of `folder` with a done-marker (and
    `complete(number)`); an unreadable marker is a DataError naming it as `what`."""
    done = {}
    for path in sorted(Path(folder).glob(f"[0-9]*{STATS_SUFFIX}")):
        number = path.name[: -len(STATS_SUFFIX)]
        if number.isdigit() and path.is_file() and complete(int(number)):
            done[int(number)] = read_json(path, what)
    return done


def chunks(items: Iterable[T], size: int) -> Iterator[tuple[int, list[T]]]:
    """(shard number, items) for consecutive runs of `size` items, in input order."""
    batch: list[T] = []
    number = 0
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield number, batch
            number, batch = number + 1, []
    if batch:
        yield number, batch


@dataclass
class MalformedRows:
    """Input rows a reader could not use: counted, the first ones kept as examples."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, row: object) -> None:
        self.count += 1
        if len(self.examples) < MAX_LISTED_MALFORMED:
            self.examples.append(str(row))
        log.warning("malformed input row %s", row)


@dataclass
class Progress:
    """Live counters of a run (stages add their own); the driver's progress bar reads them."""

    shards_done: int = 0  # committed in this run, or done before it
    shards_failed: int = 0  # failed for good in this run
    started: float = field(default_factory=time.time)


RAY_AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


class Job(Protocol):
    number: int  # the shard's number


J = TypeVar("J", bound=Job)


@contextmanager
def ray_session(cfg: DistributeConfig) -> Iterator[None]:
    """Ray for one run: the cluster at ``cfg.ray_address``, or a new local one of
    ``cfg.workers`` CPUs, shut down afterwards. Without an address the run never joins a
    cluster it finds on the machine (Ray's own ``ray.init()`` would attach to the latest
    ``ray start`` cluster, and refuse it for the CPU count): a cluster is named with
    ``--ray-address``. While the session lasts the driver prints none of Ray's coloured
    error messages (`print_ray_messages`). A Ray already initialized in this process is
    used as it is (and left running)."""
    import ray

    started = time.time()
    own = not ray.is_initialized()
    if own:
        where = {"address": cfg.ray_address} if cfg.ray_address else {"address": "local", "num_cpus": cfg.workers}
        if cfg.download_resource and not cfg.ray_address:  # the local node offers it to every worker
            where["resources"] = {cfg.download_resource: cfg.workers}
        # Ray's notice that a local cluster enables token authentication is not the user's business
        # (the token stays on); its other warnings and ours are left as they are.
        logging.getLogger(RAY_AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
        ray.init(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False, **where)
        print_ray_messages(False)
        log.debug("ray ready after %.2f s", time.time() - started)
    try:
        yield
    finally:
        if own:
            ray.shutdown()
            print_ray_messages(True)
            log.debug("ray stopped after %.2f s", time.time() - started)


def print_ray_messages(enabled: bool) -> None:
    """Whether the driver prints the cluster's error messages (off while a run's own Ray
    session lasts): Ray prints each as a ``(raylet)`` line in ANSI colours whatever the
    terminal or ``NO_COLOR`` (one per retry of every task on a lost node, the node's death
    as a multi-line dump). What they say reaches the user as the run's own lines instead: a
    lost node once (`Capacity.note_lost_nodes`), a shard's failure as its reason. Ray has no
    public switch for these (its debugger uses the same flag); a Ray without the flag keeps
    printing them."""
    worker = sys.modules.get("ray._private.worker")
    if worker is not None and hasattr(worker, "_worker_logs_enabled"):
        worker._worker_logs_enabled = enabled


@dataclass
class Capacity:
    """What a run needs of the cluster's live nodes, summed (resource -> amount, e.g. the
    detector actors' CPUs or GPUs plus one download task's), and how long it waits for it.
    `check` raises `NoCapacityError` once the live nodes have offered less for `timeout` s,
    and says once of each node it saw alive that it was lost (`note_lost_nodes`); `timeout`
    is also how long `run_shards` waits for work lost with the cluster's capacity."""

    needs: dict[str, float]
    timeout: float
    short_since: Optional[float] = None
    checked: float = 0.0
    alive: set = field(default_factory=set)  # ids of the nodes seen alive so far, less those seen lost

    def note_lost_nodes(self, nodes: list[dict]) -> None:
        """One warning per node that was alive at an earlier look and is dead (or gone) now."""
        now_alive = {node["NodeID"] for node in nodes if node.get("Alive")}
        for node in nodes:
            if node["NodeID"] in self.alive - now_alive:
                log.warning(
                    "lost Ray node %s (%s): its shards are redone on the other nodes",
                    node["NodeID"][:12],
                    node.get("NodeManagerAddress", "?"),
                )
        for gone in self.alive - now_alive - {node["NodeID"] for node in nodes}:
            log.warning("lost Ray node %s: its shards are redone on the other nodes", gone[:12])
        self.alive = now_alive

    def check(self, progress: Progress) -> None:
        """Look again (at most once a second): are there live nodes for the work?"""
        import ray

        now = time.monotonic()
        if now - self.checked < 1:
            return
        self.checked = now
        offered: Counter = Counter()
        nodes = ray.nodes()
        for node in nodes:
            if node.get("Alive"):
                offered.update(node.get("Resources", {}))
        self.note_lost_nodes(nodes)
        short = {name: amount for name, amount in self.needs.items() if offered[name] < amount}
        if not short:
            if self.short_since is not None:
                log.warning("the cluster has capacity for the work again")
            self.short_since = None
            return
        have = {name: offered[name] for name in short}
        if self.short_since is None:
            self.short_since = now
            log.warning(
                "the cluster's live nodes offer %s, the work needs %s: waiting up to %g s for nodes",
                have,
                short,
                self.timeout,
            )
        if now - self.short_since >= self.timeout:
            raise NoCapacityError(
                f"no capacity left on the cluster: this run needs {short} of its live nodes, which offer {have} "
                f"(a node was lost, or none offering these resources joined; waited {self.timeout:g} s, "
                f"--capacity-timeout); the {progress.shards_done} shards done are kept: rerun the same command "
                "once nodes with these resources are up"
            )


def capacity(cfg: DistributeConfig, *options: dict) -> Capacity:
    """A run's `Capacity`: the resources Ray `options` (those of `ray.remote`: num_cpus,
    num_gpus, resources) ask for, summed, waited for up to ``--capacity-timeout`` on a
    cluster; a local one gains no nodes, so there a shortfall fails at once."""
    needs: Counter = Counter()
    for opts in options:
        needs.update({"CPU": opts.get("num_cpus", 0), "GPU": opts.get("num_gpus", 0), **opts.get("resources", {})})
    return Capacity(
        {name: amount for name, amount in needs.items() if amount}, cfg.capacity_timeout if cfg.ray_address else 0
    )


def run_shards(
    jobs: Iterable[J],
    submit: Callable[[J], Any],
    commit: Callable[[J, Any], None],
    *,
    retries: int,
    max_in_flight: int,
    progress: Progress,
    on_progress: Optional[Callable[[], None]] = None,
    capacity: Optional[Capacity] = None,
) -> dict[str, str]:
    """Run every job of `jobs` (inside a `ray_session`): `submit(job)` starts its Ray work
    and returns the object ref of its result, `commit(job, result)` stores it. At most
    `max_in_flight` jobs run at once; a job whose work raised is submitted again up to
    `retries` times, then reported. Work lost with the cluster's capacity (`capacity_lost`:
    its actor unreachable or restarting, its node or worker process gone) is no failed
    attempt: the job is submitted again after `RESUBMIT_DELAY` s, for up to `capacity`'s
    timeout since its first such loss in a row (then its losses count as attempts), so a
    node a real cluster takes a while to declare dead costs no shard. `on_progress` is
    called about every 0.2 s. While no job finishes, `capacity` (if given) checks that
    live nodes can run the work (else `NoCapacityError`). Returns shard name -> reason for
    the shards that failed for good."""
    import ray

    failed: dict[str, str] = {}
    in_flight: dict = {}  # ObjectRef -> (job, attempt)
    waiting: list = []  # (when to submit again, job, attempt): work lost with capacity
    lost_since: dict[int, float] = {}  # job number -> its first capacity loss in a row
    patience = capacity.timeout if capacity is not None else 0.0
    losing = False  # a capacity loss was reported and no shard finished since

    def start(job: J, attempt: int) -> None:
        in_flight[submit(job)] = (job, attempt)

    def lost(job: J, attempt: int, reason: str) -> bool:
        """Wait for capacity instead of counting an attempt (False: patience is spent)."""
        nonlocal losing
        now = time.monotonic()
        since = lost_since.setdefault(job.number, now)
        if now - since >= patience:
            return False
        if not losing:
            log.warning(
                "shard %s: its Ray worker is unreachable (a node lost?); waiting up to %g s for Ray to restart "
                "the work elsewhere (%s)",
                shard_name(job.number),
                patience,
                reason,
            )
            losing = True
        else:
            log.debug("shard %s lost with capacity (%s); submitted again", shard_name(job.number), reason)
        waiting.append((now + RESUBMIT_DELAY, job, attempt))
        return True

    def collect() -> None:
        nonlocal losing
        now = time.monotonic()
        for entry in [w for w in waiting if w[0] <= now]:
            waiting.remove(entry)
            start(entry[1], entry[2])
        if in_flight:
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.2)
        else:
            ready = []
            time.sleep(0.2)
        if not ready and capacity is not None:
            capacity.check(progress)
        for ref in ready:
            job, attempt = in_flight.pop(ref)
            try:
                result = ray.get(ref)
            except Exception as err:  # a shard error: retried, then reported (a full disk stops the run)
                reason = shard_failure(err)
                if capacity_lost(err) and lost(job, attempt, reason):
                    continue
                if attempt < retries:
                    log.warning("shard %s failed (%s); retrying", shard_name(job.number), reason)
                    start(job, attempt + 1)
                else:
                    failed[shard_name(job.number)] = reason
                    progress.shards_failed += 1
                    log.error("shard %s failed %d times: %s", shard_name(job.number), attempt + 1, reason)
                continue
            lost_since.pop(job.number, None)
            losing = False
            commit(job, result)
            progress.shards_done += 1
        if on_progress:
            on_progress()

    for job in jobs:
        while len(in_flight) + len(waiting) >= max_in_flight:
            collect()
        start(job, 0)
    while in_flight or waiting:
        collect()
    return failed


def capacity_lost(err: Exception) -> bool:
    """Whether Ray raised `err` because the work lost its place in the cluster (its actor
    unreachable, restarting or dead for a lost process or node; its node or worker process
    died; an input object lost with its node), not because the work itself failed. An actor
    whose constructor raised is a failure of the work."""
    from ray import exceptions

    if isinstance(err, exceptions.RayActorError):
        return not err.actor_init_failed
    return isinstance(err, (exceptions.NodeDiedError, exceptions.WorkerCrashedError, exceptions.ObjectLostError))


def shard_failure(err: Exception) -> str:
    """The one-line reason a shard task failed, from the exception Ray raised for it (the
    task's own exception, not Ray's wrapper and remote traceback; no ANSI colours). A full
    disk is raised as it is: retrying cannot help, and the CLI turns it into exit 74."""
    cause = getattr(err, "cause", None) or err  # ray.exceptions.RayTaskError keeps the task's exception
    if isinstance(cause, OSError) and cause.errno in DISK_FULL:
        raise cause
    text = ANSI_ESCAPE.sub("", f"{type(cause).__name__}: {cause}")  # Ray colours names in its messages
    return " ".join(text.split())[:1000]  # one line: Ray's messages span several


def summary(
    done: dict[int, dict],
    failed_shards: dict[str, str],
    malformed: MalformedRows,
    items: int,
    successes: int,
    max_failure_rate: float,
) -> dict:
    """The summary fields every stage writes: failures per reason over the done shards'
    stats, the shards that failed for good, malformed input rows, the verdict on `items`
    of which `successes` succeeded (`failures.verdict`), and when it finished."""
    failures: Counter = Counter()
    for stats in done.values():
        failures.update(stats["failures"])
    return {
        "shards_failed": failed_shards,
        "failures": dict(failures.most_common()),
        "malformed_rows": malformed.count,
        "malformed_examples": malformed.examples,
        **verdict(items, successes, failures, failed_shards, max_failure_rate, malformed.count),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
