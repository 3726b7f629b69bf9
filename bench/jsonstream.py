"""Streaming JSON (`pipeline.sources.jsonstream.iter_json`) on one huge member against the
same amount of JSON spread over ordinary members, before and after the linear-time fix.

For each size, two files of about that many MB: a top-level array holding one member of
that size (a Karpathy image or GQA question grown huge: a long list of small objects) and
one holding ordinary members of ~200 bytes. Each is read by the current reader and by the
reader as it was before the fix (its source taken from git, `OLD_COMMIT`: it decoded a
member from its start again after every 1 MiB read, quadratic in the member's size), and
the seconds and the ratios are printed: huge/many (the cost of one huge member over ordinary
ones, new reader), old/new for the huge file and for the ordinary one (the strict-JSON
checks' cost).

    python bench/jsonstream.py                   # 8, 16 and 32 MB
    python bench/jsonstream.py --sizes 23 44 87  # the sizes measured in docs/benchmarks.md
    python bench/jsonstream.py --no-old          # the current reader alone
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from pipeline.sources import jsonstream

REPO = Path(__file__).resolve().parents[1]
OLD_COMMIT = "2d66a41"  # the last commit with the quadratic reader
_ITEM = {"sentid": 0, "raw": "a man rides a red bicycle down a quiet street", "tokens": ["a", "man", "rides"]}


def write_inputs(root: Path, megabytes: float) -> tuple[Path, Path]:
    """(one huge member, ordinary members) files of about `megabytes` MB each."""
    item = json.dumps(_ITEM)
    count = int(megabytes * 1e6 / (len(item) + 2))
    huge, many = root / f"huge_{megabytes:g}.json", root / f"many_{megabytes:g}.json"
    with open(huge, "w") as f:
        f.write('[{"filename": "huge.jpg", "sentences": [' + ", ".join([item] * count) + "]}]")
    with open(many, "w") as f:
        f.write("[" + ", ".join([item] * count) + "]")
    return huge, many


def old_reader() -> types.ModuleType | None:
    """The reader of `OLD_COMMIT`, loaded from git; None when git cannot give it."""
    try:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{OLD_COMMIT}:pipeline/sources/jsonstream.py"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("jsonstream_before_fix")
    exec(compile(source, f"{OLD_COMMIT}:pipeline/sources/jsonstream.py", "exec"), module.__dict__)
    return module


def seconds(module, path: Path) -> float:
    start = time.perf_counter()
    for _ in module.iter_json(path, array=True):
        pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[8, 16, 32], help="file sizes in MB")
    parser.add_argument("--no-old", action="store_true", help="do not time the reader before the fix")
    args = parser.parse_args()
    old = None if args.no_old else old_reader()
    if not args.no_old and old is None:
        print(f"(git cannot show {OLD_COMMIT}: timing the current reader alone)", file=sys.stderr)
    print(
        f"{'MB':>6} {'new huge':>9} {'new many':>9} {'huge/many':>9}"
        + (" {:>9} {:>9} {:>9} {:>9}".format("old huge", "old/new", "old many", "old/new") if old else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            huge, many = write_inputs(Path(tmp), size)
            new_huge, new_many = seconds(jsonstream, huge), seconds(jsonstream, many)
            line = f"{huge.stat().st_size / 1e6:6.1f} {new_huge:8.2f}s {new_many:8.2f}s {new_huge / new_many:9.2f}"
            if old:
                old_huge, old_many = seconds(old, huge), seconds(old, many)
                line += f" {old_huge:8.2f}s {old_huge / new_huge:9.1f} {old_many:8.2f}s {old_many / new_many:9.2f}"
            print(line, flush=True)
            huge.unlink()
            many.unlink()


if __name__ == "__main__":
    main()
