"""Filesystem helpers: atomic writes, durable renames, checksums, sizes, write locks, and the
one way a command replaces an output folder (`replacing_output`): only a folder it wrote."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from pipeline.errors import BusyError, ConfigError, DataError

log = logging.getLogger(__name__)
TMP_PREFIX = ".tmp-"
ASIDE_SUFFIX = ".old"
LOCK_FILE = ".vlprep.lock"
OUTPUT_MARKER = ".vlprep-output.json"  # {"kind": ...}: in every folder `replacing_output` wrote


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
    """Durably move a finished temporary file/directory to its final name. A file replaces
    a file atomically; an existing directory is never replaced (FileExistsError). Replace a
    user-named output folder with `replacing_output`, which checks that it is ours."""
    if final.is_dir() and not final.is_symlink():
        raise FileExistsError(f"{final} is an existing directory; refusing to replace it")
    fsync_tree(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def remove_path(path: Path) -> None:
    """Delete a file, a symbolic link (never its target) or a directory tree, if present."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _tmp_names(name: str = ".+") -> "re.Pattern[str]":
    """Our temporary names (`tmp_path_for`): ``.tmp-<name>.<pid>``, or ``...<pid>.old`` for
    a folder put aside while being replaced; `name` a regex (default: any)."""
    return re.compile(rf"{re.escape(TMP_PREFIX)}{name}\.\d+(?:{re.escape(ASIDE_SUFFIX)})?")


def remove_stale_tmp(directory: Path) -> list[Path]:
    """Delete leftovers of killed writers inside `directory`: entries with our temporary
    names only (a user's `.tmp-notes` is not one). Call it holding the folder's lock."""
    pattern = _tmp_names()
    stale = sorted(p for p in directory.iterdir() if pattern.fullmatch(p.name)) if directory.is_dir() else []
    for path in stale:
        remove_path(path)
    return stale


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary name and rename it to `path`. On failure (a full disk)
    the temporary file is removed, `path` keeps its old content, and an OSError that did
    not name a file names `path`."""
    tmp = tmp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        commit_path(tmp, path)
    except OSError as err:
        remove_path(tmp)
        if err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise
    except BaseException:
        remove_path(tmp)
        raise


def read_json(path: Path, what: str) -> Any:
    """A JSON file this tool wrote (a done-marker, a run record): a damaged or unreadable one
    is a DataError naming it and `what` it is."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise DataError(
            f"{path}: unreadable {what} ({type(err).__name__}: {err}); remove it to redo what it records"
        ) from err


def _non_finite(obj: Any, where: str = "") -> Optional[tuple[str, float]]:
    """(where, value) of the first NaN or infinite float inside `obj` (dicts, lists,
    tuples), as a JSON path such as ``[3]["boxes"][0]``; None if there is none."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "the top level", obj)
    if isinstance(obj, dict):
        items = ((f"{where}[{json.dumps(str(k))}]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for at, value in items:
        found = _non_finite(value, at)
        if found is not None:
            return found
    return None


def strict_json(obj: Any, what: str, **options) -> str:
    """`obj` as strict JSON text (`json.dumps` with `options`): a NaN or an infinity, which
    Python's json would write as the non-JSON tokens ``NaN`` / ``Infinity``, is a
    ConfigError naming `what` is being written and where in it the number sits."""
    try:
        return json.dumps(obj, allow_nan=False, **options)
    except ValueError:
        found = _non_finite(obj)
        if found is None:
            raise  # another problem (a circular reference): a bug
        where, value = found
        raise ConfigError(
            f"{what}: not written: {where} is {value}, and JSON has no NaN or Infinity "
            "(a non-finite number in the inputs or a computation)"
        ) from None


def atomic_write_json(path: Path, obj: Any) -> None:
    """`obj` as strict, indented JSON (`strict_json`: a NaN is a ConfigError, nothing is
    written), atomically."""
    atomic_write_bytes(path, (strict_json(obj, str(path), indent=2, sort_keys=False) + "\n").encode())


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


# Files whose sha256 this process (or the parent it was forked from) has found as expected,
# as (path, sha256, size, mtime): readers, their views and forked DataLoader workers hash a
# file once, not once each.
_MATCHED: set[tuple] = set()


def sha256_mismatch(path: Path, expected: str) -> Optional[str]:
    """None when `path`'s sha256 is `expected` (hashed once per process while the file's size
    and mtime stay the same); else the digest found."""
    found = path.stat()
    seen = (str(path.resolve()), expected, found.st_size, found.st_mtime_ns)
    if seen in _MATCHED:
        return None
    digest = sha256_file(path)
    if digest != expected:
        return digest
    _MATCHED.add(seen)
    return None


def disk_bytes(path: Path) -> int:
    """Size in bytes of a file, or of all files under a directory."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def named_config_path(name_or_path: Union[str, Path], folder: Path, suffix: str = ".json") -> Path:
    """Where a config given by name (``folder/<name><suffix>``) or by path lives."""
    path = Path(name_or_path)
    return path if path.suffix else folder / f"{name_or_path}{suffix}"


# Bounds of a config file a user hands us (a recipe, a model or detector config): its size
# and how deeply its values nest. YAML aliases are refused outright: nested ones ("billion
# laughs") make a few hundred bytes stand for gigabytes once a value is formatted or walked.
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 32


def _one_line(err: Exception) -> str:
    """A YAML or JSON error as one line: the problem and where (PyYAML's spans several)."""
    problem = getattr(err, "problem", None)
    mark = getattr(err, "problem_mark", None)
    if problem and mark is not None:
        context, begun = getattr(err, "context", None), getattr(err, "context_mark", None)
        if context and begun is not None:
            context += f" begun at line {begun.line + 1}, column {begun.column + 1}"
        return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" + (f" ({context})" if context else "")
    return " ".join(str(err).split())


def load_yaml(text: str, where: str) -> Any:
    """Safe YAML (plain values only: no tags that build objects) within the bounds above; a
    ConfigError naming `where` in one line for anything else: invalid YAML, an alias, values
    nested deeper than MAX_CONFIG_DEPTH (which would overflow the loader's recursion)."""
    import yaml

    try:
        depth = 0
        for event in yaml.parse(text, Loader=yaml.SafeLoader):  # streamed, not recursive
            if isinstance(event, yaml.AliasEvent):
                raise ConfigError(
                    f"{where}: YAML aliases (*{event.anchor}) are not accepted in a config; write the values out"
                )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_CONFIG_DEPTH:
                    raise ConfigError(f"{where}: values nested deeper than {MAX_CONFIG_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: invalid YAML: {_one_line(err)}") from None


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def loads_strict(text: Union[str, bytes]) -> Any:
    """`json.loads` of strict JSON: the tokens ``NaN`` / ``Infinity`` that Python's json
    writes and reads are a ValueError, as any other invalid JSON is."""
    return json.loads(text, parse_constant=_no_constants)


def read_named_json(name_or_path: Union[str, Path], folder: Path, what: str, suffix: str = ".json") -> dict:
    """A JSON (or, with `suffix` ``.yaml``, YAML: `load_yaml`) config given by name
    (``folder/<name><suffix>``) or by path; a missing, unreadable or oversized one (over
    MAX_CONFIG_BYTES, or nested deeper than MAX_CONFIG_DEPTH), or one with NaN / Infinity, is
    a ConfigError in one line (listing the known names when none is found)."""
    path = named_config_path(name_or_path, folder, suffix)
    if not path.exists():
        known = ", ".join(p.stem for p in sorted(folder.glob(f"*{suffix}")))
        raise ConfigError(f"no {what} config {name_or_path!r} (known: {known}, or a {suffix} path)")
    try:
        if not path.is_file():  # a folder, or a FIFO that would block the read
            raise ConfigError(f"{path}: a {what} config must be a file")
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: a {what} config of over {MAX_CONFIG_BYTES:,} bytes is refused")
        text = path.read_bytes().decode("utf-8")
        if path.suffix in (".yaml", ".yml"):
            obj = load_yaml(text, str(path))
        else:
            obj = loads_strict(text)
    except (OSError, ValueError, RecursionError) as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{path}: invalid {path.suffix[1:].upper()}: {_one_line(err)}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{path}: a {what} config must be a mapping of names to values")
    return obj


@contextmanager
def exclusive_lock(directory: Path, what: str = "output") -> Iterator[None]:
    """Hold an exclusive write lock on `directory` (flock on `directory/.vlprep.lock`,
    created with the directory if needed) for the duration of the block. A second writer
    gets `BusyError` at once, naming the holder's pid. The kernel drops the lock when the
    holder exits, however it exits: a killed writer never leaves a stale lock."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory} exists and is not a folder: give a folder for this {what}")
    directory.mkdir(parents=True, exist_ok=True)
    with _flock(directory / LOCK_FILE, directory, what):
        yield


@contextmanager
def output_lock(out: Path, what: str = "output") -> Iterator[None]:
    """`exclusive_lock` for an output that is replaced as a whole (a folder renamed into
    place, a file): the lock file lies beside it (`.<name>.vlprep.lock` in its parent, which
    is created if needed), so it outlives every replacement and locks this output alone."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _flock(out.parent / f".{out.name}.vlprep.lock", out, what):
        yield


_HELD_LOCKS: set[int] = set()  # descriptors of the locks this process holds


def _close_inherited_locks() -> None:
    """In a forked child (a DataLoader worker, say): close the lock descriptors it inherited.
    The parent keeps its locks; the child no longer shares them, so that once the parent is
    gone (killed, say) its locks are free at once, not when its last child has noticed."""
    for fd in _HELD_LOCKS:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


os.register_at_fork(after_in_child=_close_inherited_locks)


@contextmanager
def _flock(lock_file: Path, guarded: Path, what: str) -> Iterator[None]:
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    _HELD_LOCKS.add(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            raise BusyError(
                f"{guarded}: another process (pid {holder}) is writing this {what}; "
                "wait for it to finish, or write elsewhere"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        if fd in _HELD_LOCKS:  # (a forked child closed its copy already)
            _HELD_LOCKS.discard(fd)
            os.close(fd)  # releases the lock


# -- replacing an output: only one we wrote -----------------------------------------


def output_kind(directory: Path) -> Optional[str]:
    """The kind in `directory`'s ownership marker, or None when it has none (or a broken one)."""
    try:
        kind = json.loads((Path(directory) / OUTPUT_MARKER).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_output(
    out: Path,
    kind: str,
    inputs: Iterable[Path] = (),
    flag: str = "--out",
    what: Optional[str] = None,
    folder: Optional[bool] = True,
    also_ours: Optional[Callable[[Path], bool]] = None,
) -> None:
    """Refuse, with a ConfigError naming `out` and why, an output path that a command must
    not write or replace. Call it before any work.

    Refused: ``.``, ``..``, the current folder or any folder above it, the filesystem root;
    a symbolic link; a path that is, holds or lies inside one of `inputs`; when `out` exists:
    a file where a folder is written (`folder` True) or a folder, a device, a pipe or a socket
    where a file is written (`folder` False), and a non-empty folder that is not ours: neither marked as a `kind`
    output (`OUTPUT_MARKER`, written by `replacing_output`) nor accepted by `also_ours`
    (for outputs of versions before the marker). `what` names the writer in messages
    (e.g. "vlprep build-mixture")."""
    out = Path(out)
    what = what or f"a {kind}"
    where = f"{flag} {out}"
    if out.is_symlink():
        raise ConfigError(f"{where} is a symbolic link; give the real path of a new or empty folder")
    resolved = out.resolve()
    cwd = Path.cwd().resolve()
    if out.name in ("", ".", "..") or resolved == cwd or resolved in cwd.parents:
        raise ConfigError(
            f"{where} is the current folder or a folder above it ({resolved}); name a new folder for the output"
        )
    for path in inputs:
        if _overlaps(resolved, Path(path).resolve()):
            raise ConfigError(f"{where} overlaps the input {path}; write the output elsewhere")
    if not out.exists():
        return
    if not out.is_dir():
        if folder:
            raise ConfigError(f"{where} exists and is not a folder; choose a new or empty folder")
        if not out.is_file():  # a device, a FIFO, a socket: replacing it would replace the node
            raise ConfigError(f"{where} is not a regular file (a device, a pipe or a socket); give a file path")
        return
    if folder is False:
        raise ConfigError(f"{where} is a folder; give a file path")
    entries = sorted(p.name for p in out.iterdir())
    if entries and output_kind(out) != kind and not (also_ours and also_ours(out)):
        listed = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise ConfigError(
            f"{where} holds files not written by {what} ({listed}); it is not replaced: "
            "choose a new or empty folder, or remove it yourself"
        )


def _leftovers(out: Path) -> list[Path]:
    """Temporary names of writers of `out` (`.tmp-<name>.<pid>`, `.tmp-<name>.<pid>.old`)."""
    pattern = _tmp_names(re.escape(out.name))
    return sorted(p for p in out.parent.iterdir() if pattern.fullmatch(p.name)) if out.parent.is_dir() else []


def clean_leftovers(out: Path) -> None:
    """Under the output's lock: put back the old copy a writer killed between its two
    renames left aside (when `out` is missing), then remove every other leftover."""
    leftovers = _leftovers(out)
    asides = [p for p in leftovers if p.name.endswith(ASIDE_SUFFIX)]
    if asides and not (out.exists() or out.is_symlink()):
        newest = max(asides, key=lambda p: p.stat().st_mtime)
        os.replace(newest, out)
        log.warning("restored %s from %s, left by a writer killed while replacing it", out, newest.name)
        leftovers.remove(newest)
    for path in leftovers:
        log.info("removing %s, left by a killed writer of %s", path.name, out)
        remove_path(path)


def _swap_in(tmp: Path, out: Path) -> None:
    """Put the finished folder `tmp` at `out`: the old copy is renamed aside, `tmp` renamed
    into place, then the old copy deleted. A crash leaves the old or the new copy at `out`
    (or the old one aside, which `clean_leftovers` puts back)."""
    fsync_tree(tmp)
    aside = None
    if out.exists():
        aside = out.with_name(f"{TMP_PREFIX}{out.name}.{os.getpid()}{ASIDE_SUFFIX}")
        os.replace(out, aside)
    os.replace(tmp, out)
    fsync_dir(out.parent)
    if aside is not None:
        remove_path(aside)


@contextmanager
def replacing_output(
    out: Path,
    kind: str,
    inputs: Iterable[Path] = (),
    flag: str = "--out",
    what: Optional[str] = None,
    folder: Optional[bool] = True,
    also_ours: Optional[Callable[[Path], bool]] = None,
) -> Iterator[Path]:
    """Write an output that replaces `out` as a whole. Before any work: `check_output` (same
    arguments); then, holding `output_lock(out)` (a second writer gets BusyError), leftovers
    of killed writers of `out` are cleaned and the block gets the temporary path to build
    under (nothing is created there: the block makes a folder or a file). When the block
    succeeds a folder is marked as a `kind` output and swapped in (rename aside, rename into
    place, delete the old copy; ownership checked again), a file replaces a file atomically.
    Whatever happens, the temporary path is gone afterwards."""
    out = Path(out)
    inputs = tuple(inputs)
    check = dict(kind=kind, flag=flag, what=what, folder=folder, also_ours=also_ours)
    check_output(out, inputs=inputs, **check)
    with output_lock(out, "output"):
        clean_leftovers(out)
        tmp = tmp_path_for(out)
        try:
            yield tmp
            check_output(out, **check)  # the folder may have changed hands while we worked
            if tmp.is_dir():
                atomic_write_json(tmp / OUTPUT_MARKER, {"kind": kind})
                _swap_in(tmp, out)
            elif out.is_dir():
                raise ConfigError(f"{flag} {out} is a folder, and this output is a file; give a file path")
            else:
                commit_path(tmp, out)
        finally:
            remove_path(tmp)
