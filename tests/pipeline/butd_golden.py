"""BUTD extraction outputs pinned bit for bit (`tests/pipeline/data/butd_golden.npz`).

The fixture was written by `outputs()` with the code as it was before extraction gained its
backend seam (`pipeline/detect/backends/`): the packaged shapes detector (trained weights, so
boxes and labels mean something) and the random `tiny` detector, each policy, both resize
conventions, given boxes, batches of one and of three, on one thread. `test_backends.py` runs
`outputs()` again: through the model's own modules (``kernels="torch"``) every array is equal bit
for bit; through the fast CPU ROI head (``kernels="fast"``, the default on a CPU since its
arithmetic changed: `pipeline.detect.cpu`) the labels, counts and proposal boxes are equal and
every float within the store's float16 rounding. Regenerate only when a change is *meant* to move
BUTD's outputs: ``python tests/pipeline/butd_golden.py --write``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

FIXTURE = Path(__file__).parent / "data" / "butd_golden.npz"


def images() -> list[np.ndarray]:
    from pipeline.synthetic.render import render
    from pipeline.synthetic.scenes import generate_scene

    rng = np.random.default_rng(7)
    scenes = [np.asarray(render(generate_scene(rng, size=size)).convert("RGB")) for size in (256, 320)]
    noise = np.random.default_rng(8).integers(0, 256, (150, 230, 3), dtype=np.uint8)
    return scenes + [noise]


GIVEN = [
    np.array([[10, 12, 120, 90], [0, 0, 255, 255], [40.5, 60.25, 41.5, 200]], np.float32),
    np.array([[5, 5, 300, 310], [100, 20, 180, 64]], np.float32),
    np.array([[0, 0, 229, 149]], np.float32),
]


def runs(kernels: str = "torch", threads=None):
    """(name, extractor, given boxes or None, batch size) of every pinned run, on `kernels`
    (and the fast path's `threads`)."""
    from pipeline.detect.backends import open_extractor
    from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
    from pipeline.detect.config import BoxCount, SelectionConfig

    def butd(detector, weights=None, policy="butd", boxes="10-100", preprocess="caffe"):
        return open_extractor(
            detector,
            weights,
            seed=0,
            selection=SelectionConfig(policy, BoxCount.parse(boxes)),
            preprocess=preprocess,
            kernels=kernels,
            threads=threads,
        )

    shapes = shapes_tiny_weights()
    return [
        ("shapes-butd", butd("shapes-tiny", shapes), None, 1),
        ("shapes-butd36-batched", butd("shapes-tiny", shapes, boxes="36"), None, 3),
        ("shapes-maxnms", butd("shapes-tiny", shapes, policy="maxnms", boxes="5-20"), None, 1),
        ("shapes-d2", butd("shapes-tiny", shapes, preprocess="detectron2"), None, 1),
        ("shapes-given", butd("shapes-tiny", shapes), GIVEN, 1),
        ("tiny-random", butd("tiny"), None, 1),
        ("tiny-random-maxnms-d2", butd("tiny", policy="maxnms", boxes="36", preprocess="detectron2"), None, 3),
    ]


def outputs(kernels: str = "torch", threads=None) -> dict[str, np.ndarray]:
    """Every pinned run's records, flattened to ``"<run>/<image>/<field>" -> array``, torch at one
    thread (the fast path's ROI head on `threads` workers: None, one)."""
    pictures = images()
    out: dict[str, np.ndarray] = {}
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, extractor, given, batch in runs(kernels, threads):
            for start in range(0, len(pictures), batch):
                chunk = list(range(start, min(start + batch, len(pictures))))
                records = extractor(
                    [pictures[i] for i in chunk],
                    [f"img{i}" for i in chunk],
                    given_boxes=None if given is None else [given[i] for i in chunk],
                )
                for i, rec in zip(chunk, records):
                    for field, value in rec.array_fields().items():
                        out[f"{name}/img{i}/{field}"] = value
    finally:
        torch.set_num_threads(saved)
    return out


if __name__ == "__main__" and "--write" in sys.argv:
    FIXTURE.parent.mkdir(exist_ok=True)
    np.savez_compressed(FIXTURE, **outputs())
    print(f"wrote {FIXTURE}")
