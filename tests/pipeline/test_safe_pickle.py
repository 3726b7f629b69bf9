import builtins
import collections
import io
import pickle

import numpy as np
import pytest

from pipeline.errors import UnsafePickleError
from pipeline.safe_pickle import safe_load_npy_object, safe_loads


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_numpy_arrays_scalars_and_plain_values_load(protocol):
    value = {
        "features": np.arange(12, dtype=np.float32).reshape(3, 4),
        "ids": np.array([1, 2], np.int64),
        "n": np.int64(3),
        "name": "COCO_1",
        "raw": b"\x00\x01",
        "nested": [1.5, (2, 3), {"a": None}],
        "ordered": collections.OrderedDict(x=1),
    }
    got = safe_loads(pickle.dumps(value, protocol=protocol))
    np.testing.assert_array_equal(got["features"], value["features"])
    assert got["features"].dtype == np.float32 and got["n"] == 3 and got["raw"] == b"\x00\x01"
    assert got["nested"] == [1.5, (2, 3), {"a": None}] and got["ordered"] == {"x": 1}


@pytest.mark.parametrize(
    "payload",
    [
        (builtins.eval, ("1+1",)),
        (builtins.getattr, ("", "join")),
        (__import__("os").system, ("true",)),
        (__import__("subprocess").Popen, (["true"],)),
    ],
)
def test_globals_that_run_code_are_refused(payload):
    class Evil:
        def __reduce__(self):
            return payload

    with pytest.raises(UnsafePickleError, match="only numpy arrays and plain Python values"):
        safe_loads(pickle.dumps({"x": Evil()}))


def test_truncated_pickle_is_a_named_error():
    data = pickle.dumps({"a": np.zeros(10)})
    with pytest.raises(UnsafePickleError, match="not a readable pickle"):
        safe_loads(data[:-5])


def test_npy_object_files():
    buf = io.BytesIO()
    np.save(buf, {"bbox": np.ones((2, 4), np.float32), "num_boxes": 2}, allow_pickle=True)
    info = safe_load_npy_object(buf.getvalue())
    assert info["num_boxes"] == 2 and info["bbox"].shape == (2, 4)
    plain = io.BytesIO()
    np.save(plain, np.arange(3))
    assert safe_load_npy_object(plain.getvalue()).tolist() == [0, 1, 2]
