"""Export and import speed of every foreign format, against the native store read.

One synthetic store (default 1,000 images x 36 boxes x 2048-d float16, a 1601-column cls_prob,
labels and VG-sized label names: what an LXMERT-style extraction stores), then per format of the
registry that takes a detections store:

  export     `vlprep export --to FORMAT` (run_export): records/s and the bytes written
  import     `vlprep import --from FORMAT` of that export into a new store (run_import): records/s

and, as the yardstick, the native read: every record of the store in storage order, its arrays
copied out of the map (what an export reads). Each step is timed in turn, best of --rounds; the
load average is printed with the numbers (a loaded box slows them alike).

    python bench/formats.py                       # 1,000 images (~1.5 GB of scratch space)
    python bench/formats.py --n 200 --formats hf-dataset,webdataset
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import vg_like_record

from pipeline.formats import FORMATS
from pipeline.formats.convert import ExportConfig, ImportConfig, run_export, run_import
from pipeline.io import disk_bytes
from pipeline.store import FeatureStore, write_records

OBJECTS = [f"object{i}" for i in range(1600)]
ATTRIBUTES = [f"attribute{i}" for i in range(400)]


def build_store(path: Path, n: int) -> None:
    provenance = {
        "detector": "vg-r101",
        "weights_sha256": "0" * 64,
        "box_policy": "butd boxes=36, conf>=0.2, nms=0.3 +1px",
        "labels": {"file": "objects_vocab.txt", "objects": OBJECTS, "attributes": ATTRIBUTES},
    }
    write_records(path, (vg_like_record(i) for i in range(n)), provenance=provenance, attr_prob="none")


def native_read(path: Path) -> int:
    count = 0
    with FeatureStore.open(path) as store:
        for rec in store:
            for array in rec.array_fields().values():
                array.copy()
            count += 1
    return count


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000, help="images in the store")
    parser.add_argument("--formats", default="", help="comma-separated formats (default: every one that applies)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    names = [n for n in args.formats.split(",") if n] or [
        n for n, f in FORMATS.items() if f.importable and f.exportable and f.needs != "grid"
    ]
    root = Path(tempfile.mkdtemp(prefix="bench_formats_", dir=args.workdir))
    try:
        store = root / "store"
        build_store(store, args.n)
        read_s = best(lambda: native_read(store), args.rounds)
        print(
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"load {os.getloadavg()[0]:.1f}; {args.n:,} images x 36 x 2048 float16 + cls_prob 1601, "
            f"store {disk_bytes(store) / 1e6:,.0f} MB"
        )
        print(f"native read (every record, arrays copied): {args.n / read_s:,.0f} records/s")
        print()
        print("| format | export records/s | export / read | import records/s | import / read | written MB |")
        print("|---|---|---|---|---|---|")
        for name in names:
            fmt = FORMATS[name]
            dest = root / f"out-{name}"
            back = root / f"back-{name}"

            def do_export(fmt=fmt, dest=dest):
                shutil.rmtree(dest, ignore_errors=True)
                if dest.is_file():
                    dest.unlink()
                run_export(ExportConfig(fmt.name, store, dest))

            def do_import(fmt=fmt, dest=dest, back=back):
                shutil.rmtree(back, ignore_errors=True)
                cfg = ImportConfig(fmt.name, (dest,), back, trust_pickle=fmt.needs_pickle, allow_skips=True)
                report = run_import(cfg)
                assert report.imported == args.n, (fmt.name, report)

            export_s = best(do_export, args.rounds)
            import_s = best(do_import, args.rounds)
            size = disk_bytes(dest) / 1e6
            print(
                f"| `{name}` | {args.n / export_s:,.0f} | {read_s / export_s:.2f} | {args.n / import_s:,.0f} | "
                f"{read_s / import_s:.2f} | {size:,.0f} |",
                flush=True,
            )
            shutil.rmtree(back, ignore_errors=True)
            shutil.rmtree(dest, ignore_errors=True) if dest.is_dir() else dest.unlink()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
