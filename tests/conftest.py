"""Shared fixtures, and how the suite shares the machine's cores."""

import os

import numpy as np
import pytest

# Under pytest-xdist each worker gets its share of the cores for torch's and OpenMP's thread
# pools (the commands the tests start inherit it): N workers with a pool of every core each
# would oversubscribe the machine N times over. Set before anything imports torch.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
# The commands the tests run in this process (`helpers.run_cli`) print as they do in a
# subprocess of a 200-column, colourless terminal: rich reads both when its consoles are made.
os.environ.update(COLUMNS="200", NO_COLOR="1")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


# The scopes that take longest, longest first: they go to the pytest-xdist workers before the
# rest (`.ci/run` passes --no-loadscope-reorder, so the work queue is in collection order), so
# that no long file is left to start last on one core. Within a file the order is kept. A
# worker holds two scopes at a time, so short files come right after the demo: the one that
# waits behind it costs nothing.
LONGEST_FIRST = (
    "tests/vl_models/test_demo.py::TestQuickDemo",
    "tests/test_errors.py",
    "tests/pipeline/test_config.py",
    "tests/pipeline/test_extract.py",
    "tests/pipeline/test_download.py",
    "tests/vl_models/test_trainer.py",
    "tests/pipeline/test_ray_cluster.py",
    "tests/vl_models/test_multinode.py",
    "tests/vl_models/test_learning.py",
    "tests/pipeline/test_detect_fidelity.py",
    "tests/pipeline/test_detect.py",
    "tests/vl_models/test_transfer.py",
    "tests/vl_models/test_runs.py",
    "tests/serve/test_serve_site.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))

    items.sort(key=rank)
