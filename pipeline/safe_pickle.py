"""A restricted unpickler for legacy inputs (ViLBERT/MMF LMDBs, `_info.npy`, detectron2 weights).

It admits numpy arrays, numpy scalars/dtypes and plain Python values (dict, list, str,
numbers, ...) and nothing else: any other global — `os.system`, `builtins.eval`,
`subprocess.Popen`, arbitrary classes — raises `UnsafePickleError` before it is resolved,
so a hostile payload cannot run code (RefCOCO's ``refs(unc).p`` is read through it too), nor
stand for more values than `check_expansion` allows. We
never write pickles for our own data; exports to the legacy formats that are pickles by
definition (vilbert-lmdb, mmf-npy's `_info.npy`) go through `legacy_dumps`, which names
numpy's globals so that every numpy loads them, and the shapes world writes its RefCOCO+
file as the official one is: a protocol-2 pickle of plain values.
"""

from __future__ import annotations

import builtins
import collections
import io
import pickle
from typing import Any

import numpy as np
from numpy._core import multiarray as _multiarray
from numpy._core import numeric as _numeric

from pipeline.errors import UnsafePickleError

_NUMPY_GLOBALS = {
    "_reconstruct": _multiarray._reconstruct,
    "scalar": _multiarray.scalar,
    "_frombuffer": _numeric._frombuffer,
}
# numpy moved numpy.core to numpy._core in 2.0; pickles name either.
_NUMPY_MODULES = {"numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric"}
_SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "str",
        "bytes",
        "bytearray",
        "int",
        "float",
        "complex",
        "bool",
        "slice",
        "range",
    )
}


def _encode_latin1(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as used by protocol-2 pickles of bytes; text encodings only."""
    if encoding.lower().replace("-", "") not in {"latin1", "utf8", "ascii", "iso88591"}:
        raise UnsafePickleError(f"refused _codecs.encode with encoding {encoding!r}")
    return text.encode(encoding)


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module in _NUMPY_MODULES and name in _NUMPY_GLOBALS:
            return _NUMPY_GLOBALS[name]
        if module == "numpy" and name == "ndarray":
            return np.ndarray
        if module == "numpy" and name == "dtype":
            return np.dtype
        if module in ("builtins", "__builtin__") and name in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[name]
        if module == "_codecs" and name == "encode":
            return _encode_latin1
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise UnsafePickleError(
            f"refused to load {module}.{name}: only numpy arrays and plain Python values are "
            "allowed in legacy pickles (this payload may try to run code)"
        )


# What one pickle may stand for once its shared references are followed as a reader follows them:
# a pickle references an object it built before by its memo, so 275 bytes of nested shared lists
# (or ``range(10**12)``) are iterated into billions of values. RefCOCO's largest refs file holds a
# few million values; a detectron2 weights pickle a few thousand (its arrays are counted by bytes).
MAX_ITEMS = 20_000_000
MAX_BYTES = 4 << 30


def check_expansion(obj: Any, max_items: int = MAX_ITEMS, max_bytes: int = MAX_BYTES) -> None:
    """Raise `UnsafePickleError` when `obj`, walked as a reader iterates it (a container shared
    by many references counted at each), holds more than `max_items` values or `max_bytes` of
    strings, bytes and arrays, or holds itself. Each distinct container is expanded once (its
    size kept), without recursion: the check costs about what the pickle's own objects do."""
    sizes: dict[int, tuple[int, int]] = {}  # id of a container -> (values, bytes) expanded
    open_ = set()  # ids of the containers being expanded: the ancestors of the one at hand
    stack: list = [(obj, False)]
    while stack:
        value, expanded = stack.pop()
        key = id(value)
        if not _is_container(value):
            sizes[key] = _leaf_size(value)
            continue
        children = _children(value)
        if not expanded:
            if key in sizes:
                continue
            open_.add(key)
            stack.append((value, True))
            for child in children:
                if _is_container(child):
                    if id(child) in open_:
                        raise UnsafePickleError("refused a pickle that holds itself (an endless structure)")
                    if id(child) not in sizes:
                        stack.append((child, False))
            continue
        items, size = 1, 0
        for child in children:
            child_items, child_size = sizes[id(child)] if _is_container(child) else _leaf_size(child)
            items, size = items + child_items, size + child_size
        open_.discard(key)
        sizes[key] = (items, size)
        if items > max_items or size > max_bytes:
            raise UnsafePickleError(
                f"refused a pickle that expands to over {max_items:,} values or {max_bytes:,} bytes once its "
                "shared references are followed (a few bytes can stand for billions of values)"
            )
    items, size = sizes[id(obj)]
    if items > max_items or size > max_bytes:
        raise UnsafePickleError(f"refused a pickle that expands to over {max_items:,} values or {max_bytes:,} bytes")


def _is_container(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple, set, frozenset)) or (
        isinstance(value, np.ndarray) and value.dtype == object
    )


def _children(value: Any) -> list:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, np.ndarray):
        return value.ravel().tolist()
    return list(value)


def _leaf_size(value: Any) -> tuple[int, int]:
    """(values, bytes) of a value that holds no other: a string its length, an array its bytes,
    a range its length."""
    if isinstance(value, (str, bytes, bytearray)):
        return 1, len(value)
    if isinstance(value, np.ndarray):
        return 1, value.nbytes
    if isinstance(value, range):
        return 1 + len(value), 0
    return 1, 0


def safe_loads(data: bytes | memoryview, *, encoding: str = "ASCII") -> Any:
    """Unpickle `data` admitting only numpy arrays and plain values, and no more of them than
    `check_expansion` allows.

    `encoding="latin1"` reads Python-2 pickles holding numpy arrays (detectron2 weights).
    """
    try:
        obj = RestrictedUnpickler(io.BytesIO(bytes(data)), encoding=encoding).load()
    except UnsafePickleError:
        raise
    except Exception as err:  # truncated or malformed pickles raise many types
        raise UnsafePickleError(f"not a readable pickle: {type(err).__name__}: {err}") from err
    check_expansion(obj)
    return obj


class _Numpy1Pickler(pickle._Pickler):
    """numpy 2 pickles arrays through `numpy._core.multiarray`, which numpy < 1.26 cannot
    import (the code that reads legacy formats often runs such a numpy); numpy 1.x wrote
    `numpy.core.multiarray`, which numpy 2 still loads without a warning (numpy/core/
    multiarray.py keeps `_reconstruct` and `scalar` for old pickles). Writes the latter."""

    def save_global(self, obj: Any, name: str | None = None) -> None:
        module = getattr(obj, "__module__", None) or ""
        if module.startswith("numpy._core.") and self.proto < 4:
            old = "numpy.core." + module[len("numpy._core.") :]
            self.write(pickle.GLOBAL + f"{old}\n{name or obj.__name__}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


def legacy_dumps(obj: Any) -> bytes:
    """Pickle numpy arrays and plain values as Python 3.6 and numpy 1.x did (protocol 3,
    `numpy.core.multiarray._reconstruct`): loadable by plain `pickle.loads` under any numpy."""
    buf = io.BytesIO()
    _Numpy1Pickler(buf, protocol=3).dump(obj)
    return buf.getvalue()


def safe_load_npy_object(data: bytes) -> Any:
    """Load an `.npy` file that holds a pickled object (e.g. MMF's `_info.npy` dict)."""
    f = io.BytesIO(data)
    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0(f) if version == (1, 0) else np.lib.format.read_array_header_2_0(f)
    shape, _fortran, dtype = header
    if dtype != np.dtype(object):
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    obj = safe_loads(f.read(), encoding="latin1")
    if isinstance(obj, np.ndarray) and obj.shape == () and shape == ():
        return obj.item()
    return obj
