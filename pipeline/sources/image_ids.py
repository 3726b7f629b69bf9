"""Lists of image ids: the images a run keeps out of training (12-in-1's ``clean_datasets``
files, ``vlprep build-task --test-images``).

Two formats, told apart by their first bytes, not their names:

* ``.npy`` arrays as vilbert-multi-task keeps them beside its data (``cache/coco_test_ids.npy``,
  ``genome_test_ids.npy``, ``flickr_test_ids.npy``), any shape, numbers or strings; an object
  array is read through the restricted unpickler (`pipeline.safe_pickle`);
* plain text: one id or image name a line; blank lines and lines starting with ``#`` are
  skipped.

Every entry is read as `image_number` reads an image name, the way 12-in-1 compares ids
(``int(x)``): the number a name ends with, an extension left aside
(``COCO_val2014_000000391895``, ``COCO_val2014_000000391895.jpg`` and ``391895`` are all
391895; Flickr30k's ``1000092795.jpg``), else the name as it is (GQA's ``n161313``, which no
integer list holds). An array entry that is neither (a float with a fraction, an empty string,
None) is `Malformed` (``file:[3]``); every non-blank text line is an id or a name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Union

import numpy as np

from pipeline.errors import ConfigError, UnsafePickleError
from pipeline.safe_pickle import safe_load_npy_object
from pipeline.sources.base import Malformed, open_text, reading

NPY_MAGIC = b"\x93NUMPY"
ImageId = Union[int, str]


def image_number(name) -> ImageId:
    """The id an image has in 12-in-1's files: the number its name ends with, a file
    extension left aside (Flickr30k's ``1000092795.jpg`` -> 1000092795, COCO's
    ``COCO_train2014_000000391895`` -> 391895), else the name."""
    text = str(name).strip()
    stem, dot, extension = text.rpartition(".")
    tail = (stem if dot and extension.isalpha() else text).rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else text


def _entry(value) -> Union[ImageId, None]:
    """An array element as an id: an integer, an integral float, or a name; None otherwise."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return int(value) if np.isfinite(value) and float(value).is_integer() else None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str) and value.strip():
        return image_number(value)
    return None


def read_image_ids(path: Path) -> Iterator[Union[ImageId, Malformed]]:
    """The ids of an image list (`.npy` or text, see the module docstring), in file order."""
    path = Path(path)
    with reading(str(path)):
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
    if head == NPY_MAGIC:
        yield from _npy_ids(path)
        return
    with reading(str(path)), open_text(path) as f:
        for line in f:
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            yield image_number(text)


def _npy_ids(path: Path) -> Iterator[Union[ImageId, Malformed]]:
    try:
        values = safe_load_npy_object(path.read_bytes())
    except UnsafePickleError as err:
        raise UnsafePickleError(f"{path}: {err}") from err
    except (OSError, ValueError, EOFError) as err:
        raise ConfigError(f"{path}: not a readable .npy array of image ids: {err}") from err
    if isinstance(values, np.ndarray):
        values = values.reshape(-1).tolist() if values.dtype != object else list(values.reshape(-1))
    elif not isinstance(values, (list, tuple)):
        raise ConfigError(f"{path}: a .npy of image ids holds an array or a list, not {type(values).__name__}")
    for i, value in enumerate(values):
        entry = _entry(value)
        yield entry if entry is not None else Malformed(path, f"[{i}]", "not an image id (an integer or a name)")
