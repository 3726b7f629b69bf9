"""The region detectors' ROI head on a CPU: fast, and with sums that do not depend on the thread
count (`RoiHead`).

A CPU convolution's low bits depend on how many threads run it and on the batch it is part of:
oneDNN and MKL pick their kernels and split their work by both (measured on the VG R101: res4
differs by 1e-9 between 1 and 2 threads, a region's res5 feature by 1e-8 between a batch of 300
proposals and one of 8). A feature store and `vltrain predict`'s replay of its detector must agree
bit for bit, which used to pin `predict` to the thread count the store's actors ran with (one).

So here:

* Every kernel runs on one intra-op thread. The parallelism is over units of `UNIT` proposals
  (ROI pooling, res5, the mean over the map), run on `threads` worker threads (`Workers`), each at
  one intra-op thread. Every unit holds exactly `UNIT` maps (the last one padded with zeros), so
  every proposal goes through the same kernels whatever the thread count, the number of
  proposals or its neighbours: a region's feature depends on its own pooled map alone (a test
  checks this, and that 1, 2 and 3 threads agree bitwise).
* The head's convolutions go straight to oneDNN (`FusedBlocks`): each frozen batch norm folded
  into its convolution once (`Conv2dBN.forward` refolds at every call), the weights reordered
  once into oneDNN's layout for the unit's shape, channels-last activations, and the ReLUs and
  the residual add fused into the convolutions (``torch.ops.mkldnn._convolution_pointwise``: the
  kernels torch.compile's CPU backend emits). At one thread PyTorch's own dispatch sends a 1x1
  convolution of a small batch to im2col + BLAS, about half oneDNN's speed on AMD Zen 4. Without
  oneDNN the folded weights run through ``F.conv2d``: slower, as thread-invariant.

The backbone and the RPN run on the calling thread at one intra-op thread through the model's
own modules: their arithmetic, and so the proposals and the boxes, are those of a one-thread run
before this module existed (`vlprep extract`'s actors run with one thread by default).
"""

from __future__ import annotations

import os
import queue
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.detect.resnet import Bottleneck, Conv2dBN

UNIT = 10  # proposals per unit of the ROI head: 300 proposals = 30 units, the last one never padded
CHANNELS_LAST = torch.channels_last


def onednn() -> bool:
    """Whether the fused oneDNN convolutions are available in this torch build."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


@contextmanager
def one_thread() -> Iterator[int]:
    """Torch at one intra-op thread on the calling thread while inside; yields the count it had."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield saved
    finally:
        torch.set_num_threads(saved)


def cpu_threads() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


class Workers:
    """`count` long-lived daemon threads running torch at one intra-op thread each. `map` runs a
    function over items on them and returns the results in order (the first error is raised)."""

    def __init__(self, count: int):
        self.count, self.pid = count, os.getpid()
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        ready = threading.Barrier(count + 1)
        caller_threads = torch.get_num_threads()
        for _ in range(count):
            threading.Thread(target=self._serve, args=(ready,), daemon=True, name="roi-head").start()
        ready.wait()
        # A worker's torch.set_num_threads also set the count that threads started later begin
        # with; give it back the caller's (the caller's own count never changed).
        torch.set_num_threads(caller_threads)

    def _serve(self, ready: threading.Barrier) -> None:
        torch.get_num_threads()  # torch's lazy per-thread initialization first, then one thread
        torch.set_num_threads(1)
        ready.wait()
        while True:
            fn, item, slot, done = self._tasks.get()
            try:
                with torch.no_grad():  # grad mode is per thread
                    slot.append((True, fn(item)))
            except BaseException as err:  # handed to the caller
                slot.append((False, err))
            done.release()

    def map(self, fn: Callable, items: Sequence) -> list:
        done = threading.Semaphore(0)
        slots: list[list] = [[] for _ in items]
        for item, slot in zip(items, slots):
            self._tasks.put((fn, item, slot, done))
        for _ in items:
            done.acquire()
        out = []
        for ((ok, value),) in slots:
            if not ok:
                raise value
            out.append(value)
        return out


_WORKERS: dict[int, Workers] = {}
_WORKERS_LOCK = threading.Lock()


def workers(count: int) -> Workers:
    """This process's pool of `count` workers (made on first use; a forked child makes its own)."""
    with _WORKERS_LOCK:
        pool = _WORKERS.get(count)
        if pool is None or pool.pid != os.getpid():
            pool = _WORKERS[count] = Workers(count)
        return pool


def run_units(fn: Callable, items: Sequence, threads: int) -> list:
    """`fn` over `items` on `threads` workers at one intra-op thread each (inline, on the calling
    thread at one intra-op thread, when `threads` is 1 or there is a single item)."""
    if threads <= 1 or len(items) <= 1:
        with one_thread(), torch.no_grad():
            return [fn(item) for item in items]
    return workers(min(threads, len(items))).map(fn, items)


def folded(conv: Conv2dBN) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a `Conv2dBN` with its frozen norm folded in, as its eval forward folds it."""
    norm = conv.norm
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    return (conv.weight * scale.view(-1, 1, 1, 1)).contiguous(), (norm.bias - norm.running_mean * scale).contiguous()


class FusedConv:
    """One convolution with its weights prepared once: reordered for oneDNN for inputs of
    `input_size` (N, C, H, W) (any size still runs), or kept for ``F.conv2d`` without oneDNN.
    ``conv(x, relu=True)`` fuses the ReLU; ``conv(x, add=y)`` adds `y` then applies the ReLU."""

    def __init__(self, conv: nn.Conv2d, input_size: Optional[Sequence[int]] = None):
        if isinstance(conv, Conv2dBN):
            weight, bias = folded(conv)
        else:
            weight, bias = conv.weight.contiguous(), (conv.bias if conv.bias is not None else None)
        self.padding, self.stride = list(conv.padding), list(conv.stride)
        self.dilation, self.groups = list(conv.dilation), conv.groups
        self.bias = None if bias is None else bias.detach().contiguous()
        self.fused = onednn()
        weight = weight.detach()
        if self.fused:
            size = None if input_size is None else [int(s) for s in input_size]
            weight = torch.ops.mkldnn._reorder_convolution_weight(
                weight, self.padding, self.stride, self.dilation, self.groups, size
            )
        self.weight = weight

    def __call__(self, x: torch.Tensor, relu: bool = False, add: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.fused:
            args = (self.weight, self.bias, self.padding, self.stride, self.dilation, self.groups)
            if add is not None:
                return torch.ops.mkldnn._convolution_pointwise.binary(
                    x, add, *args, "add", 1.0, "relu" if relu else None, [], ""
                )
            return torch.ops.mkldnn._convolution_pointwise(x, *args, "relu" if relu else "none", [], "")
        y = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        if add is not None:
            y = y.add_(add)
        return F.relu_(y) if relu else y


def _conv_output(conv: nn.Conv2d, size: Sequence[int]) -> list[int]:
    n, _, h, w = size
    return [n, conv.out_channels] + [
        (s + 2 * p - d * (k - 1) - 1) // st + 1
        for s, p, d, k, st in zip((h, w), conv.padding, conv.dilation, conv.kernel_size, conv.stride)
    ]


class FusedBlocks:
    """A sequence of `Bottleneck`s (a ResNet stage) as `FusedConv`s for inputs of `input_size`:
    channels-last in and out; each block's first two ReLUs fused into their convolutions, its
    residual add and last ReLU into its third."""

    def __init__(self, blocks: Sequence[Bottleneck], input_size: Sequence[int]):
        self.blocks = []
        size = list(input_size)
        for block in blocks:
            mid = _conv_output(block.conv1, size)
            out = _conv_output(block.conv2, mid)
            self.blocks.append(
                (
                    FusedConv(block.conv1, size),
                    FusedConv(block.conv2, mid),
                    FusedConv(block.conv3, out),
                    None if block.shortcut is None else FusedConv(block.shortcut, size),
                )
            )
            size = _conv_output(block.conv3, out)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous(memory_format=CHANNELS_LAST)
        for conv1, conv2, conv3, shortcut in self.blocks:
            out = conv2(conv1(x, relu=True), relu=True)
            x = conv3(out, relu=True, add=x if shortcut is None else shortcut(x))
        return x


def _weights_key(module: nn.Module) -> tuple:
    """Changes when any parameter or buffer of `module` is replaced or changed in place."""
    return tuple((t.data_ptr(), t._version) for t in (*module.parameters(), *module.buffers()))


class RoiHead:
    """Pooled region features of proposals on a CPU, `UNIT` proposals at a time on worker threads
    (see the module doc). `pool(fmap, boxes)` gives the (u, C, r, r) maps of up to `UNIT` boxes
    (ROI pooling of the backbone's (1, C, h, w) map); `stage` is the ResNet stage run on them (res5:
    a `nn.Sequential` of `Bottleneck`s), whose output is averaged over the map. The stage's weights
    are prepared on first use and again whenever they change."""

    def __init__(self, stage: nn.Sequential, channels: int, resolution: int, pool: Callable):
        self.stage, self.pool = stage, pool
        self.input_size = (UNIT, channels, resolution, resolution)
        self._prepared: Optional[tuple[tuple, Callable]] = None

    def _blocks(self) -> Callable:
        key = _weights_key(self.stage)
        if self._prepared is None or self._prepared[0] != key:
            self._prepared = (key, FusedBlocks(list(self.stage), self.input_size))
        return self._prepared[1]

    def __call__(self, fmap: torch.Tensor, boxes: torch.Tensor, threads: int) -> torch.Tensor:
        """(R, C5) float32 mean-pooled stage outputs of `boxes` (R, 4) over `fmap` (1, C, h, w)."""
        blocks = self._blocks()
        fmap = fmap.float().contiguous()
        boxes = boxes.float()

        def unit(start: int) -> torch.Tensor:
            chosen = boxes[start : start + UNIT]
            maps = self.pool(fmap, chosen)
            if len(chosen) < UNIT:  # always the same kernels: pad to a whole unit
                maps = torch.cat([maps, maps.new_zeros((UNIT - len(chosen), *maps.shape[1:]))])
            return blocks(maps).mean(dim=(2, 3))[: len(chosen)]

        starts = list(range(0, len(boxes), UNIT))
        if not starts:
            return fmap.new_zeros((0, self.stage[-1].conv3.out_channels))
        return torch.cat(run_units(unit, starts, threads))
