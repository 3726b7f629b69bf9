"""The project's named errors, and the exit code each one gives on the command line.

Each error names what is wrong and where. Both CLIs turn them into one line on stderr
and the exit code below (`exit_code`); docs/failure-modes.md's "Exit codes" table lists them.

    0   done
    1   the run finished, but part of the work failed (failure rate above
        --max-failure-rate, shards failed, rows skipped, verify found problems)
    2   invalid invocation, configuration or input: nothing was done (ConfigError)
    3   data on disk is missing, truncated or corrupt (StoreError, CheckpointError)
    4   training stopped itself: the loss became NaN or infinite (DivergedError)
    74  the disk is full (or another I/O failure while writing)
    75  another process is writing the same output right now (BusyError), or the Ray cluster
        has no live node left for the rest of the work (NoCapacityError): retry later
"""

from __future__ import annotations

import errno

# A full disk (or quota, or file-size limit): retrying cannot help, freeing space can.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
EXIT_FAILURES = 1
EXIT_CONFIG = 2
EXIT_DATA = 3
EXIT_DIVERGED = 4
EXIT_IO = 74  # sysexits EX_IOERR
EXIT_BUSY = 75  # sysexits EX_TEMPFAIL: try again later


class VlprepError(Exception):
    """Base of the named errors; `exit_code` is what the CLIs exit with."""

    exit_code = EXIT_FAILURES


class ConfigError(VlprepError, ValueError):
    """A configuration or invocation problem, raised before any work starts."""

    exit_code = EXIT_CONFIG


class InvalidRecordError(VlprepError, ValueError):
    """A record that must not be written: names the image and the field."""

    exit_code = EXIT_CONFIG

    def __init__(self, image_id: object, field: str, reason: str):
        self.image_id = image_id
        self.field = field
        self.reason = reason
        super().__init__(f"image {image_id!r}: field {field!r}: {reason}")


class DataError(VlprepError, RuntimeError):
    """Data on disk is missing, truncated or corrupt."""

    exit_code = EXIT_DATA


class StoreError(DataError):
    """A feature store on disk is missing, incomplete or corrupt."""


class CheckpointError(DataError):
    """A training checkpoint (or its `latest` pointer) is missing, truncated or corrupt."""


class DivergedError(VlprepError, RuntimeError):
    """Training produced a non-finite loss; nothing non-finite was checkpointed."""

    exit_code = EXIT_DIVERGED


class RunFailedError(VlprepError, RuntimeError):
    """A run finished, but too much of its work failed (the outputs are kept: rerun to retry)."""

    exit_code = EXIT_FAILURES


class BusyError(VlprepError, RuntimeError):
    """Another process holds the output's write lock."""

    exit_code = EXIT_BUSY


class UnsafePickleError(VlprepError, ValueError):
    """A pickle asked for something other than numpy arrays and plain values (or is no
    readable pickle): an input refused, exit 2."""

    exit_code = EXIT_CONFIG


def exit_code(err: BaseException) -> int | None:
    """The CLI exit code for an error we can name in one line; None for the others (a
    bug: let its traceback show)."""
    if isinstance(err, VlprepError):
        return err.exit_code
    if isinstance(err, OSError) and err.errno in (*DISK_FULL, errno.EIO):
        return EXIT_IO
    return None


def describe(err: BaseException) -> str:
    """One line naming the error (disk-full errors name the file being written)."""
    if isinstance(err, OSError) and err.errno in DISK_FULL:
        where = f" writing {err.filename}" if err.filename else ""
        return f"disk full{where}: {err.strerror or err}; free space and rerun (finished work is kept)"
    return str(err)


class NoCapacityError(VlprepError, RuntimeError):
    """The Ray cluster's live nodes cannot run the rest of the work (a node died, or none
    offering the resources joined): finished shards are kept; rerun once nodes are up."""

    exit_code = EXIT_BUSY
