"""Filesystem helpers: atomic writes, durable renames, checksums, sizes, write locks."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Union

from pipeline.errors import BusyError

TMP_PREFIX = ".tmp-"
LOCK_FILE = ".vlprep.lock"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file in a directory and the directory itself."""
    if path.is_dir():
        for child in path.iterdir():
            fsync_tree(child)
        fsync_dir(path)
    else:
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def tmp_path_for(final: Path) -> Path:
    """The temporary name a file or directory is built under before its rename."""
    return final.with_name(f"{TMP_PREFIX}{final.name}.{os.getpid()}")


def commit_path(tmp: Path, final: Path) -> None:
    """Durably move a finished temporary file/directory to its final name."""
    fsync_tree(tmp)
    if final.is_dir() and not final.is_symlink():
        if not tmp.is_dir():
            raise IsADirectoryError(f"{final} is a directory; refusing to replace it with a file")
        shutil.rmtree(final)  # a directory shard (LMDB) being rewritten
    os.replace(tmp, final)
    fsync_dir(final.parent)


def remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def remove_stale_tmp(directory: Path) -> list[Path]:
    """Delete leftovers of killed writers (temporary names) inside `directory`."""
    stale = sorted(directory.glob(f"{TMP_PREFIX}*")) if directory.is_dir() else []
    for path in stale:
        remove_path(path)
    return stale


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = tmp_path_for(path)
    with open(tmp, "wb") as f:
        f.write(data)
    commit_path(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode())


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def disk_bytes(path: Path) -> int:
    """Size in bytes of a file, or of all files under a directory."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def read_named_json(name_or_path: Union[str, Path], folder: Path, what: str) -> dict:
    """A JSON config given by name (``folder/<name>.json``) or by path; a missing one is a
    ConfigError listing the known names."""
    from pipeline.errors import ConfigError

    path = Path(name_or_path)
    if not path.suffix:
        path = folder / f"{name_or_path}.json"
    if not path.exists():
        known = ", ".join(p.stem for p in sorted(folder.glob("*.json")))
        raise ConfigError(f"no {what} config {name_or_path!r} (known: {known}, or a .json path)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: invalid JSON: {err}") from err


@contextmanager
def exclusive_lock(directory: Path, what: str = "output") -> Iterator[None]:
    """Hold an exclusive write lock on `directory` (flock on `directory/.vlprep.lock`,
    created with the directory if needed) for the duration of the block. A second writer
    gets `BusyError` at once, naming the holder's pid. The kernel drops the lock when the
    holder exits, however it exits: a killed writer never leaves a stale lock."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise BusyError(f"{directory}: another process (pid {holder}) is writing this {what}; "
                            "wait for it to finish, or write elsewhere") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
