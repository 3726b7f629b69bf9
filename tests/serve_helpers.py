"""Helpers of the `vlprep serve` tests (tests/serve/): HTTP on 127.0.0.1 with the standard library
(raw paths: nothing is re-encoded, so a trick reaches the server as written), multipart bodies,
and the shapes site: a world extracted as the demo extracts it, its task datasets and mixture, a
small fine-tuned VQA + RefCOCO+ run."""

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit


class Reply:
    def __init__(self, status: int, headers: dict, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)


def fetch(url: str, path: str, method: str = "GET", body: bytes = b"", headers: dict = None) -> Reply:
    """One request to the app at `url` (a raw path: nothing re-encoded, so tricks reach the server)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def multipart(fields: dict, files: dict) -> tuple[bytes, str]:
    """A multipart/form-data body (fields: name -> text; files: name -> (file name, bytes))."""
    boundary = "----vlprep-serve-test-boundary"
    out = []
    for name, value in fields.items():
        out.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    for name, (filename, data) in files.items():
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
        out.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n")
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


def build_shapes_site(root: Path) -> Path:
    """A 12-scene shapes world extracted as the demo extracts it (served on 127.0.0.1, the real
    download path, the committed shapes detector), the world's VQA and RefCOCO+ task datasets, a
    captions + questions mixture, and a 4-step lxmert-tiny fine-tuning run of both tasks (validated,
    so it has a best checkpoint)."""
    from helpers import extract_shapes_world
    from train_helpers import finetune_config

    from vl_models import transfer
    from vl_models.demo import TRANSFER_FILES, VQA_MIN_COUNT, make_mixture
    from vl_models.transfer.build import build_task
    from vl_models.transfer.finetune import run_finetune

    world = extract_shapes_world(root, 12)
    for name in ("vqa", "refcoco+"):
        build_task(
            transfer.get(name),
            [world / "annotations" / f for f in TRANSFER_FILES[name]],
            root / "tasks" / name,
            image_map=world / "image_map.tsv",
            min_count=VQA_MIN_COUNT if name == "vqa" else None,
        )
    make_mixture(world, root / "features", root / "mixture", ("coco_captions", "vqa"))
    run_finetune(
        finetune_config(
            root / "tasks",
            root / "run",
            ("vqa", "refcoco+"),
            stores=(str(root / "features"),),
            steps=4,
            max_regions=20,
            max_text=24,
            checkpoint_every=2,
            eval_every=2,
        )
    )
    return root
