"""Resumable, deterministic, rank-partitioned samplers: of items (`ResumableSampler`,
pretraining) and of one-task batches over several tasks (`TaskBatchSampler`, fine-tuning).

Epoch e visits the permutation of `seed + e`; rank r of w takes positions r, r+w, ... of
it (the tail is cut so every rank gets the same count). Its position is part of the
checkpoint: after `load_state_dict`, iteration continues with the next unseen index, so a
resumed run neither repeats nor skips items.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch


class ResumableSampler(torch.utils.data.Sampler[int]):
    def __init__(self, size: int, rank: int = 0, world: int = 1, seed: int = 0, shuffle: bool = True):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world size {world}")
        self.size, self.rank, self.world, self.seed, self.shuffle = size, rank, world, seed, shuffle
        self.epoch = 0
        self.position = 0  # items of this epoch already handed out (on this rank)

    def __len__(self) -> int:
        return self.size // self.world

    def indices(self, epoch: int) -> np.ndarray:
        order = (
            np.random.default_rng(self.seed + epoch).permutation(self.size) if self.shuffle else np.arange(self.size)
        )
        return order[: len(self) * self.world][self.rank :: self.world]

    def __iter__(self) -> Iterator[int]:
        mine = self.indices(self.epoch)
        while self.position < len(mine):
            index = int(mine[self.position])
            self.position += 1
            yield index

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "size": self.size,
            "world": self.world,
        }

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["size"], state["world"]) != (self.seed, self.size, self.world):
            raise ValueError("sampler state was saved for another seed, data size or world size")
        self.epoch, self.position = state["epoch"], state["position"]


TASK_SAMPLING = ("round-robin", "proportional")


class TaskBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of one task each over the tasks' datasets concatenated (task t's items at
    offset sum(sizes[:t])): each task's items are visited as a `ResumableSampler` of its own
    would (seed + t) and cut into whole batches; an epoch is every task's batches, ordered
    ``round-robin`` (t0, t1, ..., t0, ...; a task whose batches ran out drops out) or
    ``proportional`` (a seeded shuffle of all batches: each task in proportion to its size).
    The order is the same on every rank, so DDP ranks train the same task at each step.
    `position` counts the items of this epoch handed out; a resume continues after them."""

    def __init__(
        self,
        sizes: Sequence[int],
        batch_size: int,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        mode: str = "round-robin",
    ):
        if mode not in TASK_SAMPLING:
            raise ValueError(f"task sampling {mode!r}: one of {', '.join(TASK_SAMPLING)}")
        self.sizes, self.batch_size, self.seed, self.mode, self.world = list(sizes), batch_size, seed, mode, world
        self.items = [ResumableSampler(n, rank, world, seed + t) for t, n in enumerate(self.sizes)]
        self.offsets = np.cumsum([0, *self.sizes[:-1]])
        self.epoch = 0
        self.position = 0

    def counts(self) -> list[int]:
        """Batches per task in an epoch (on each rank)."""
        return [len(s) // self.batch_size for s in self.items]

    def order(self, epoch: int) -> list[int]:
        """The task of each batch of `epoch`."""
        counts = self.counts()
        if self.mode == "proportional":
            tasks = np.repeat(np.arange(len(counts)), counts)
            return np.random.default_rng([self.seed, epoch, 1]).permutation(tasks).tolist()
        out, left = [], list(counts)
        while any(left):
            for t in range(len(left)):
                if left[t]:
                    out.append(t)
                    left[t] -= 1
        return out

    def __len__(self) -> int:
        return sum(self.counts())

    def __iter__(self) -> Iterator[list[int]]:
        mine = [s.indices(self.epoch) for s in self.items]
        taken = [0] * len(mine)
        for k, t in enumerate(self.order(self.epoch)):
            start = taken[t] * self.batch_size
            taken[t] += 1
            if k < self.position // self.batch_size:
                continue
            self.position += self.batch_size
            yield [int(i) + int(self.offsets[t]) for i in mine[t][start : start + self.batch_size]]

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "sizes": self.sizes,
            "world": self.world,
            "batch_size": self.batch_size,
            "mode": self.mode,
        }

    def load_state_dict(self, state: dict) -> None:
        saved = (state["seed"], state["sizes"], state["world"], state["batch_size"], state["mode"])
        if saved != (self.seed, self.sizes, self.world, self.batch_size, self.mode):
            raise ValueError(
                "sampler state was saved for another seed, data sizes, world size, batch size or task sampling"
            )
        self.epoch, self.position = state["epoch"], state["position"]
