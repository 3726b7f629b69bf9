"""Resumable, deterministic, rank-partitioned samplers: of items (`ResumableSampler`,
pretraining) and of one-task batches over several tasks (`TaskBatchSampler`, fine-tuning).

Epoch e visits the permutation of `seed + e`; rank r of w takes positions r, r+w, ... of
it (the tail is cut so every rank gets the same count). Its position is part of the
checkpoint: after `load_state_dict`, iteration continues with the next unseen index, so a
resumed run neither repeats nor skips items.

With item lengths (``--group-by-length``) the permutation is regrouped (`group_by_length`)
so that each optimizer step's items, over all ranks, have similar text lengths: with dynamic
padding (`vl_models.data.padding`) a batch of short texts is computed short. The regrouping
is a function of the seed, the epoch and the lengths only, so it is the same on every rank
and a resume stays exact.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional, Sequence, Union

import numpy as np
import torch

from vl_models.config import TASK_SAMPLING

MEGABATCH = 50  # steps sorted together (transformers' LengthGroupedSampler's mega-batches of 50 batches)


def group_by_length(order: np.ndarray, lengths: np.ndarray, span: int, rng: np.random.Generator) -> np.ndarray:
    """`order` (item indices) regrouped into runs of `span` items of similar length: it is cut
    into mega-batches of `MEGABATCH` x `span` items, each sorted by length (longest first,
    ties in `order`'s order) and cut into runs of `span`; the whole runs follow in an order
    drawn from `rng`, then the last, shorter one. With `span` one step's items over all ranks,
    rank r's positions r, r+w, ... of a run are its batch."""
    span = max(int(span), 1)
    runs = []
    for start in range(0, len(order), span * MEGABATCH):
        chunk = order[start : start + span * MEGABATCH]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        runs += [chunk[i : i + span] for i in range(0, len(chunk), span)]
    whole = [run for run in runs if len(run) == span]
    tail = [run for run in runs if len(run) < span]
    return np.concatenate([whole[i] for i in rng.permutation(len(whole))] + tail) if runs else order


Lengths = Union[np.ndarray, Callable[[int], np.ndarray], None]


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Items of `size` in a seeded order per epoch, rank `rank`'s share of `world` (see the
    module's docstring); with `lengths` (one per item, or a function of the epoch giving them:
    pretraining's texts change with the pair negatives drawn) grouped by length into steps of
    `batch_size` items per rank."""

    def __init__(
        self,
        size: int,
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        lengths: Lengths = None,
        batch_size: int = 1,
    ):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} outside world size {world}")
        self.size, self.rank, self.world, self.seed, self.shuffle = size, rank, world, seed, shuffle
        self.lengths, self.batch_size = lengths, batch_size
        self._lengths: tuple = (None, None)  # (epoch, its lengths) of a function of the epoch
        if lengths is not None and not callable(lengths):
            self._check(lengths)
        self.epoch = 0
        self.position = 0  # items of this epoch already handed out (on this rank)

    def __len__(self) -> int:
        return self.size // self.world

    def indices(self, epoch: int, draw: Union[int, Sequence[int], None] = None) -> np.ndarray:
        """This rank's items of `epoch` in order; `draw`: the seed of another pass's
        permutation (default: the epoch's, ``seed + epoch``)."""
        draw = self.seed + epoch if draw is None else draw
        order = np.random.default_rng(draw).permutation(self.size) if self.shuffle else np.arange(self.size)
        if self.lengths is not None:
            rng = np.random.default_rng([*np.atleast_1d(draw).tolist(), 1])
            order = group_by_length(order, self.lengths_at(epoch), self.batch_size * self.world, rng)
        return order[: len(self) * self.world][self.rank :: self.world]

    def lengths_at(self, epoch: int) -> np.ndarray:
        """The items' lengths in `epoch` (a function of the epoch is called once per epoch)."""
        if not callable(self.lengths):
            return self.lengths
        if self._lengths[0] != epoch:
            self._lengths = (epoch, self._check(self.lengths(epoch)))
        return self._lengths[1]

    def _check(self, lengths: np.ndarray) -> np.ndarray:
        if len(lengths) != self.size:
            raise ValueError(f"{len(lengths)} lengths for {self.size} items")
        return lengths

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


class TaskBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Batches of one task each over the tasks' datasets concatenated (task t's items at
    offset sum(sizes[:t])): each task's items are visited as a `ResumableSampler` of its own
    would (seed + t) and cut into whole batches of that task's batch size (`batch_size`: one
    for all tasks, or one per task). An epoch is ordered

    * ``round-robin``: t0, t1, ..., t0, ...; a task whose batches ran out drops out;
    * ``proportional``: a seeded shuffle of all batches (each task in proportion to its size);
    * ``cycle`` (12-in-1's multi-task loop): rounds of one batch of every task, as many rounds
      as the task with the most batches has; a task whose batches ran out starts another pass
      over its items (a new permutation).

    The order is the same on every rank, so DDP ranks train the same task at each step.
    `position` counts the items of this epoch handed out; a resume continues after them.
    `lengths`: per task, its items' lengths (None: that task's batches are not grouped by
    length), as `ResumableSampler` groups them."""

    def __init__(
        self,
        sizes: Sequence[int],
        batch_size: Union[int, Sequence[int]],
        rank: int = 0,
        world: int = 1,
        seed: int = 0,
        mode: str = "round-robin",
        lengths: Optional[Sequence[Lengths]] = None,
    ):
        if mode not in TASK_SAMPLING:
            raise ValueError(f"task sampling {mode!r}: one of {', '.join(TASK_SAMPLING)}")
        self.sizes, self.seed, self.mode, self.world = list(sizes), seed, mode, world
        self.batch_sizes = [batch_size] * len(self.sizes) if isinstance(batch_size, int) else list(batch_size)
        if len(self.batch_sizes) != len(self.sizes):
            raise ValueError(f"{len(self.batch_sizes)} batch sizes for {len(self.sizes)} tasks")
        lengths = list(lengths) if lengths is not None else [None] * len(self.sizes)
        self.items = [
            ResumableSampler(n, rank, world, seed + t, lengths=lengths[t], batch_size=self.batch_sizes[t])
            for t, n in enumerate(self.sizes)
        ]
        self.offsets = np.cumsum([0, *self.sizes[:-1]])
        self.epoch = 0
        self.position = 0

    def counts(self) -> list[int]:
        """Batches per task in one pass over its items (on each rank)."""
        return [len(s) // b for s, b in zip(self.items, self.batch_sizes)]

    def order(self, epoch: int) -> list[int]:
        """The task of each batch of `epoch`."""
        counts = self.counts()
        if self.mode == "proportional":
            tasks = np.repeat(np.arange(len(counts)), counts)
            return np.random.default_rng([self.seed, epoch, 1]).permutation(tasks).tolist()
        if self.mode == "cycle":
            live = [t for t, n in enumerate(counts) if n]
            return live * max(counts, default=0)
        out, left = [], list(counts)
        while any(left):
            for t in range(len(left)):
                if left[t]:
                    out.append(t)
                    left[t] -= 1
        return out

    def __len__(self) -> int:
        return len(self.order(self.epoch))

    def _pass(self, t: int, k: int) -> np.ndarray:
        """Task t's item order for its k-th pass of this epoch (k > 0 only when cycling)."""
        return self.items[t].indices(self.epoch, None if k == 0 else [self.seed, t, self.epoch, k])

    def __iter__(self) -> Iterator[list[int]]:
        counts, size = self.counts(), self.batch_sizes
        taken, passes = [0] * len(counts), {}
        handed = 0
        for t in self.order(self.epoch):
            k, j = divmod(taken[t], counts[t])
            taken[t] += 1
            handed += size[t]
            if handed <= self.position:
                continue
            if (t, k) not in passes:
                passes[(t, k)] = self._pass(t, k)
            self.position = handed
            batch = passes[(t, k)][j * size[t] : (j + 1) * size[t]]
            yield [int(i) + int(self.offsets[t]) for i in batch]

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
            "batch_size": self.batch_sizes[0] if len(set(self.batch_sizes)) == 1 else self.batch_sizes,
            "mode": self.mode,
        }

    def load_state_dict(self, state: dict) -> None:
        saved = (state["seed"], state["sizes"], state["world"], state["batch_size"], state["mode"])
        if saved != (self.seed, self.sizes, self.world, self.state_dict()["batch_size"], self.mode):
            raise ValueError(
                "sampler state was saved for another seed, data sizes, world size, batch size or task sampling"
            )
        self.epoch, self.position = state["epoch"], state["position"]
