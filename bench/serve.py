"""`vlprep serve` latency: each page and each kind of ask, p50 / p95 in ms, with 1 client and with
8 parallel clients (each client a thread sending its requests one after the other over HTTP on
127.0.0.1; the server is the real app under uvicorn, in this process).

On a `vlprep demo` folder (its store, task datasets, mixtures and runs; the world's images):

  pages   home, the gallery (page 1 and a deep page), a filtered gallery page (object, confidence),
          an image's page (regions and its items in every task and mixture), a thumbnail, an image
          file, the store's card, a task dataset's page, a run's page, its curves (drawn once, then
          cached)
  asks    a VQA question about a store's image (features from the store), a RefCOCO+ expression,
          an upload of a scene the model has not seen (the detector runs), the same upload again
          (its features reused)

and on a simulated store of a million records (`write_million`: a manifest of 1,000 shards, its id
index, and only the shards a page reads), the gallery's first and a deep page and a filtered page:
a page reads its records only, so it costs what it costs on the demo's 400.

Every row is warmed first (a page once; a store image's ask twice over all its queries: the
first passes load the model and pay the allocations of each text length). Asks go one at a time
through the server's lock, so 8 clients queue: their p50 is about 8 asks' time.

    python bench/serve.py --site vlprep_demo                 # after `vlprep demo --quick`
    python bench/serve.py --site vlprep_demo --requests 40 --out serve-bench.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.io import sha256_file  # noqa: E402
from pipeline.store.arrow_shard import arrow_schema  # noqa: E402
from pipeline.store.index import IdIndex  # noqa: E402
from pipeline.store.layout import ProbStorage, StoreLayout  # noqa: E402
from pipeline.store.manifest import SHARDS_DIR, Manifest, ShardInfo, now_iso  # noqa: E402

MILLION, SHARD_ROWS = 1_000_000, 1_000


def million_id(i: int) -> str:
    return f"COCO_train2014_{i:012d}"


def write_million(root: Path, present=(0, 1, 2, 479, 999), records: int = MILLION, rows: int = SHARD_ROWS) -> None:
    """A store of `records` one-region records (object id i % 7, confidence 0.9) in shards of
    `rows`: its manifest, its id index, and the files of the `present` shards only (the others
    are listed with 0 bytes: a page that opened one would fail, naming it)."""
    layout = StoreLayout(feature_dim=1, cls_prob=ProbStorage("none"), attr_prob=ProbStorage("none"))
    schema = arrow_schema(layout)
    (root / SHARDS_DIR).mkdir(parents=True)
    shards = []
    for number in range(records // rows):
        name, start = f"{number:05d}.arrow", number * rows
        if number not in present:
            shards.append(ShardInfo(name, rows, 0, "0" * 64, now_iso()))
            continue
        ones = np.arange(rows + 1, dtype=np.int32)
        arrays = [
            pa.array([million_id(i) for i in range(start, start + rows)], pa.string()),
            pa.array(np.full(rows, 480, np.int32)),
            pa.array(np.full(rows, 640, np.int32)),
            pa.array(np.ones(rows, np.int32)),
            pa.ListArray.from_arrays(pa.array(ones * 4), pa.array(np.tile(np.float32([10, 20, 300, 400]), rows))),
            pa.ListArray.from_arrays(pa.array(ones), pa.array(np.ones(rows, np.float16))),
            pa.ListArray.from_arrays(pa.array(ones), pa.array((np.arange(start, start + rows) % 7).astype(np.int32))),
            pa.ListArray.from_arrays(pa.array(ones), pa.array(np.full(rows, 0.9, np.float32))),
        ]
        arrays += [pa.nulls(rows, f.type) for f in list(schema)[len(arrays) :]]
        path = root / SHARDS_DIR / name
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
        shards.append(ShardInfo(name, rows, path.stat().st_size, sha256_file(path), now_iso()))
    manifest = Manifest(layout=layout, shards=shards)
    manifest.write(root)
    keys = ((million_id(i).encode() for i in range(s * rows, (s + 1) * rows)) for s in range(records // rows))
    IdIndex.build(keys, records, manifest.shards_digest()).write(root)


def request(url: str, path: str, body: bytes = b"", headers: dict = None) -> tuple[int, float]:
    import http.client

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    started = time.perf_counter()
    try:
        conn.request("POST" if body else "GET", path, body=body or None, headers=headers or {})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - started
    finally:
        conn.close()


def measure(url: str, make, count: int, clients: int) -> dict:
    """`count` requests (make(i) -> (path, body, headers)) from `clients` threads: p50, p95, req/s."""
    times: list = [None] * count
    failures = []

    def client(n: int) -> None:
        for i in range(n, count, clients):
            path, body, headers = make(i)
            status, seconds = request(url, path, body, headers)
            times[i] = seconds
            if status >= 400:
                failures.append((path, status))

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    if failures:
        raise SystemExit(f"requests failed: {failures[:3]}")
    ms = sorted(t * 1000 for t in times)
    return {
        "p50": statistics.median(ms),
        "p95": ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))],
        "per_s": count / wall,
    }


def multipart(fields: dict, name: str, data: bytes) -> tuple[bytes, dict]:
    boundary = "----vlprep-bench"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode() for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n\r\n'.encode()
        + data
        + b"\r\n"
        + f"--{boundary}--\r\n".encode()
    )
    return b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=Path, default=Path("vlprep_demo"), help="a vlprep demo folder")
    parser.add_argument("--requests", type=int, default=48, help="requests per measurement")
    parser.add_argument("--clients", type=int, default=8, help="parallel clients of the second measurement")
    parser.add_argument("--out", type=Path, help="also write the table (Markdown) here")
    args = parser.parse_args()

    import torch

    from pipeline.task_data import TaskData
    from vl_models.serve.app import Running, make_app
    from vl_models.serve.site import open_site

    site_dir = args.site
    if not (site_dir / "features" / "manifest.json").is_file():
        raise SystemExit(f"{site_dir}: not a vlprep demo folder (run `vlprep demo --quick --out {site_dir}` first)")
    site = open_site([site_dir / "features"], [site_dir], [site_dir], [site_dir / "world"])
    vqa_run = next(n for n in site.runs if n.startswith("transfer-lxmert-vqa-pretrained"))
    ref_run = next(n for n in site.runs if n.startswith("transfer-lxmert-refcoco+-pretrained"))
    store = next(iter(site.stores))
    vqa = TaskData.open(site_dir / "tasks" / "vqa")
    refs = TaskData.open(site_dir / "tasks" / "refcoco+")
    questions = [(vqa.images(int(r))[0], vqa.column("text")[int(r)]) for r in vqa.rows("val")[:64]]
    expressions = [(refs.images(int(r))[0], refs.column("text")[int(r)]) for r in refs.rows("val")[:64]]
    scenes = sorted((site_dir / "world" / "images").glob("shapes_train_*.jpg"))
    total = len(site.stores[store].store)
    deep = max(1, total // 24 - 1)
    key = questions[0][0]
    pages = {
        "home": "/",
        "gallery, page 1": f"/stores/{store}",
        f"gallery, page {deep}": f"/stores/{store}?page={deep}",
        "gallery, filtered (circle, conf >= 0.5)": f"/stores/{store}?object=circle&min_conf=0.5",
        "image page (regions + task items)": f"/stores/{store}/image?id={key}",
        "thumbnail": f"/stores/{store}/thumb?id={key}",
        "image file": f"/stores/{store}/file?id={key}",
        "store card": f"/stores/{store}/card",
        "task page (vqa)": "/tasks/tasks-vqa",
        "run page": f"/runs/{vqa_run}",
        "run curves (cached)": f"/runs/{vqa_run}/curves.png",
    }
    rows = []
    with Running(make_app(site)) as running:
        url = running.url
        for name, path in pages.items():
            request(url, path)  # warm: templates compiled, readers opened, the curves drawn once
            one = measure(url, lambda i, p=path: (p, b"", {}), args.requests, 1)
            many = measure(url, lambda i, p=path: (p, b"", {}), args.requests, args.clients)
            rows.append((name, one, many))
            print(name, one, many, flush=True)

        def ask_store(i):
            image, text = questions[i % len(questions)]
            fields = {"run": vqa_run, "store": store, "image_id": image, "kind": "question", "text": text}
            return "/api/ask", json.dumps(fields).encode(), {"Content-Type": "application/json"}

        def ask_ref(i):
            image, text = expressions[i % len(expressions)]
            fields = {"run": ref_run, "store": store, "image_id": image, "kind": "expression", "text": text}
            return "/api/ask", json.dumps(fields).encode(), {"Content-Type": "application/json"}

        used = {"n": 0}
        lock = threading.Lock()

        def ask_new_upload(i):  # a scene not asked about before: the detector runs
            with lock:
                n = used["n"]
                used["n"] += 1
            data = scenes[n % len(scenes)].read_bytes() + b"\0" * (n // len(scenes))  # new bytes: a new image
            body, headers = multipart(
                {"run": vqa_run, "kind": "question", "text": "what color is the circle?"}, "s.jpg", data
            )
            return "/api/ask", body, headers

        same = scenes[0].read_bytes()

        def ask_same_upload(i):
            body, headers = multipart({"run": vqa_run, "kind": "question", "text": "how many shapes?"}, "s.jpg", same)
            return "/api/ask", body, headers

        asks = {
            "ask: question, store image": ask_store,
            "ask: expression, store image": ask_ref,
            "ask: question, new upload (detector runs)": ask_new_upload,
            "ask: question, same upload again (features reused)": ask_same_upload,
        }
        for name, make in asks.items():
            warm = 2 if "upload" in name else 2 * args.requests  # the model loaded; each query seen twice
            for i in range(warm):
                request(url, *make(i))
            one = measure(url, make, args.requests, 1)
            many = measure(url, make, args.requests, args.clients)
            rows.append((name, one, many))
            print(name, one, many, flush=True)

        with tempfile.TemporaryDirectory() as tmp:
            write_million(Path(tmp) / "store")
            big = open_site([Path(tmp) / "store"])
            with Running(make_app(big)) as running_big:
                for name, path in {
                    "1M-record store: gallery, page 1": "/stores/store",
                    "1M-record store: gallery, page 19,161 (record 479,000)": "/stores/store?page=19161&per=25",
                    "1M-record store: filtered page (object 3)": "/stores/store?object=obj3",
                }.items():
                    request(running_big.url, path)
                    one = measure(running_big.url, lambda i, p=path: (p, b"", {}), args.requests, 1)
                    many = measure(running_big.url, lambda i, p=path: (p, b"", {}), args.requests, args.clients)
                    rows.append((name, one, many))
                    print(name, one, many, flush=True)

    lines = [
        f"`python bench/serve.py --site {site_dir} --requests {args.requests}`: {total} images in the store, "
        f"{len(site.runs)} runs; {args.requests} requests per row; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; ms per request",
        "",
        f"| request | p50, 1 client | p95, 1 client | p50, {args.clients} clients | p95, {args.clients} clients "
        f"| requests/s, {args.clients} clients |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, one, many in rows:
        lines.append(
            f"| {name} | {one['p50']:.1f} | {one['p95']:.1f} | {many['p50']:.1f} | {many['p95']:.1f} "
            f"| {many['per_s']:.1f} |"
        )
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        args.out.write_text(table)


if __name__ == "__main__":
    main()
