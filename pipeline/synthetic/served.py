"""A world served over HTTP on 127.0.0.1, so that `vlprep extract --dataset conceptual_captions`
fetches its images through the real download path: a static file server of the world's folder
(a free port, a daemon thread) and its Conceptual Captions TSVs pointed at it."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.synthetic.world import write_cc_tsvs


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextmanager
def served(world: Path) -> Iterator[str]:
    """Serve the folder `world` on 127.0.0.1 for the `with` block, its Conceptual Captions TSVs
    (re)written for that address; yields the base URL (``http://127.0.0.1:PORT``)."""
    handler = functools.partial(_QuietHandler, directory=str(world))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base_url = f"http://127.0.0.1:{server.server_address[1]}"
        write_cc_tsvs(world, base_url)
        yield base_url
    finally:
        server.shutdown()
