"""A real Ray cluster of several nodes on one host, for tests: `RayCluster`.

Each node is its own ``ray start --block`` process with its own raylet, object store and
worker processes, started from the ``ray start`` commands of
workflows/cluster/ray-cluster.yaml (the recipe's head and worker commands) with this
host's port, CPUs, resources and a short temporary folder substituted (Ray's socket paths
must be short). The nodes share a fresh auth token (`env`: what a driver needs to join).
Nothing else is changed: the GCS checks the nodes' health as Ray does by default (every
3 s, a node dead after 5 misses, so ~15 s after it is lost), as on a real cluster, whose
recipe sets no health-check options either.

A node's processes are found by PID: its ``ray start`` process and that one's
descendants in /proc (the raylet, GCS, agents and every worker the raylet starts), so
`RayNode.kill` SIGKILLs a whole node as a lost machine would go, and `RayCluster.stop`
ends exactly the processes this cluster started — never ``ray stop``, which would end
every Ray cluster of the host. Every wait has a deadline; `RayCluster.logs` gives the
tails of the nodes' raylet logs for a failing test's message.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import yaml
from helpers import free_port

RECIPE = Path(__file__).resolve().parents[1] / "workflows" / "cluster" / "ray-cluster.yaml"
START_TIMEOUT = 90  # seconds for one node to come up (a loaded 2-core box)
# Options of the recipe's commands this host sets itself, and those only the cluster launcher knows.
SET_HERE = ("--port", "--address", "--num-cpus", "--resources", "--temp-dir")
LAUNCHER_ONLY = ("--autoscaling-config",)


def recipe_command(key: str) -> list[str]:
    """The recipe's ``ray start`` command of `key` (head_start_ray_commands or
    worker_start_ray_commands) as arguments, without the options this host sets itself
    (`SET_HERE`) and those only the cluster launcher knows; environment assignments in
    front of it (``RAY_AUTH_MODE=token``) are kept as ``NAME=VALUE`` items."""
    commands = yaml.safe_load(RECIPE.read_text())[key]
    line = next(c for c in commands if " ray start " in f" {c} ")
    args, kept, skip = shlex.split(line), [], False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in SET_HERE + LAUNCHER_ONLY:
            skip = "=" not in arg  # `--flag value`: drop the value too
            continue
        kept.append(arg)
    return kept


def _children() -> dict[int, list[int]]:
    """ppid -> pids of the processes alive now (from /proc)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


class RayNode:
    """One node: its ``ray start --block`` process and everything under it."""

    def __init__(self, name: str, args: list[str], temp_dir: Path, env: dict):
        self.name = name
        self.temp_dir = temp_dir
        self.output = temp_dir.with_suffix(".out")
        self.seen: set[int] = set()  # every pid ever found under this node
        with open(self.output, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.node_id: Optional[str] = None

    def wait_started(self) -> None:
        """Until the node is up and its raylet has its node id (or a RuntimeError)."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray node {self.name} exited {self.proc.returncode}:\n{self.tail(self.output)}")
            if "Ray runtime started" in self.output.read_text():
                match = re.search(r"Setting node ID node_id=([0-9a-f]+)", self.tail(self.raylet_log(), 400))
                if match:
                    self.node_id = match.group(1)
                    self.pids()
                    return
            time.sleep(0.1)
        raise RuntimeError(f"ray node {self.name} not up after {START_TIMEOUT} s:\n{self.tail(self.output)}")

    def raylet_log(self) -> Path:
        return self.temp_dir / "session_latest" / "logs" / "raylet.out"

    def pids(self) -> list[int]:
        """The node's live processes, deepest first (workers before their raylet)."""
        tree, found, level = _children(), [], [self.proc.pid]
        while level:
            found[:0] = level
            level = [child for pid in level for child in tree.get(pid, [])]
        self.seen.update(found)
        return [pid for pid in found if _alive(pid)]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL every process of the node (a machine lost), and reap its ``ray start``."""
        for pid in self.pids() + [p for p in self.seen if _alive(p)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)

    @staticmethod
    def tail(path: Path, lines: int = 30) -> str:
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as err:
            return f"({path}: {err})"


class RayCluster:
    """A head node and worker nodes on 127.0.0.1, each its own raylet (see the module doc)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        token = self.root / "token"
        token.write_text(secrets.token_hex(32))
        # What every node and every driver of this cluster needs (the recipe's RAY_AUTH_MODE=token).
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
        self.nodes: dict[str, RayNode] = {}

    def _start(self, name: str, recipe_key: str, cpus: float, resources: dict, where: list[str]) -> RayNode:
        command = recipe_command(recipe_key)
        env = {**os.environ, **self.env}
        while command and "=" in command[0] and not command[0].startswith("-"):  # NAME=VALUE before `ray`
            key, value = command.pop(0).split("=", 1)
            env[key] = value
        assert command[0] == "ray", command
        command[:1] = [sys.executable, "-m", "ray.scripts.scripts"]  # this environment's `ray`, not PATH's
        ports = [
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        ]
        if recipe_key.startswith("head"):
            ports += ["--ray-client-server-port", "--dashboard-port"]
        args = [
            *command,
            *where,
            "--node-ip-address",
            "127.0.0.1",
            "--num-cpus",
            str(cpus),
            "--resources",
            json.dumps(resources),
            "--temp-dir",
            str(self.root / name),
            *[arg for port in ports for arg in (port, str(free_port()))],
            "--block",
        ]
        node = RayNode(name, args, self.root / name, env)
        self.nodes[name] = node
        return node

    def start_head(self, cpus: float = 0, resources: Optional[dict] = None) -> RayNode:
        node = self._start(
            "head", "head_start_ray_commands", cpus, resources or {"node_head": 1}, ["--port", str(self.port)]
        )
        node.wait_started()
        return node

    def add_nodes(self, specs: dict[str, tuple[float, dict]]) -> list[RayNode]:
        """Start worker nodes name -> (CPUs, resources) side by side; wait for all."""
        nodes = [
            self._start(name, "worker_start_ray_commands", cpus, resources, ["--address", self.address])
            for name, (cpus, resources) in specs.items()
        ]
        for node in nodes:
            node.wait_started()
        return nodes

    def node_of(self, node_id: str) -> RayNode:
        return next(node for node in self.nodes.values() if node.node_id == node_id)

    def ids(self) -> dict[str, str]:
        """Node name -> node id, for the nodes alive."""
        return {name: node.node_id for name, node in self.nodes.items() if node.alive()}

    def logs(self, lines: int = 15) -> str:
        """The tails of every node's raylet log (for a failing test's message)."""
        return "\n".join(
            f"--- {name} ({node.node_id}) raylet.out:\n{node.tail(node.raylet_log(), lines)}"
            for name, node in self.nodes.items()
        )

    def stop(self) -> None:
        """SIGKILL the worker nodes, then the head: only the processes this cluster started."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            node = self.nodes[name]
            try:
                node.kill()
            except subprocess.TimeoutExpired:
                pass


@contextmanager
def ray_cluster(workers: dict[str, tuple[float, dict]], head_cpus: float = 0) -> Iterator[RayCluster]:
    """A started cluster (head with `head_cpus` CPUs, and `workers`: name -> (CPUs,
    resources)), stopped by PID and its folder removed at the end, however the block ends."""
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's unix socket paths must be
    cluster = RayCluster(root)
    try:
        cluster.start_head(head_cpus)
        cluster.add_nodes(workers)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
