"""The trainer's input pipeline: endless batches, prepared while the model steps.

One `torch.utils.data.DataLoader` serves a whole run (its worker processes live as long as the
run: no start-up per epoch). Its batch sampler, `EpochBatches`, walks the run's sampler epoch
after epoch and hands each item on as an ``(epoch, index)`` draw, so that a worker builds the
example of the right epoch whatever epoch its dataset copy last saw: an example is a function of
(seed, epoch, index) only (`vl_models.data.dataset`), and the batches are the same with any
number of workers (``--workers``), in the same order.

Workers read ahead (``--prefetch`` batches each), so the sampler runs ahead of the training
loop; what the loop has consumed is tracked per batch (`Consumed`: the epoch and the position
in it after the batch), and that is what a checkpoint records, so a resume continues after the
last batch trained on, not after the last one prefetched.

On CUDA the batches come in pinned memory and go to the device without blocking the host
(`to_device`); the copy overlaps the step before it.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import torch

from vl_models.data.padding import padded

Draw = tuple[int, int]  # (epoch, index): an item as a worker builds it
MAX_AUTO_WORKERS = 8  # on CUDA: enough to feed one accelerator with the batched store reads


def drawn(key: Union[int, Draw], epoch: int) -> Draw:
    """(epoch, index) of a dataset key: a draw of `EpochBatches` as it is, a bare index (an
    evaluation, a test) in the dataset's own `epoch`."""
    if isinstance(key, tuple):
        return int(key[0]), int(key[1])
    return epoch, int(key)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity; a container's share where the OS says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_workers(device: str, ranks_here: int = 1) -> int:
    """DataLoader workers per rank when ``--workers`` is not given. On CUDA: this rank's share
    of the CPUs less one (the training process keeps a core to launch kernels), at most
    `MAX_AUTO_WORKERS`, at least 1. On a CPU the model's own threads use every core and a worker
    would take its cycles from them: none below 8 cores, then 1 per 8 cores (at most 4), as the
    batch takes milliseconds to build and the step seconds (`docs/benchmarks.md`, "Input
    pipeline")."""
    cpus = max(1, usable_cpus() // max(1, ranks_here))
    if device.startswith("cuda"):
        return max(1, min(MAX_AUTO_WORKERS, cpus - 1))
    return min(4, cpus // 8)


@dataclass
class Consumed:
    """Where the training loop is in its sampler's epochs: the epoch of the last batch it took
    and the items of that epoch handed out up to and including it (on this rank)."""

    epoch: int
    position: int


class EpochBatches(torch.utils.data.Sampler[list]):
    """Batches of `sampler`'s epochs one after the other, without end, each a list of
    ``(epoch, index)`` draws. With `batch_size` the sampler gives items, cut into batches of
    that size, an epoch's last incomplete one dropped (``drop_last``); without, it gives whole
    batches (`TaskBatchSampler`). Each batch's (epoch, position after it) goes to `drawn` as it
    is handed out, for the consumer to pop in the same order (`loader_batches`)."""

    def __init__(self, sampler, batch_size: Optional[int] = None):
        self.sampler, self.batch_size = sampler, batch_size
        self.drawn: collections.deque = collections.deque()

    def _batches(self) -> Iterator[list[int]]:
        if self.batch_size is None:
            yield from self.sampler
            return
        chunk: list[int] = []
        for index in self.sampler:
            chunk.append(index)
            if len(chunk) == self.batch_size:
                yield chunk
                chunk = []

    def __iter__(self) -> Iterator[list[Draw]]:
        while True:
            epoch = self.sampler.epoch
            for batch in self._batches():
                self.drawn.append((epoch, self.sampler.position))
                yield [(epoch, int(i)) for i in batch]
            self.sampler.set_epoch(epoch + 1)


def to_device(batch: dict, device: str) -> dict:
    """`batch`'s tensors on `device`; from pinned memory without blocking the host."""
    return {k: v.to(device, non_blocking=v.is_pinned()) if torch.is_tensor(v) else v for k, v in batch.items()}


def loader_batches(data, sampler, cfg, consumed: Consumed, device: str = "cpu", batched: bool = False):
    """Endless batches of `data` in `sampler`'s order, padded as ``cfg.data.padding`` says
    (`vl_models.data.padding`), built by ``cfg.data.workers`` worker processes (None: the
    device's default, `default_workers`) reading ``cfg.data.prefetch`` batches ahead each;
    `consumed` follows the batches as they are handed to the loop. With `batched` the sampler
    yields whole batches (`TaskBatchSampler`), else item indices, cut to
    ``cfg.optim.batch_size``."""
    workers = cfg.data.workers
    if workers is None:
        workers = default_workers(device, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    stream = EpochBatches(sampler, None if batched else cfg.optim.batch_size)
    loader = torch.utils.data.DataLoader(
        data,
        batch_sampler=stream,
        num_workers=workers,
        # a dataset may bring its own collate (PretrainDataset's hands its batch arrays on uncopied)
        collate_fn=getattr(data, "collate", None),
        pin_memory=device.startswith("cuda"),
        prefetch_factor=cfg.data.prefetch if workers else None,
        # its own generator: making a loader must not draw from the global RNG (resume exactness)
        generator=torch.Generator().manual_seed(cfg.run.seed),
    )
    for batch in loader:
        consumed.epoch, consumed.position = stream.drawn.popleft()
        yield padded(batch, cfg.data.padding)
