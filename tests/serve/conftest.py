"""Fixtures of the `vlprep serve` tests."""

from pathlib import Path

import pytest
from serve_helpers import build_shapes_site


@pytest.fixture(scope="module")
def shapes_site(tmp_path_factory) -> Path:
    return build_shapes_site(tmp_path_factory.mktemp("serve-site"))
