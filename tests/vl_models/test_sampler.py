import pytest

from vl_models.data.sampler import ResumableSampler, TaskBatchSampler


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


def _task_of(i: int, sizes: list) -> int:
    return next(t for t in range(len(sizes)) if i < sum(sizes[: t + 1]))


def test_task_batch_sizes_per_task_and_resume():
    """12-in-1 trains each task at its own batch size; a resume counts the items handed out."""
    sizes = [12, 8, 6]
    s = TaskBatchSampler(sizes, batch_size=[4, 2, 3], seed=2)
    batches = list(iter(s))
    assert [len(b) for b in batches] == [4, 2, 3, 4, 2, 3, 4, 2, 2]
    assert [_task_of(b[0], sizes) for b in batches] == [0, 1, 2, 0, 1, 2, 0, 1, 1]
    assert sorted(i for b in batches for i in b) == list(range(26))
    again = TaskBatchSampler(sizes, batch_size=[4, 2, 3], seed=2)
    again.load_state_dict({**s.state_dict(), "epoch": 0, "position": 4 + 2 + 3 + 4})  # 4 batches used
    assert list(iter(again)) == batches[4:]
    with pytest.raises(ValueError, match="another"):
        again.load_state_dict({**s.state_dict(), "batch_size": 4})
    with pytest.raises(ValueError, match="3 tasks"):
        TaskBatchSampler(sizes, batch_size=[4, 2])


def test_cycle_runs_every_task_each_round_and_restarts_the_short_ones():
    """12-in-1's loop: one batch of every task per round, as many rounds as the longest task has;
    a task out of batches starts a new pass over its items, in a new order."""
    sizes = [12, 4]
    s = TaskBatchSampler(sizes, batch_size=2, seed=0, mode="cycle")
    assert s.order(0) == [0, 1] * 6 and len(s) == 12
    batches = list(iter(s))
    short = [b for b in batches if _task_of(b[0], sizes) == 1]
    passes = [sorted(i for b in short[k : k + 2] for i in b) for k in (0, 2, 4)]
    assert passes == [[12, 13, 14, 15]] * 3  # three whole passes over the short task
    assert short[0:2] != short[2:4]  # each pass in its own order
    assert sorted(i for b in batches if _task_of(b[0], sizes) == 0 for i in b) == list(range(12))
    again = TaskBatchSampler(sizes, batch_size=2, seed=0, mode="cycle")
    again.load_state_dict({**s.state_dict(), "epoch": 0, "position": 14})
    assert list(iter(again)) == batches[7:]
