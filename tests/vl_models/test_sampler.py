import pytest

from vl_models.data.sampler import ResumableSampler


def test_ranks_partition_each_epoch_and_epochs_differ():
    parts = [list(ResumableSampler(103, rank=r, world=4, seed=5)) for r in range(4)]
    flat = [i for p in parts for i in p]
    assert all(len(p) == 25 for p in parts) and len(set(flat)) == 100 and set(flat) <= set(range(103))
    s = ResumableSampler(103, seed=5)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first and sorted(list(ResumableSampler(10, seed=1))) == list(range(10))


def test_resume_neither_repeats_nor_skips():
    s = ResumableSampler(50, rank=1, world=2, seed=3)
    it = iter(s)
    seen = [next(it) for _ in range(7)]
    state = s.state_dict()
    resumed = ResumableSampler(50, rank=1, world=2, seed=3)
    resumed.load_state_dict(state)
    assert seen + list(resumed) == list(ResumableSampler(50, rank=1, world=2, seed=3))
    with pytest.raises(ValueError, match="another seed"):
        ResumableSampler(50, rank=1, world=2, seed=4).load_state_dict(state)
