"""Rank and world size from torchrun's environment; process-group setup; work shared out
over the ranks of the process group and gathered back (`shard`, `gather_shards`), so that no
rank waits for another's whole evaluation."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank); (0, 1, 0) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def init(device: str, timeout: Optional[float] = None) -> None:
    """Join the process group under torchrun (no-op outside it, or when joined already):
    NCCL on this rank's GPU, gloo on CPU. `timeout`: the seconds a collective waits for the
    other ranks before this rank fails (None: torch's default)."""
    rank, size, _ = world()
    if size > 1 and not dist.is_initialized():
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))  # object collectives run on the current device
        dist.init_process_group(
            "nccl" if device.startswith("cuda") else "gloo", timeout=timedelta(seconds=timeout) if timeout else None
        )


def is_main() -> bool:
    return world()[0] == 0


def _joined() -> bool:
    return dist.is_available() and dist.is_initialized()


def any_rank(flags: torch.Tensor) -> torch.Tensor:
    """Element-wise OR of a 0/1 float tensor over all ranks (on the rank's device; the
    tensor itself outside torchrun): every rank takes the same decision, none hangs."""
    if _joined():
        flags = flags.clone()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return flags


def barrier(device: str) -> None:
    """Wait for every rank (no-op outside torchrun); NCCL on this rank's GPU."""
    if _joined():
        if device.startswith("cuda"):
            dist.barrier(device_ids=[torch.device(device).index or 0])
        else:
            dist.barrier()


def shard(count: int) -> range:
    """This rank's units of `count` work units (batches, queries, images): r, r + w, ... on
    rank r of w ranks in the process group; all of them outside one. Every rank then calls
    `gather_shards` with its results."""
    if not _joined():
        return range(count)
    return range(dist.get_rank(), count, dist.get_world_size())


def gather_shards(mine: list) -> list:
    """Every rank's results of its `shard` (one picklable item per unit, in the unit order
    of that rank), merged back into unit order, on every rank. A collective: every rank of
    the group calls it once per `shard`."""
    if not _joined():
        return list(mine)
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, list(mine))
    return [parts[i % len(parts)][i // len(parts)] for i in range(sum(len(p) for p in parts))]
