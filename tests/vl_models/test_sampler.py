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


def _spread(batches, lengths) -> float:
    """The mean over batches of (longest - shortest) length."""
    return sum(int(lengths[b].max() - lengths[b].min()) for b in batches) / len(batches)


def test_grouped_by_length_steps_hold_similar_lengths_the_same_on_every_rank_and_resume_exactly():
    """--group-by-length: each step's items over both ranks (batches of 4 per rank) come from
    one sorted run, so a batch's lengths are close; every item is still seen once per epoch,
    the ranks agree on the order, and a resume continues it exactly."""
    import numpy as np

    lengths = np.random.default_rng(0).integers(1, 40, 1000)

    def ranks(grouped: bool, epoch: int = 0):
        out = []
        for r in range(2):
            s = ResumableSampler(1000, r, 2, seed=7, lengths=lengths if grouped else None, batch_size=4)
            s.set_epoch(epoch)
            out.append(np.array(list(s)))
        return out

    grouped, plain = ranks(True), ranks(False)
    assert sorted(np.concatenate(grouped)) == sorted(np.concatenate(plain)) == list(range(1000))
    steps = [np.concatenate([grouped[0][k : k + 4], grouped[1][k : k + 4]]) for k in range(0, 500, 4)]
    plain_steps = [np.concatenate([plain[0][k : k + 4], plain[1][k : k + 4]]) for k in range(0, 500, 4)]
    assert _spread(steps, lengths) < 0.1 * _spread(plain_steps, lengths)
    assert _spread(steps, lengths) <= 1.5  # 400 items of 39 lengths per sorted run: neighbours
    assert not np.array_equal(ranks(True, epoch=1)[0], grouped[0])  # another order each epoch
    assert np.array_equal(ranks(True)[1], grouped[1])  # a function of seed, epoch and lengths
    s = ResumableSampler(1000, 1, 2, seed=7, lengths=lengths, batch_size=4)
    it = iter(s)
    seen = [next(it) for _ in range(37)]
    resumed = ResumableSampler(1000, 1, 2, seed=7, lengths=lengths, batch_size=4)
    resumed.load_state_dict(s.state_dict())
    assert seen + list(resumed) == grouped[1].tolist()
    asked = []
    by_epoch = ResumableSampler(1000, 1, 2, seed=7, lengths=lambda e: asked.append(e) or lengths, batch_size=4)
    assert list(by_epoch) == grouped[1].tolist() and asked == [0]  # a function of the epoch: once per epoch
    with pytest.raises(ValueError, match="999 lengths for 1000 items"):
        ResumableSampler(1000, lengths=lengths[:999])
    with pytest.raises(ValueError, match="999 lengths for 1000 items"):
        list(ResumableSampler(1000, lengths=lambda e: lengths[:999]))


def test_task_batches_grouped_by_length_per_task_and_cycled_passes_too():
    """Each task's batches are grouped by its own lengths, in every pass of a cycling task."""
    import numpy as np

    rng = np.random.default_rng(1)
    lengths = [rng.integers(1, 30, 400), None, rng.integers(1, 30, 120)]
    sizes = [400, 50, 120]
    s = TaskBatchSampler(sizes, batch_size=[8, 5, 4], seed=3, mode="cycle", lengths=lengths)
    batches = list(iter(s))
    by_task = {t: [np.array(b) - sum(sizes[:t]) for b in batches if _task_of(b[0], sizes) == t] for t in (0, 2)}
    assert len(by_task[2]) == 50 and len(by_task[0]) == 50  # task 2 is cycled: 30 batches a pass
    for t, own in by_task.items():
        assert _spread(own, lengths[t]) <= 1.0, t
    plain = list(iter(TaskBatchSampler(sizes, batch_size=[8, 5, 4], seed=3, mode="cycle")))
    assert [_task_of(b[0], sizes) for b in plain] == [_task_of(b[0], sizes) for b in batches]
    again = TaskBatchSampler(sizes, batch_size=[8, 5, 4], seed=3, mode="cycle", lengths=lengths)
    it = iter(again)
    head = [next(it) for _ in range(11)]
    resumed = TaskBatchSampler(sizes, batch_size=[8, 5, 4], seed=3, mode="cycle", lengths=lengths)
    resumed.load_state_dict(again.state_dict())
    assert head + list(resumed) == batches
