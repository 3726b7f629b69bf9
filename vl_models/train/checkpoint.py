"""Checkpoints: everything a run needs to continue bit-exactly, written atomically and
verified on load. Loaded with ``weights_only=True`` (no pickle code).

``RUN/checkpoints/`` holds ``step_NNNNNNN.pt``, beside each its ``step_NNNNNNN.pt.sha256``
(``sha256sum -c`` format), and two pointers, one file name each: ``latest`` and, with a
best metric, ``best``. A save writes the checkpoint, its checksum, then the pointers (each
atomically), and only then deletes checkpoints that retention no longer keeps. A load
checks the checksum; a missing, truncated or corrupt checkpoint is a `CheckpointError`
naming the file and the previous checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import logging
import random
import re
from pathlib import Path
from typing import Optional, Union

import numpy as np
import torch

from pipeline.errors import CheckpointError, ConfigError, DivergedError
from pipeline.io import atomic_write_bytes, remove_stale_tmp, sha256_file
from vl_models.models.weights import describe_load_error

log = logging.getLogger(__name__)

FOLDER = "checkpoints"
LATEST = "latest"
BEST = "best"
CHECKSUM_SUFFIX = ".sha256"
_STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def rng_state() -> dict:
    _, py_state, py_gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python": list(py_state),
        "python_gauss": py_gauss,
        "numpy": np_keys.tolist(),
        "numpy_pos": int(np_pos),
        "numpy_has_gauss": int(np_has_gauss),
        "numpy_gauss": float(np_gauss),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict) -> None:
    random.setstate((3, tuple(state["python"]), state["python_gauss"]))
    np.random.set_state(
        (
            "MT19937",
            np.array(state["numpy"], dtype=np.uint32),
            state["numpy_pos"],
            state["numpy_has_gauss"],
            state["numpy_gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def file_name(step: int) -> str:
    return f"step_{step:07d}.pt"


def step_of(path: Union[str, Path]) -> Optional[int]:
    """The step of a ``step_NNNNNNN.pt`` name; None for any other name."""
    match = _STEP_FILE.match(Path(path).name)
    return int(match.group(1)) if match else None


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def steps_in(folder: Path) -> list[int]:
    """The steps of the checkpoint files in a checkpoints folder, ascending."""
    return sorted(s for p in folder.glob("step_*.pt") if (s := step_of(p)) is not None) if folder.is_dir() else []


def _recorded_sum(recorded: Path) -> str:
    """The checksum a ``.sha256`` file records (its first word; any bytes read as text)."""
    return (recorded.read_bytes().split() or [b""])[0].decode("ascii", "replace")


def is_own_file(name: str) -> bool:
    """Whether a name in ``checkpoints/`` is one a save writes (a checkpoint, its checksum,
    a pointer, a temporary file of an interrupted save)."""
    if name in (LATEST, BEST) or name.startswith(".tmp-"):
        return True
    return step_of(name[: -len(CHECKSUM_SUFFIX)] if name.endswith(CHECKSUM_SUFFIX) else name) is not None


def newest_verified(folder: Path) -> Path:
    """The newest checkpoint in `folder` whose checksum file exists and matches (a run
    killed between a save and its `latest` pointer); CheckpointError if there is none."""
    for step in reversed(steps_in(folder)):
        path = folder / file_name(step)
        recorded = checksum_path(path)
        if recorded.exists() and _recorded_sum(recorded) == sha256_file(path):
            return path
    names = ", ".join(file_name(s) for s in steps_in(folder)[-3:])
    raise CheckpointError(
        f"{folder / LATEST} is missing, and none of {names} verifies against its checksum: write "
        "the name of the checkpoint to resume from into it, or start again with --overwrite"
    )


def check_finite(model: torch.nn.Module, step: int) -> None:
    """Raise DivergedError naming the parameters that hold NaN or inf (never checkpoint them)."""
    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise DivergedError(
            f"step {step}: parameters are not finite ({', '.join(bad[:5])}{more}); "
            "not checkpointed: lower --lr, or resume from the last checkpoint"
        )


def save(run: Path, step: int, payload: dict, keep_last: int = 0, best: Optional[str] = None) -> Path:
    """Write ``checkpoints/step_NNNNNNN.pt`` and its checksum atomically, then `latest`
    (and `best`, the file name of the best checkpoint, if given); then delete the
    checkpoints beyond the newest `keep_last` (0: keep all), never the best one.

    On a write error (a full disk) no temporary file is left, the pointers still name the
    previous checkpoint, and the OSError names the file being written."""
    folder = Path(run) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(step)
    buf = io.BytesIO()
    torch.save({**payload, "step": step, "rng": rng_state()}, buf)
    data = buf.getvalue()
    writes = [
        (path, data),
        (checksum_path(path), f"{hashlib.sha256(data).hexdigest()}  {path.name}\n".encode()),
        (folder / LATEST, path.name.encode()),
    ]
    if best:
        writes.append((folder / BEST, best.encode()))
    for target, content in writes:
        atomic_write_bytes(target, content)  # on failure: no temporary left, the error names the file
    prune(folder, keep_last)
    return path


def prune(folder: Path, keep_last: int) -> list[int]:
    """Delete checkpoints (and their checksums) older than the newest `keep_last` up to
    `latest`, except those `latest` and `best` name; returns the steps deleted. Newer
    files than `latest` (a resume from an earlier checkpoint) are left to be overwritten."""
    if keep_last <= 0:
        return []
    keep = {step_of(name) for pointer in (LATEST, BEST) if (name := pointer_name(folder, pointer)) is not None}
    current = step_of(pointer_name(folder, LATEST) or "")
    older = [s for s in steps_in(folder) if current is not None and s <= current]
    gone = [s for s in older[:-keep_last] if s not in keep]
    for s in gone:
        path = folder / file_name(s)
        checksum_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    return gone


def remove_stale(run: Path) -> list[Path]:
    """Delete temporary files that a killed or failed save left in ``checkpoints/``."""
    stale = remove_stale_tmp(Path(run) / FOLDER)
    if stale:
        log.info(
            "removed %d temporary checkpoint file(s) of an interrupted save: %s",
            len(stale),
            ", ".join(p.name for p in stale),
        )
    return stale


def _previous(path: Path, role: str = "resume") -> str:
    """A hint naming the newest checkpoint before `path`'s step, for error messages: how to
    resume from it (`role` "resume"), or for a checkpoint read as an input (`role` a flag such
    as ``--init``) that it can be named there instead."""
    step = step_of(path)
    earlier = [s for s in steps_in(path.parent) if step is None or s < step]
    if role != "resume":
        if not earlier:
            return f"; give another {role}"
        return f"; the previous checkpoint is {path.parent / file_name(earlier[-1])}: give it as {role}"
    if not earlier:
        return "; there is no earlier checkpoint: start again with --overwrite"
    name = file_name(earlier[-1])
    return (
        f"; the previous checkpoint is {name}: to resume from it, write its name into "
        f"{path.parent / LATEST} (or start again with --overwrite)"
    )


def load(path: Union[str, Path], role: str = "resume") -> dict:
    """A checkpoint, verified against its checksum file (checkpoints of older versions have
    none: loaded with a warning). Missing, truncated or corrupt -> CheckpointError, whose
    advice fits `role`: "resume" (the run's own checkpoint) or the flag that named it as an
    input (``--init``, ``--checkpoint``)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} is missing{_previous(path, role)}")
    recorded = checksum_path(path)
    if recorded.exists():
        if sha256_file(path) != _recorded_sum(recorded):
            raise CheckpointError(
                f"{path}: checksum mismatch with {recorded.name}: the file is truncated or corrupt"
                f"{_previous(path, role)}"
            )
    else:
        log.warning("%s: no checksum file (written by an older vltrain); loading it unverified", path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises RuntimeError, pickle/zip errors, EOFError... for damaged files
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({describe_load_error(err)}){_previous(path, role)}"
        ) from err


def pointer_name(folder: Path, pointer: str = LATEST) -> Optional[str]:
    """The text of ``folder/<pointer>`` (a checkpoint's file name), stripped; None without the
    pointer; CheckpointError when it is no text (not UTF-8) or not a file."""
    file = Path(folder) / pointer
    if not (file.exists() or file.is_symlink()):
        return None
    try:
        return file.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        raise CheckpointError(
            f"{file} is not a checkpoint's name (not UTF-8 text): write the name of the checkpoint to use into it "
            f"(checkpoints: {', '.join(file_name(s) for s in steps_in(Path(folder))[-3:]) or 'none'})"
        ) from None
    except OSError as err:
        raise CheckpointError(f"{file}: unreadable pointer ({err.strerror or err})") from err


def pointed(run: Path, pointer: str = LATEST, role: str = "resume") -> Optional[Path]:
    """The checkpoint file that ``checkpoints/latest`` (or ``best``) names; None without
    the pointer; CheckpointError if it names a missing file or anything but a checkpoint's
    file name in the run's own ``checkpoints/`` (a path elsewhere is never followed)."""
    folder = Path(run) / FOLDER
    name = pointer_name(folder, pointer)
    if name is None:
        return None
    path = folder / name
    if name and (step_of(name) is None or Path(name).name != name):
        have = ", ".join(file_name(s) for s in steps_in(folder)[-3:]) or "none"
        raise CheckpointError(
            f"{folder / pointer} names {name!r}, which is no checkpoint file name of this run (step_NNNNNNN.pt "
            f"in {folder}): write the name of one of its checkpoints into it (the newest: {have})"
        )
    if not name or not path.is_file():
        raise CheckpointError(f"{folder / pointer} names {name or 'nothing'}, which is missing{_previous(path, role)}")
    return path


def load_latest(run: Path) -> Optional[dict]:
    """The checkpoint `latest` names, verified; None when the run has none."""
    path = pointed(run)
    return None if path is None else load(path)


def resolve(source: Union[str, Path], step: Union[int, str, None] = None, role: str = "resume") -> Path:
    """A checkpoint file: `source` itself, or in a run folder the one `latest` names, the
    one of step `step` (a number, or its digits), or with ``step="best"`` the one `best`
    names. ConfigError for a source that does not exist or is no run folder, and for a
    `step` that is none of these."""
    source = Path(source)
    if step is not None and step not in (LATEST, BEST) and not str(step).isdigit():
        raise ConfigError(f"--step {step!r}: a step number, best or latest")
    if not (source.exists() or source.is_symlink()):
        raise ConfigError(f"{source} does not exist: name a run folder or a checkpoint file")
    if source.is_file():
        if step is not None:
            raise ConfigError(f"{source} is a checkpoint file: --step applies to a run folder")
        return source
    folder = source / FOLDER
    if not folder.is_dir():
        raise ConfigError(f"{source} is neither a checkpoint file nor a run folder (no {FOLDER}/)")
    if step is None or step == LATEST:
        path = pointed(source, role=role)
    elif step == BEST:
        path = pointed(source, BEST, role)
        if path is None:
            raise ConfigError(f"{source} has no best checkpoint (a run keeps one with --best-metric)")
    else:
        path = folder / file_name(int(step))
        if not path.is_file():
            have = ", ".join(str(s) for s in steps_in(folder)) or "none"
            raise ConfigError(f"{source} has no checkpoint of step {step} (steps: {have})")
    if path is None:
        raise ConfigError(f"{source} has no checkpoint yet")
    return path
