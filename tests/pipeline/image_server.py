"""A real HTTP server on 127.0.0.1 serving generated images and hostile cases.

Every slow or endless response is bounded in time and bytes and stops when the client
goes away, so tests never hang on it.
"""

from __future__ import annotations

import io
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def half_red_image(size=(64, 48)) -> Image.Image:
    """Left half red, right half blue: orientation is visible in the pixels."""
    arr = np.zeros((size[1], size[0], 3), np.uint8)
    arr[:, : size[0] // 2] = (255, 0, 0)
    arr[:, size[0] // 2 :] = (0, 0, 255)
    return Image.fromarray(arr)


def make_corpus() -> dict[str, tuple[bytes, str]]:
    """name -> (bytes, content-type) for the good images."""
    base = half_red_image()
    rotated = base.transpose(Image.Transpose.ROTATE_90)  # stored sideways ...
    exif = Image.Exif()
    exif[0x0112] = 6  # ... with the tag that says "rotate 90 degrees clockwise to view"
    rgba = Image.new("RGBA", (40, 30), (255, 0, 0, 0))
    rgba.paste((0, 255, 0, 255), (0, 0, 20, 30))
    gif = [Image.new("P", (32, 32), i) for i in (10, 200)]
    gif_buf = io.BytesIO()
    gif[0].save(gif_buf, "GIF", save_all=True, append_images=gif[1:])
    i16 = Image.fromarray((np.arange(48 * 64, dtype=np.uint16).reshape(48, 64) * 20).astype(np.uint16))
    return {
        "rgb.jpg": (_encode(base, "JPEG", quality=95), "image/jpeg"),
        "rgb.png": (_encode(base, "PNG"), "image/png"),
        "rgb.webp": (_encode(base, "WEBP", lossless=True), "image/webp"),
        "anim.gif": (gif_buf.getvalue(), "image/gif"),
        "exif_rotated.jpg": (_encode(rotated, "JPEG", quality=95, exif=exif), "image/jpeg"),
        "cmyk.jpg": (_encode(base.convert("CMYK"), "JPEG", quality=95), "image/jpeg"),
        "gray.jpg": (_encode(base.convert("L"), "JPEG"), "image/jpeg"),
        "rgba.png": (_encode(rgba, "PNG"), "image/png"),
        "palette.png": (_encode(base.convert("P"), "PNG"), "image/png"),
        "sixteen.png": (_encode(i16, "PNG"), "image/png"),
        "big.jpg": (_encode(half_red_image((640, 480)), "JPEG", quality=90), "image/jpeg"),
        "octet.jpg": (_encode(base, "JPEG"), "application/octet-stream"),  # content is sniffed
    }


def make_hostile() -> dict[str, bytes]:
    good = make_corpus()["rgb.jpg"][0]
    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, "PNG")  # ~50 KB on the wire, 400 Mpixel decoded
    return {
        "truncated.jpg": good[: len(good) // 2],
        "bomb.png": bomb.getvalue(),
        "html": b"<!doctype html><html><body>Not found, but 200 OK</body></html>",
    }


class ImageServer:
    def __init__(self, delay: float = 0.0):
        self.corpus = make_corpus()
        self.hostile = make_hostile()
        self.delay = delay  # per good image, to make runs take time
        self.hits: Counter = Counter()
        self.slow_now = 0
        self.max_slow = 0  # most /slow/ requests being served at once
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                with server._lock:
                    server.hits[self.path] += 1
                    hits = server.hits[self.path]
                try:
                    server.route(self, hits)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- responses ------------------------------------------------------------
    @staticmethod
    def send(h, status: int, body: bytes = b"", ctype: str = "image/jpeg", headers: dict = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def route(self, h, hits: int) -> None:
        path = h.path.split("?")[0]
        good, ctype = self.corpus["rgb.jpg"]
        if path.startswith("/img/"):
            name = path[5:]
            if name not in self.corpus:
                return self.send(h, 404, b"no such image", "text/plain")
            time.sleep(self.delay)
            body, ctype = self.corpus[name]
            return self.send(h, 200, body, ctype)
        if path.startswith("/status/"):
            return self.send(h, int(path[8:]), b"error", "text/plain")
        if path.startswith("/flaky/"):  # /flaky/<n>/<key>: 500 for the first n hits
            n = int(path.split("/")[2])
            return self.send(h, 500, b"oops", "text/plain") if hits <= n else self.send(h, 200, good, ctype)
        if path.startswith("/busy/"):
            if hits == 1:
                return self.send(h, 429, b"slow down", "text/plain", {"Retry-After": "1"})
            return self.send(h, 200, good, ctype)
        if path == "/trickle":  # claims 100 KB, sends a byte every 0.2 s, for at most 20 s
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", str(100_000))
            h.end_headers()
            end = time.monotonic() + 20
            while time.monotonic() < end:
                h.wfile.write(b"\xff")
                h.wfile.flush()
                time.sleep(0.2)
            return
        if path == "/endless":  # no length, streams up to 256 MB or 20 s
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Connection", "close")
            h.end_headers()
            chunk = b"\xff\xd8\xff" + bytes(65533)
            end = time.monotonic() + 20
            for _ in range(4096):
                if time.monotonic() > end:
                    break
                h.wfile.write(chunk)
            return
        if path.startswith("/any/"):  # a good image under any (percent-encoded) name; hits keep the raw target
            return self.send(h, 200, good, ctype)
        if path == "/html-as-jpeg":
            return self.send(h, 200, self.hostile["html"], "image/jpeg")
        if path in ("/truncated.jpg", "/bomb.png"):
            return self.send(h, 200, self.hostile[path[1:]], "image/png")
        if path == "/loop":
            return self.send(h, 302, b"", "text/plain", {"Location": "/loop"})
        if path == "/loop-a":
            return self.send(h, 302, b"", "text/plain", {"Location": "/loop-b"})
        if path == "/loop-b":
            return self.send(h, 302, b"", "text/plain", {"Location": "/loop-a"})
        if path == "/redirect-ok":
            return self.send(h, 301, b"", "text/plain", {"Location": "/img/rgb.png"})
        if path == "/redirect-utf8":  # a Location header carrying raw UTF-8 bytes (as some servers send)
            return self.send(h, 302, b"", "text/plain", {"Location": "/any/caf\u00e9.jpg".encode().decode("latin-1")})
        if path == "/to-private":  # the cloud metadata address: must be refused unvisited
            return self.send(h, 302, b"", "text/plain", {"Location": "http://169.254.169.254/latest/meta-data/"})
        if path == "/noai":
            return self.send(h, 200, good, ctype, {"X-Robots-Tag": "noai"})
        if path == "/otherbot-noai":
            return self.send(h, 200, good, ctype, {"X-Robots-Tag": "googlebot: noai, noimageai"})
        if path.startswith("/slow/"):
            with self._lock:
                self.slow_now += 1
                self.max_slow = max(self.max_slow, self.slow_now)
            time.sleep(0.3)
            with self._lock:
                self.slow_now -= 1
            return self.send(h, 200, good, ctype)
        return self.send(h, 404, b"not found", "text/plain")


def write_tsv(path, urls) -> None:
    """A Conceptual-Captions-style TSV (caption, url) listing `urls`."""
    path.write_text("".join(f"caption {i}\t{u}\n" for i, u in enumerate(urls)))
