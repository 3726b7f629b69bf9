"""Rank and world size from torchrun's environment; process-group setup."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank); (0, 1, 0) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def init(device: str) -> None:
    rank, size, _ = world()
    if size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")


def is_main() -> bool:
    return world()[0] == 0


def any_rank(flags: torch.Tensor) -> torch.Tensor:
    """Element-wise OR of a 0/1 float tensor over all ranks (on the rank's device; the
    tensor itself outside torchrun): every rank takes the same decision, none hangs."""
    if dist.is_available() and dist.is_initialized():
        flags = flags.clone()
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return flags


def barrier(device: str) -> None:
    """Wait for every rank (no-op outside torchrun); NCCL on this rank's GPU."""
    if dist.is_available() and dist.is_initialized():
        if device.startswith("cuda"):
            dist.barrier(device_ids=[torch.device(device).index or 0])
        else:
            dist.barrier()
