"""Mixture build speed and memory on a synthetic mixture of >= 2M items.

Writes, in the official formats, a Conceptual-Captions TSV (captions), Visual Genome
region descriptions + image_data (streamed JSON) and GQA-style balanced questions
(a streamed JSON object), then runs `vlprep build-mixture` on them and reports items/s
and the command's peak RSS (the input files total several hundred MB; memory must not
follow them).

    python bench/mixture.py                 # 2.0M items
    python bench/mixture.py --scale 0.1     # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pipeline.items import ITEMS_FILE
from pipeline.mixture import Mixture


def write_inputs(root: Path, scale: float) -> int:
    n_cc, n_vg_images, regions_per_image, n_gqa = int(1_200_000 * scale), int(60_000 * scale), 10, int(200_000 * scale)
    (root / "cc").mkdir(parents=True)
    with open(root / "cc" / "Train_GCC-training.tsv", "w") as f:
        for i in range(n_cc):
            f.write(f"a photo of thing number {i} on a sunny day\thttp://img.example/{i}.jpg\n")
    (root / "vg").mkdir()
    with open(root / "vg" / "image_data.json", "w") as f:
        json.dump([{"image_id": i, "coco_id": None, "url": f"http://vg/{i}.jpg"} for i in range(n_vg_images)], f)
    with open(root / "vg" / "region_descriptions.json", "w") as f:
        f.write("[")
        for i in range(n_vg_images):
            regions = [{"phrase": f"region {j} of image {i} is red", "image_id": i} for j in range(regions_per_image)]
            f.write(("," if i else "") + json.dumps({"id": i, "regions": regions}))
        f.write("]")
    (root / "gqa").mkdir()
    with open(root / "gqa" / "train_balanced_questions.json", "w") as f:
        f.write("{")
        for i in range(n_gqa):
            q = {
                "imageId": str(i % n_vg_images),
                "question": f"Is object {i % 97} left of object {i % 89}?",
                "answer": ["yes", "no", "left", "right", "red", "two"][i % 6],
            }
            f.write(("," if i else "") + json.dumps(str(i)) + ":" + json.dumps(q))
        f.write("}")
    spec = {
        "name": "bench",
        "image_data": "vg/image_data.json",
        "answers": {"top_k": 100},
        "sources": [
            {"name": "cc", "kind": "conceptual_captions", "files": ["cc/Train_GCC-training.tsv"]},
            {"name": "vg", "kind": "vg_regions", "files": ["vg/region_descriptions.json"]},
            {"name": "gqa", "kind": "gqa", "files": ["gqa/train_balanced_questions.json"]},
        ],
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    return n_cc + n_vg_images * regions_per_image + n_gqa


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_mixture_"))
    try:
        items = write_inputs(root, args.scale)
        input_mb = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 2**20
        start = time.perf_counter()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline.cli",
                "-q",
                "build-mixture",
                "--spec",
                str(root / "spec.yaml"),
                "--out",
                str(root / "mix"),
            ],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        mix = Mixture.open(root / "mix")
        built = len(mix)
        out_mb = mix.file(ITEMS_FILE).stat().st_size / 2**20
        del mix
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"machine: {os.cpu_count()} cpus; inputs {input_mb:.0f} MB (CC TSV, VG regions + image_data, GQA questions)")
    print(
        f"items: {built:,} (expected {items:,}) in {wall:.1f} s -> {built / wall:,.0f} items/s "
        f"(two passes over the QA sources included)"
    )
    print(f"peak RSS of the build: {rss:.0f} MB; items.arrow {out_mb:.0f} MB")


if __name__ == "__main__":
    main()
