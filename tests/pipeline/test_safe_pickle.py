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


def _nested_shared(levels: int, width: int = 10) -> bytes:
    """A pickle of `width` ** `levels` zeros in a few hundred bytes: every level one list, its
    `width` items the same list of the level below (the pickle's memo shares it)."""
    value: list = [0] * width
    for _ in range(levels - 1):
        value = [value] * width
    return pickle.dumps(value, protocol=2)


@pytest.mark.parametrize(
    "payload",
    [
        pickle.dumps(range(10**12)),  # ~50 bytes iterated for ever
        pickle.dumps({"train_image_list": range(10**12), "train_hard_pool": [[0, 1]]}),
        _nested_shared(9),  # 10**9 values
    ],
)
def test_a_pickle_that_stands_for_billions_of_values_is_refused_at_once(payload):
    """The restricted unpickler stops code, and this stops amplification: what a pickle expands
    to once its shared references are followed is bounded before anything iterates it, in
    a walk that costs what the pickle's own objects do (here: well under a second)."""
    import time

    assert len(payload) < 400
    started = time.perf_counter()
    with pytest.raises(UnsafePickleError, match="expands to over"):
        safe_loads(payload)
    assert time.perf_counter() - started < 1


def test_a_pickle_that_holds_itself_is_refused():
    looped: list = []
    looped.append(looped)
    with pytest.raises(UnsafePickleError, match="holds itself"):
        safe_loads(pickle.dumps(looped))


def test_shared_values_within_the_bounds_load_as_they_are():
    shared = ["a man", "the left"]
    obj = {"refs": [{"sentences": shared, "id": i} for i in range(1000)], "range": range(3)}
    assert safe_loads(pickle.dumps(obj)) == obj
    assert safe_loads(_nested_shared(4))[0][0][0] == [0] * 10  # 10**4 values: fine


def test_a_refs_file_standing_for_a_hundred_million_sentences_is_refused_by_name(tmp_path):
    """RefCOCO's refs(unc).p goes through the same bound: a small file whose refs share one
    enormous sentence list is refused with its path, before build-task iterates anything."""
    from pipeline.sources.refcoco import load_refs

    sentences: list = [{"tokens": ["a"], "raw": "a", "sent_id": 0, "sent": "a"}] * 10
    for _ in range(7):
        sentences = sentences * 1  # the same objects: the pickle stores them once
        sentences = [sentences] * 10
    refs = [{"ref_id": i, "ann_id": i, "image_id": i, "split": "train", "sentences": sentences} for i in range(10)]
    path = tmp_path / "refs(unc).p"
    path.write_bytes(pickle.dumps(refs, protocol=2))
    assert path.stat().st_size < 200_000
    with pytest.raises(UnsafePickleError, match=r"refs\(unc\)\.p: refused a pickle that expands to over"):
        load_refs(path)
