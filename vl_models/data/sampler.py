"""A resumable, deterministic, rank-partitioned sampler.

Epoch e visits the permutation of `seed + e`; rank r of w takes positions r, r+w, ... of
it (the tail is cut so every rank gets the same count). Its position is part of the
checkpoint: after `load_state_dict`, iteration continues with the next unseen index, so a
resumed run neither repeats nor skips items.
"""

from __future__ import annotations

from typing import Iterator

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
        order = np.random.default_rng(self.seed + epoch).permutation(self.size) if self.shuffle else np.arange(self.size)
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
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "size": self.size, "world": self.world}

    def load_state_dict(self, state: dict) -> None:
        if (state["seed"], state["size"], state["world"]) != (self.seed, self.size, self.world):
            raise ValueError("sampler state was saved for another seed, data size or world size")
        self.epoch, self.position = state["epoch"], state["position"]
