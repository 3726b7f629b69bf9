"""Download throughput: `vlprep download` vs img2dataset on the same local corpus.

A local HTTP server (its own process, 127.0.0.1) serves N distinct URLs of ~640x480
JPEGs. Both tools run with the same process and thread counts, once storing images as
downloaded and once downscaling to a longest side of 512; each writes parquet shards.
Each tool runs twice per case, on N and on 2N URLs. Reported: images/s over the whole
command (start-up and shutdown included) for the 2N run; the steady-state rate
N / (t(2N) - t(N)), in which each tool's fixed start-up cost cancels (what matters for a
dataset of millions); success rate; peak RSS of the command's whole process tree; and
the ratios ours / img2dataset. Beside them: the per-core physical limit of the CPU work
(decode only; decode + resize + encode) measured in this process.

img2dataset is a benchmark-only dependency: pip install img2dataset.

    python bench/download.py                 # N = 1,000 (runs of 1,000 and 2,000), 2 processes x 16 threads
    python bench/download.py --n 2000 --processes 2 --threads 32
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import DISTINCT, make_jpegs
from PIL import Image


def serve(port_file: str) -> None:
    """The server process (asyncio, pre-built responses, so it costs the tools little CPU):
    GET /img/<i>.jpg -> corpus[i % DISTINCT]."""
    import asyncio

    jpegs = make_jpegs()
    responses = [
        b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(j) + j
        for j in jpegs
    ]
    not_found = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

    async def handle(reader, writer):
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1].decode()
            try:
                body = responses[int(path.rsplit("/", 1)[-1].split(".")[0]) % DISTINCT]
            except ValueError:
                body = not_found
            writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await server.serve_forever()

    asyncio.run(main())


def tree_rss(root: int) -> int:
    """Summed RSS (bytes) of `root` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack += children.get(pid, [])
    return total


def run_measured(cmd: list[str], env: dict) -> tuple[float, int, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0]

    def sample():
        while proc.poll() is None:
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - start
    sampler.join()
    return wall, peak[0], subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def count_ours(out: Path) -> int:
    return json.loads((out / "summary.json").read_text())["successes"]


def count_img2dataset(out: Path) -> int:
    return sum(json.loads(p.read_text())["successes"] for p in out.glob("*_stats.json"))


def physical_limit(resize: bool) -> float:
    """Single-core images/s of the CPU work alone (decode, or decode + resize + encode)."""
    jpegs = make_jpegs(16)
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < 3:
        im = Image.open(io.BytesIO(jpegs[n % len(jpegs)]))
        im.load()
        if resize:
            im = im.resize((512, 384), Image.Resampling.BOX)  # our default "area" filter
            im.save(io.BytesIO(), "JPEG", quality=95)
        n += 1
    return n / (time.perf_counter() - start)


def command(name: str, resize: bool, root: Path, out: Path, args) -> list[str]:
    if name == "vlprep":
        cmd = [
            sys.executable,
            "-m",
            "pipeline.cli",
            "-q",
            "download",
            "--dataset",
            "url_list",
            "--input",
            str(root / "urls.tsv"),
            "--caption-col",
            "",
            "--out",
            str(out),
            "--workers",
            str(args.processes),
            "--threads",
            str(args.threads),
            "--shard-size",
            str(args.shard_size),
            "--allow-network",
            "127.0.0.0/8",
        ]
        return cmd + (["--max-side", "512"] if resize else [])
    cmd = [
        sys.executable,
        "-m",
        "img2dataset.main",
        "--url_list",
        str(root / "urls.txt"),
        "--input_format",
        "txt",
        "--output_folder",
        str(out),
        "--output_format",
        "parquet",
        "--processes_count",
        str(args.processes),
        "--thread_count",
        str(args.threads),
        "--number_sample_per_shard",
        str(args.shard_size),
        "--distributor",
        "multiprocessing",
        "--enable_wandb",
        "False",
        "--timeout",
        "10",
        "--encode_quality",
        "95",
    ]
    if resize:
        return cmd + ["--image_size", "512", "--resize_mode", "keep_ratio_largest", "--resize_only_if_bigger", "True"]
    return cmd + ["--resize_mode", "no", "--skip_reencode", "True"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="N: each tool downloads N and then 2N images")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--cases", default="as downloaded,resize 512", help="comma-separated subset of the two cases")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return

    root = Path(tempfile.mkdtemp(prefix="bench_download_"))
    port_file = root / "port"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)])
    try:
        while not port_file.exists():
            time.sleep(0.05)
        port = int(port_file.read_text())
        env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "WANDB_MODE": "disabled"}
        results = {}
        for label, resize in (("as downloaded", False), ("resize 512", True)):
            if label not in args.cases.split(","):
                continue
            row = {}
            for name in ("img2dataset", "vlprep"):
                runs = {}
                for n in (args.n, 2 * args.n):
                    # distinct URLs per run: nothing is served from a cache
                    urls = [f"http://127.0.0.1:{port}/img/{i}.jpg?{name}-{resize}-{n}" for i in range(n)]
                    (root / "urls.txt").write_text("\n".join(urls) + "\n")
                    (root / "urls.tsv").write_text("url\n" + "\n".join(urls) + "\n")
                    out = root / f"{name}_{resize}_{n}"
                    cmd = command(name, resize, root, out, args)
                    wall, rss, proc = run_measured(cmd, env)
                    if proc.returncode != 0:
                        sys.exit(f"{name} failed:\n{proc.stderr[-3000:]}")
                    ok = (count_ours if name == "vlprep" else count_img2dataset)(out)
                    runs[n] = {"seconds": wall, "ok": ok, "peak_rss": rss}
                    shutil.rmtree(out, ignore_errors=True)
                big, small = runs[2 * args.n], runs[args.n]
                row[name] = {
                    "seconds": big["seconds"],
                    "images_per_s": big["ok"] / big["seconds"],
                    "steady_images_per_s": (big["ok"] - small["ok"]) / max(big["seconds"] - small["seconds"], 1e-6),
                    "success": big["ok"] / (2 * args.n),
                    "peak_rss": max(big["peak_rss"], small["peak_rss"]),
                    "fixed_seconds": small["seconds"]
                    - small["ok"] * (big["seconds"] - small["seconds"]) / max(big["ok"] - small["ok"], 1),
                }
            results[label] = row
        limits = {"decode": physical_limit(False), "decode+resize+encode": physical_limit(True)}
    finally:
        server.kill()
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"machine: {os.cpu_count()} cpus; runs of {args.n} and {2 * args.n} distinct URLs of ~640x480 JPEGs "
        f"from a local server; {args.processes} processes x {args.threads} threads; shards of {args.shard_size}\n"
    )
    print(
        f"{'case':15s} {'tool':12s} {'images/s':>9s} {'steady/s':>9s} {'fixed s':>8s} {'success':>8s} {'peak RSS':>10s}"
    )
    for label, row in results.items():
        for name, r in row.items():
            print(
                f"{label:15s} {name:12s} {r['images_per_s']:9.1f} {r['steady_images_per_s']:9.1f} "
                f"{r['fixed_seconds']:8.1f} {100 * r['success']:7.1f}% {r['peak_rss'] / 2**20:8.0f} MB"
            )
        wall = row["vlprep"]["images_per_s"] / row["img2dataset"]["images_per_s"]
        steady = row["vlprep"]["steady_images_per_s"] / row["img2dataset"]["steady_images_per_s"]
        print(
            f"{'':15s} vlprep / img2dataset: {wall:.2f} whole command ({2 * args.n} images), "
            f"{steady:.2f} steady state (target >= 1.5)"
        )
    print(
        "\nphysical limit per core (in-process, no I/O): "
        + ", ".join(f"{k} {v:.0f} images/s" for k, v in limits.items())
    )


if __name__ == "__main__":
    main()
