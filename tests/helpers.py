"""Test helpers: synthetic region-feature records in the canonical layout."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Optional

import numpy as np

from pipeline.distribute import RAY_AUTH_NOTICE_LOGGER
from pipeline.records import RegionFeatures, labels_from_probs

REPO = Path(__file__).resolve().parents[1]


def make_record(
    rng: np.random.Generator,
    image_id: str,
    num_boxes: int = 5,
    feature_dim: int = 32,
    cls_dim: Optional[int] = 11,
    attr_dim: Optional[int] = 7,
    labels: bool = True,
    size: tuple[int, int] = (480, 640),
) -> RegionFeatures:
    """A valid record with random values; labels derived from the probabilities as the
    reference extractors do."""
    h, w = size
    x1 = rng.uniform(0, w / 2, num_boxes)
    y1 = rng.uniform(0, h / 2, num_boxes)
    boxes = np.stack([x1, y1, x1 + rng.uniform(1, w / 2, num_boxes), y1 + rng.uniform(1, h / 2, num_boxes)], 1)

    def probs(dim):
        p = rng.random((num_boxes, dim)).astype(np.float32)
        return p / p.sum(1, keepdims=True)

    cls_prob = probs(cls_dim) if cls_dim else None
    attr_prob = probs(attr_dim) if attr_dim else None
    fields = dict(
        image_id=image_id,
        image_h=h,
        image_w=w,
        boxes=boxes.astype(np.float32),
        features=(rng.standard_normal((num_boxes, feature_dim)) * 3).astype(np.float32),
        cls_prob=cls_prob,
        attr_prob=attr_prob,
    )
    if labels:
        if cls_prob is not None:
            fields["objects_id"], fields["objects_conf"] = labels_from_probs(cls_prob)
        else:
            fields["objects_id"] = rng.integers(0, 1600, num_boxes)
            fields["objects_conf"] = rng.random(num_boxes).astype(np.float32)
        if attr_prob is not None:
            fields["attrs_id"], fields["attrs_conf"] = labels_from_probs(attr_prob)
        else:
            fields["attrs_id"] = rng.integers(0, 400, num_boxes)
            fields["attrs_conf"] = rng.random(num_boxes).astype(np.float32)
    return RegionFeatures(**fields)


def make_records(count: int, seed: int = 0, **kwargs) -> list[RegionFeatures]:
    rng = np.random.default_rng(seed)
    return [make_record(rng, f"img_{seed}_{i:05d}", num_boxes=int(rng.integers(1, 12)), **kwargs) for i in range(count)]


def assert_same_record(a: RegionFeatures, b: RegionFeatures, exact: bool = True) -> None:
    """Field by field equality; float16-stored tables compared within float16 precision."""
    assert a.image_id == b.image_id and a.image_h == b.image_h and a.image_w == b.image_w
    fa, fb = a.array_fields(), b.array_fields()
    assert fa.keys() == fb.keys(), (a.image_id, sorted(fa), sorted(fb))
    for name in fa:
        x, y = np.asarray(fa[name]), np.asarray(fb[name])
        assert x.shape == y.shape, (a.image_id, name, x.shape, y.shape)
        if exact or x.dtype.kind in "iu":
            assert np.array_equal(x.astype(y.dtype) if x.dtype.kind in "iu" else x, y), (a.image_id, name)
        else:
            np.testing.assert_allclose(x.astype(np.float32), y.astype(np.float32), rtol=1e-3, atol=1e-3, err_msg=name)


# The commands that start Ray: in this process they share the worker's one Ray (`shared_ray`).
RAY_COMMANDS = {"download", "extract"}


def run_cli(
    *args: str,
    cwd: Optional[Path] = None,
    check: bool = False,
    timeout: int = 300,
    exe: Optional[Path] = None,
    fresh: bool = False,
    tool: str = "vlprep",
    **popen,
) -> subprocess.CompletedProcess:
    """`vlprep ARGS` (or `vltrain ARGS` with ``tool="vltrain"``), with its exit code, stdout and
    stderr. By default in this process through Typer's `CliRunner` (no interpreter start, no
    torch import, the worker's one Ray: what a flag, exit-code or output test needs);
    `fresh=True` (or `exe`, the executable to run, or keyword arguments for `subprocess.run`
    such as ``preexec_fn``) in a real subprocess of ``python -m pipeline.cli`` / ``vl_models.cli``:
    for what only a process of its own shows (its whole output, Ray's own start-up, signals,
    resource limits, a timeout)."""
    args = tuple(map(str, args))
    if fresh or exe or popen:
        command = [str(exe)] if exe else [sys.executable, "-m", TOOLS[tool]]
        proc = subprocess.run(
            [*command, *args],
            capture_output=True,
            text=True,
            cwd=cwd or REPO,
            timeout=timeout,  # the environment is the suite's: 200 columns, no colour (tests/conftest.py)
            **popen,
        )
    else:
        proc = _invoke(tool, args, cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_vltrain(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """`vltrain ARGS`, as `run_cli` runs `vlprep`."""
    return run_cli(*args, tool="vltrain", **kwargs)


def extract_args(
    out,
    *,
    images=None,
    dataset: Optional[str] = None,
    input=None,
    weights=None,
    detector: Optional[str] = "tiny",
    **flags,
) -> list[str]:
    """`vlprep extract`'s arguments, for `run_cli` or a process of its own: the source
    (``--images`` folder, or a `dataset` reader's ``--input`` file), ``--weights`` (None:
    ``--random-weights``), ``--detector`` (None: the default), ``--out``; then each keyword is
    its flag: ``shard_size=4`` is ``--shard-size 4``, True the bare flag, None or False none."""
    args = ["extract"]
    if images is not None:
        args += ["--images", images]
    if dataset is not None:
        args += ["--dataset", dataset, "--input", input]
    args += ["--weights", weights] if weights is not None else ["--random-weights"]
    if detector is not None:
        args += ["--detector", detector]
    args += ["--out", out]
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not None and value is not False:
            args += [flag, value]
    return [str(a) for a in args]


TOOLS = {"vlprep": "pipeline.cli", "vltrain": "vl_models.cli"}  # each command's module (python -m)


def _invoke(tool: str, args: tuple[str, ...], cwd: Optional[Path]) -> subprocess.CompletedProcess:
    """`TOOL ARGS` in this process: what a subprocess would report (an uncaught exception is
    exit 1 with its traceback on stderr); the logging set-up and working folder restored."""
    from typer.testing import CliRunner

    if tool == "vlprep":
        from pipeline.cli import app, load_plugins

        load_plugins()
    else:
        from vl_models.cli import app  # its commands complete their own arguments (`vl_models.flags.command_args`)
    if tool == "vlprep" and args and args[0] in RAY_COMMANDS:
        shared_ray()
    root = logging.getLogger()
    handlers, level, here = root.handlers[:], root.level, os.getcwd()
    try:
        os.chdir(cwd or REPO)
        result = CliRunner().invoke(app, list(args))
    finally:
        os.chdir(here)
        root.handlers[:] = handlers
        root.setLevel(level)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess([tool, *args], result.exit_code, result.stdout, stderr)


def shared_ray() -> None:
    """This process's local Ray (2 CPUs), started once: the in-process commands use it as a
    user's driver would use a running one (`ray_session` leaves a Ray it did not start)."""
    import ray

    if not ray.is_initialized():
        logging.getLogger(RAY_AUTH_NOTICE_LOGGER).setLevel(logging.ERROR)
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False
        )


def extract_shapes_world(root: Path, scenes: int) -> Path:
    """A `scenes`-scene shapes world under ``root/world`` (a quarter held out) extracted into
    ``root/features`` as the demo extracts it: served on 127.0.0.1, through the real download
    path, with the committed shapes detector (10-20 regions, on the shared Ray). Returns the
    world's folder."""
    from pipeline.detect.backends.butd_c4.weights import shapes_tiny_weights
    from pipeline.detect.config import BoxCount, ExtractConfig, SelectionConfig
    from pipeline.detect.run import run_extract
    from pipeline.distribute import DistributeConfig
    from pipeline.download.fetch import FetchConfig
    from pipeline.synthetic import served, write_world

    world = root / "world"
    write_world(world, scenes, 0, val_fraction=0.25)
    shared_ray()
    with served(world):
        run_extract(
            ExtractConfig(
                out=root / "features",
                dataset="conceptual_captions",
                inputs=(world / "Train_GCC-training.tsv", world / "Validation_GCC-1.1.0-Validation.tsv"),
                weights=shapes_tiny_weights(),
                detector="shapes-tiny",
                selection=SelectionConfig("butd", BoxCount.parse("10-20")),
                batch_size=4,
                device="cpu",
                distribute=DistributeConfig(shard_size=8, workers=2),
                fetch=FetchConfig(allow_private_network=True),
            )
        )
    return world


def no_shared_ray() -> None:
    """Stop this process's shared Ray (for a test of how a run starts and stops its own)."""
    import ray

    ray.shutdown()


def process_tree(pid: int) -> list[int]:
    """`pid` and every process under it (from /proc: parent of each process)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    tree = [pid]
    for p in tree:
        tree.extend(children.get(p, []))
    return tree


def command_lines(pids: list[int]) -> dict[int, str]:
    """pid -> its command line (processes that ended meanwhile are left out)."""
    out = {}
    for pid in pids:
        try:
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_reference(name: str):
    """A fixture generator of tests/reference/ as a module (under another name than the reference
    packages some of them share a name with): its `fill`, `images`, `published_checkpoint`, ..."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_reference", REPO / "tests" / "reference" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
