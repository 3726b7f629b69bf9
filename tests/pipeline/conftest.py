"""Fixtures of the pipeline tests."""

import pytest
from image_server import ImageServer


@pytest.fixture(scope="module")
def server():
    """A real HTTP server on 127.0.0.1 with generated images and hostile cases."""
    srv = ImageServer()
    yield srv
    srv.close()
