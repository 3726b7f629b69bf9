"""Work lost with the cluster's capacity (an actor's process or node gone) is no failed
attempt of its shard (`distribute.run_shards`, `capacity_lost`), and a lost node is said in
one line (`Capacity.note_lost_nodes`). The same on a real cluster with Ray's default health
checks: tests/pipeline/test_ray_cluster.py."""

import logging
import os
import re
import time
from pathlib import Path

from helpers import no_shared_ray, shared_ray

from pipeline.distribute import (
    Capacity,
    DistributeConfig,
    Progress,
    capacity_lost,
    ray_session,
    run_shards,
    shard_failure,
)


class Job:
    def __init__(self, number: int):
        self.number = number


def dies_once():
    """An actor class (made here: Ray's workers pickle it by value, they cannot import a test
    module) whose process exits at the first call that finds no `marker` file (it writes it)."""

    class DiesOnce:
        def __init__(self, marker: str):
            self.marker = Path(marker)

        def work(self, number: int) -> int:
            if not self.marker.exists():
                self.marker.write_text("died")
                os._exit(1)
            return number * 10

    return DiesOnce


def run_with_a_dying_actor(tmp_path: Path, patience: float) -> tuple[dict, dict]:
    """Shards 0..2 on one actor that dies at its first call (Ray restarts it, but retries
    no task itself), with no retries of our own; the failed shards and those committed."""
    import ray

    actor = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0)(dies_once()).remote(str(tmp_path / "marker"))
    committed = {}
    failed = run_shards(
        map(Job, range(3)),
        lambda job: actor.work.remote(job.number),
        lambda job, result: committed.__setitem__(job.number, result),
        retries=0,
        max_in_flight=1,
        progress=Progress(),
        capacity=Capacity({}, patience),
    )
    ray.kill(actor)
    return failed, committed


def test_an_actor_lost_with_its_process_costs_no_attempt_while_the_capacity_timeout_lasts(tmp_path, capfd):
    """In a run's own Ray session, and without Ray's coloured ``(raylet)`` message about the
    dead worker (printed to the driver's stdout, ANSI colours and all, before)."""
    no_shared_ray()  # this test is of a run's own Ray
    with ray_session(DistributeConfig(workers=1)):
        failed, committed = run_with_a_dying_actor(tmp_path, patience=60)
    assert failed == {} and committed == {0: 0, 1: 10, 2: 20}
    out, err = capfd.readouterr()
    assert "(raylet)" not in out + err and "\x1b" not in out + err, out + err


def test_once_the_capacity_timeout_is_spent_a_lost_actor_is_a_failed_attempt_in_one_line(tmp_path):
    shared_ray()
    failed, committed = run_with_a_dying_actor(tmp_path, patience=0)  # a local cluster: no nodes to wait for
    assert list(failed) == ["00000"] and committed == {1: 10, 2: 20}
    assert re.match(r"Actor(Died|Unavailable)Error: ", failed["00000"]) and "\n" not in failed["00000"]


def test_an_actor_whose_constructor_raises_is_a_failure_of_the_work_said_in_one_plain_line():
    import ray

    class Broken:
        def __init__(self):
            raise ValueError("no such weights")

        def work(self, number: int) -> int:
            return number

    shared_ray()
    actor = ray.remote(num_cpus=1, max_restarts=-1)(Broken).remote()
    started = time.monotonic()
    failed = run_shards(
        [Job(0)],
        lambda job: actor.work.remote(job.number),
        lambda job, result: None,
        retries=1,
        max_in_flight=1,
        progress=Progress(),
        capacity=Capacity({}, 60),
    )
    assert time.monotonic() - started < 30  # not waited on as lost capacity
    (reason,) = failed.values()
    assert reason.startswith("ActorDiedError: ") and "ValueError: no such weights" in reason
    assert "\x1b" not in reason and "\n" not in reason  # Ray colours the actor's name in its message


def test_what_counts_as_capacity_loss():
    from ray import exceptions

    assert capacity_lost(exceptions.ActorUnavailableError("unreachable", b"\0" * 16))
    assert capacity_lost(exceptions.ActorDiedError())
    assert capacity_lost(exceptions.NodeDiedError("node gone"))
    assert capacity_lost(exceptions.WorkerCrashedError())
    assert not capacity_lost(exceptions.RayActorError(error_msg="__init__ raised", actor_init_failed=True))
    assert not capacity_lost(ValueError("the work itself failed"))
    assert shard_failure(exceptions.ActorDiedError()).count("\n") == 0


def test_a_lost_node_is_one_warning_once(caplog):
    node = {"NodeID": "a" * 56, "NodeManagerAddress": "10.0.0.7", "Alive": True}
    other = {"NodeID": "b" * 56, "NodeManagerAddress": "10.0.0.8", "Alive": True}
    gone = {"NodeID": "c" * 56, "NodeManagerAddress": "10.0.0.9", "Alive": True}
    watch = Capacity({}, 60)
    with caplog.at_level(logging.WARNING, logger="pipeline.distribute"):
        watch.note_lost_nodes([node, other, gone])
        assert caplog.messages == []
        for _ in range(3):
            watch.note_lost_nodes([{**node, "Alive": False}, other])  # `gone`: no longer listed at all
    assert sorted(caplog.messages) == [
        "lost Ray node aaaaaaaaaaaa (10.0.0.7): its shards are redone on the other nodes",
        "lost Ray node cccccccccccc: its shards are redone on the other nodes",
    ]
