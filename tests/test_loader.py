"""BatchMetaDataLoader: epochs, ranks, workers, resume, errors, user samplers."""

import numpy as np
import pytest
import torch
from _task_stores import PANEL_LENGTHS, build_encoded_store

from metadist.batch import MetaBatch, TaskSet
from metadist.data import BatchMetaDataLoader, StratifiedTaskPartitioner
from metadist.tasks import (
    TaskSampler,
    build_task_sampler,
    register_task_sampler,
    task_integers,
)

FORECAST = {"lookback": 16, "horizon": 4, "num_support": 3, "num_query": 2}
# The encoded store's rows are 20 bytes (3 float32 columns + an int64 time): entities of
# 0.8-8 KB, so 8 KB blocks hold one to a few entities.
BLOCKED = {"order": "blocked", "block_bytes": 8192, "window_blocks": 3}
ORDERS = pytest.mark.parametrize("order", [{"order": "random"}, BLOCKED], ids=["random", "blocked"])


# The user-defined sampler of the README, registered from outside metadist.
@register_task_sampler("random_windows")
class RandomWindows(TaskSampler):
    """Support and query windows at random places of one entity (no split time)."""

    needs_store = True

    def __init__(self, store, *, lookback=16, horizon=4, num_windows=4):
        if lookback < 1 or horizon < 1:
            raise ValueError("random_windows: lookback and horizon must be >= 1")
        self.store, self.lookback, self.horizon = store, lookback, horizon
        self.num_windows = num_windows
        self.entities = np.flatnonzero(store.lengths >= lookback + horizon)

    @property
    def num_units(self):
        return len(self.entities)

    def unit_strata(self):
        return self.store.stratum_codes[self.entities]

    def sample(self, units, seeds):
        entity = self.entities[units]
        span = self.store.lengths[entity] - self.lookback - self.horizon + 1  # [B]
        offsets = task_integers(seeds, span, 2 * self.num_windows)  # [B, 2K]
        rows = self.store.starts[entity][:, None] + offsets
        steps = np.arange(self.lookback + self.horizon)
        windows = self.store.values[rows[..., None] + steps]  # [B, 2K, L+H, C]
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :, : self.lookback]))
        y = torch.from_numpy(np.ascontiguousarray(windows[:, :, self.lookback :, -1:]))
        k = self.num_windows
        return MetaBatch(
            support=TaskSet(x[:, :k].contiguous(), y[:, :k].contiguous()),
            query=TaskSet(x[:, k:].contiguous(), y[:, k:].contiguous()),
            entity_index=torch.from_numpy(entity),
            stratum=torch.from_numpy(self.store.stratum_codes[entity]),
            split_time=torch.full((len(units),), -1, dtype=torch.int64),
        )


@pytest.fixture(scope="session")
def encoded_store(tmp_path_factory):
    return build_encoded_store(tmp_path_factory.mktemp("loader_store"), PANEL_LENGTHS)


def _tasks(batches):
    """(entity, split time, first support value) of every task, in order."""
    out = []
    for batch in batches:
        first = batch.support.x.reshape(batch.num_tasks, -1)[:, 0]
        out += list(
            zip(
                batch.entity_index.tolist(),
                batch.split_time.tolist(),
                first.tolist(),
                strict=True,
            )
        )
    return out


def _assert_same(batches, others):
    assert len(batches) == len(others)
    for a, b in zip(batches, others, strict=True):
        for x, y in zip(
            (a.support.x, a.support.y, a.query.x, a.query.y, a.entity_index, a.split_time),
            (b.support.x, b.support.y, b.query.x, b.query.y, b.entity_index, b.split_time),
            strict=True,
        ):
            assert torch.equal(x, y)


def test_epochs_lengths_and_torchmeta_keys():
    sampler = build_task_sampler("sinusoid", num_tasks=101, num_support=4, num_query=6)
    loader = BatchMetaDataLoader(sampler, np.arange(101), batch_size=10, seed=3)
    assert len(loader) == 10
    epoch0 = list(loader)
    assert len(epoch0) == 10 and loader.state_dict()["epoch"] == 1
    assert all(b.support.x.shape == (10, 4, 1) and b.query.y.shape == (10, 6, 1) for b in epoch0)
    inputs, targets = epoch0[0]["test"]
    assert inputs.shape == (10, 6, 1) and targets is epoch0[0].query.y
    epoch1 = list(loader)
    assert len(epoch1) == 10 and loader.state_dict() == {
        **loader.state_dict(),
        "epoch": 2,
        "tasks_consumed": 0,
    }
    assert not torch.equal(epoch0[0].support.y, epoch1[0].support.y)
    again = list(BatchMetaDataLoader(sampler, np.arange(101), batch_size=10, seed=3))
    _assert_same(epoch0, again)


@ORDERS
def test_ranks_get_equal_disjoint_stratified_shares_of_their_split(encoded_store, order):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=0, fractions=(0.9, 0.1, 0.0))
    loaders = [
        BatchMetaDataLoader(sampler, part, batch_size=4, seed=1, rank=r, world_size=3, **order)
        for r in range(3)
    ]
    assert len({len(loader) for loader in loaders}) == 1 and len(loaders[0]) == 2
    batches = [list(loader) for loader in loaders]
    per_rank = [[e for e, _, _ in _tasks(rank_batches)] for rank_batches in batches]
    everyone = sum(per_rank, [])
    assert len(everyone) == 24 and len(set(everyone)) == 24
    assert set(everyone) <= set(sampler.unit_entity[part.units("train")].tolist())
    strata = encoded_store.stratum_codes
    dealt = np.bincount(strata[everyone], minlength=3)
    for tasks in per_rank:
        per_stratum = np.bincount(strata[tasks], minlength=3)
        assert np.all(np.abs(per_stratum - dealt / 3) < 1), (per_stratum, dealt)
    for batch in sum(batches, []):  # no leakage in time: target = time + 0.5
        tau = batch.split_time.numpy()[:, None, None]
        assert np.all(batch.support.y.numpy()[..., 0] - 0.5 < tau)
        assert np.all(batch.query.y.numpy()[..., 0] - 0.5 >= tau)


@pytest.mark.integration
@pytest.mark.timeout(120)
@ORDERS
def test_same_batches_with_zero_and_two_workers(encoded_store, order):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=2)
    kwargs = {"batch_size": 3, "seed": 7, "rank": 1, "world_size": 2, **order}
    reference = BatchMetaDataLoader(sampler, part, **kwargs)
    forked = BatchMetaDataLoader(sampler, part, num_workers=2, **kwargs)
    for _ in range(2):  # two epochs
        _assert_same(list(reference), list(forked))


@pytest.mark.integration
@pytest.mark.timeout(180)
@ORDERS
def test_spawned_persistent_workers_give_the_same_stream(encoded_store, order):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=2)
    kwargs = {"batch_size": 4, "seed": 7, **order}
    reference = BatchMetaDataLoader(sampler, part, **kwargs)
    spawned = BatchMetaDataLoader(
        sampler,
        part,
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=1,
        multiprocessing_context="spawn",
        **kwargs,
    )
    for _ in range(2):
        _assert_same(list(reference), list(spawned))
    workers = spawned._loader._iterator._workers
    assert all(w.is_alive() for w in workers)
    # close() stops them when it returns, not at a later garbage collection (which
    # waited out PyTorch's shutdown timeout for every worker)
    spawned.close()
    assert not any(w.is_alive() for w in workers)
    spawned.close()  # twice: nothing left to stop


@ORDERS
def test_resume_mid_epoch_gives_the_remaining_batches(encoded_store, order):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=4, fractions=(1.0, 0.0, 0.0))
    make = lambda: BatchMetaDataLoader(sampler, part, batch_size=5, seed=8, **order)  # noqa: E731
    full = make()
    list(full)  # epoch 0
    epoch1 = list(full)
    interrupted = make()
    list(interrupted)
    iterator = iter(interrupted)
    for _ in range(3):
        next(iterator)
    state = interrupted.state_dict()
    assert state["epoch"] == 1 and state["tasks_consumed"] == 15
    resumed = make()
    resumed.load_state_dict(state)
    _assert_same(list(resumed), epoch1[3:])
    assert resumed.state_dict()["epoch"] == 2


@ORDERS
def test_every_rank_resumes_mid_epoch_with_the_tasks_it_would_have_had(encoded_store, order):
    """Same world size: each rank's remaining batches are its uninterrupted ones, task for
    task (the strata colouring of a deal depends on where it starts; dealing from the
    resumed position gave the ranks the same tasks of a step in another arrangement, and
    the averaged meta-gradient then differed in its last bits)."""
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=4, fractions=(1.0, 0.0, 0.0))

    def make(rank):
        return BatchMetaDataLoader(
            sampler, part, batch_size=2, seed=8, rank=rank, world_size=3, **order
        )

    for rank in range(3):
        full = make(rank)
        list(full)  # epoch 0
        epoch1 = list(full)
        assert len(epoch1) == 6
        for stop in range(1, len(epoch1)):
            interrupted = make(rank)
            list(interrupted)
            iterator = iter(interrupted)
            for _ in range(stop):
                next(iterator)
            resumed = make(rank)
            resumed.load_state_dict(interrupted.state_dict())
            assert _tasks(list(resumed)) == _tasks(epoch1[stop:]), (rank, stop)


@ORDERS
def test_resume_with_another_world_size_covers_the_rest_once(encoded_store, order):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=4, fractions=(1.0, 0.0, 0.0))
    reference = _tasks(list(BatchMetaDataLoader(sampler, part, batch_size=1, seed=8, **order)))
    assert len(reference) == 36
    two = [
        BatchMetaDataLoader(sampler, part, batch_size=3, seed=8, rank=r, world_size=2, **order)
        for r in range(2)
    ]
    seen = []
    for loader in two:
        iterator = iter(loader)
        for _ in range(2):
            seen += _tasks([next(iterator)])
    state = two[0].state_dict()
    assert state == two[1].state_dict() and state["tasks_consumed"] == 12
    assert sorted(seen) == sorted(reference[:12])
    three = [
        BatchMetaDataLoader(sampler, part, batch_size=2, seed=8, rank=r, world_size=3, **order)
        for r in range(3)
    ]
    rest = []
    for loader in three:
        loader.load_state_dict(state)
        rest += _tasks(list(loader))
    assert sorted(rest) == sorted(reference[12:])  # 24 left = 4 steps of 3 ranks x 2


def test_user_sampler_is_selected_by_name(encoded_store):
    loader = BatchMetaDataLoader(
        "random_windows",
        np.arange(10),
        batch_size=5,
        store=encoded_store,
        sampler_options={"lookback": 8, "num_windows": 3},
    )
    assert isinstance(loader.sampler, RandomWindows)
    batches = list(loader)
    assert len(batches) == 2 and batches[0].support.x.shape == (5, 3, 8, 3)


def test_an_unannotated_option_of_a_users_sampler_that_its_code_refuses_is_one_line(
    encoded_store,
):
    """RandomWindows does not annotate its options, so `lookback="abc"` reaches its own
    arithmetic: the TypeError there comes back as one ValueError naming the options."""
    with pytest.raises(ValueError, match=r"task sampler 'random_windows' could not be built "
                       r"from sampler.options \{'lookback': 'abc'\}: .*annotate"):  # fmt: skip
        build_task_sampler("random_windows", encoded_store, options={"lookback": "abc"})


def test_constructor_errors_name_the_field(encoded_store):
    sampler = build_task_sampler("sinusoid", num_tasks=20)
    with pytest.raises(ValueError, match="unknown task sampler 'nope'; registered: .*forecast"):
        BatchMetaDataLoader("nope", np.arange(4), batch_size=2)
    with pytest.raises(ValueError, match=r"batch_size=11 is larger than the 10 tasks each rank"):
        BatchMetaDataLoader(sampler, np.arange(20), batch_size=11, world_size=2, rank=1)
    with pytest.raises(ValueError, match="world_size=21 is larger than the 20 tasks"):
        BatchMetaDataLoader(sampler, np.arange(20), batch_size=1, world_size=21)
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        BatchMetaDataLoader(sampler, np.arange(20), batch_size=1, world_size=2, rank=2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        BatchMetaDataLoader(sampler, np.arange(20), batch_size=0)
    with pytest.raises(ValueError, match=r"units \[20\] are outside"):
        BatchMetaDataLoader(sampler, np.arange(21), batch_size=1)
    with pytest.raises(ValueError, match="lookback must be an integer >= 1"):
        BatchMetaDataLoader(
            "forecast",
            np.arange(4),
            batch_size=1,
            store=encoded_store,
            sampler_options={"lookback": 0},
        )
    with pytest.raises(ValueError, match="no entity .* long enough"):
        BatchMetaDataLoader(
            "forecast",
            np.arange(4),
            batch_size=1,
            store=encoded_store,
            sampler_options={"num_support": 500},
        )
    with pytest.raises(ValueError, match="need num_workers > 0"):
        BatchMetaDataLoader(sampler, np.arange(20), batch_size=1, persistent_workers=True)
    with pytest.raises(ValueError, match="partitioner deals 30 units but the sampler has 20"):
        BatchMetaDataLoader(
            sampler, StratifiedTaskPartitioner(np.zeros(30, np.int64), seed=0), batch_size=1
        )
    loader = BatchMetaDataLoader(sampler, np.arange(20), batch_size=2)
    with pytest.raises(ValueError, match="seed=5, this loader has seed=0"):
        loader.load_state_dict({**loader.state_dict(), "seed": 5})
    with pytest.raises(ValueError, match="tasks_consumed=21"):
        loader.load_state_dict({"epoch": 0, "tasks_consumed": 21})


def test_nway_kshot_examples_stay_in_the_loader_split(encoded_store):
    sampler = build_task_sampler(
        "nway_kshot", encoded_store, num_ways=2, num_shots=1, num_query=1, lookback=8
    )
    part = StratifiedTaskPartitioner(sampler.unit_strata(), seed=0, fractions=(0.5, 0.5, 0.0))
    for split in ("train", "val"):
        allowed = set(sampler.unit_entity[part.units(split)].tolist())
        loader = BatchMetaDataLoader(sampler, part, split=split, batch_size=4, seed=0)
        for batch in loader:
            for side in (batch.support, batch.query):
                used = side.x[..., 0, 0].numpy().astype(np.int64) // 10000
                assert set(used.ravel().tolist()) <= allowed
            assert set(batch.entity_index.tolist()) <= allowed


def _record_gathers(monkeypatch, events=None):
    """Every window start row the forecast sampler gathers, one `[B, *]` array per call
    (also appended to `events` as `("gathered", rows)` when given)."""
    from metadist.tasks.windows import WindowGatherer

    calls = []
    gather = WindowGatherer.gather

    def recording(self, rows, first_row=None):
        calls.append(np.asarray(rows).reshape(len(rows), -1).copy())
        if events is not None:
            events.append(("gathered", calls[-1]))
        return gather(self, rows, first_row)

    monkeypatch.setattr(WindowGatherer, "gather", recording)
    return calls


@pytest.mark.parametrize("order", ["random", "blocked"])
def test_blocked_order_reads_each_block_front_to_back_within_a_window(
    encoded_store, monkeypatch, order
):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    kwargs = {"block_bytes": 4096, "window_blocks": 3} if order == "blocked" else {}
    loader = BatchMetaDataLoader(
        sampler, np.arange(sampler.num_units), batch_size=2, seed=3, order=order, **kwargs
    )
    calls = _record_gathers(monkeypatch)
    list(loader)
    # 4 gathers per batch (support/query inputs, then targets); the first starts with
    # every task's first support window: the lowest row the task reads
    task_rows = np.concatenate([call[:, 0] for call in calls[0::4]])
    assert len(task_rows) == 36
    pages = task_rows * 20 // 512  # 20-byte rows, counted in 512-byte pages
    # blocks of 4096 bytes of the store (the test's own bucketing for both orders)
    first_row = encoded_store.starts[sampler.unit_entity]
    unit_bytes = encoded_store.lengths[sampler.unit_entity] * 20
    block_starts = first_row[
        np.flatnonzero(np.diff((np.cumsum(unit_bytes) - unit_bytes) // 4096, prepend=-1))
    ]
    block = np.searchsorted(block_starts, task_rows, side="right") - 1
    forward = [bool(np.all(np.diff(pages[block == b]) >= 0)) for b in np.unique(block)]
    first_touch = {b: int(np.flatnonzero(block == b)[0]) for b in np.unique(block)}
    last_touch = {b: int(np.flatnonzero(block == b)[-1]) for b in np.unique(block)}
    most_open = max(
        sum(first_touch[b] <= t <= last_touch[b] for b in first_touch) for t in range(36)
    )
    if order == "blocked":
        assert all(forward)  # every block's pages are touched in increasing order
        assert most_open <= 3  # a stretch of tasks reads at most window_blocks blocks
    else:
        assert most_open > 3  # the random order reads blocks all over the file at once


def test_read_ahead_covers_the_rows_gathered_and_released_blocks_are_not_read_again(
    encoded_store, monkeypatch
):
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    store_class = type(encoded_store)
    events = []
    will_need, release = store_class.will_need, store_class.release

    def advise(self, first_rows, end_rows):
        events.append(("advised", np.asarray(first_rows), np.asarray(end_rows)))
        return will_need(self, first_rows, end_rows)

    def drop(self, first_row, end_row):
        events.append(("released", first_row, end_row))
        release(self, first_row, end_row)

    monkeypatch.setattr(store_class, "will_need", advise)
    monkeypatch.setattr(store_class, "release", drop)
    _record_gathers(monkeypatch, events)
    kwargs = {"batch_size": 2, "seed": 3, **BLOCKED}
    reference = list(BatchMetaDataLoader(sampler, np.arange(36), **kwargs))
    events.clear()
    batches = list(
        BatchMetaDataLoader(sampler, np.arange(36), read_ahead=2, release=True, **kwargs)
    )
    advised, released, num_gathered = [], [], 0
    for kind, *what in events:
        if kind == "advised":
            advised.append(what)
        elif kind == "released":
            released.append(what)
        else:
            for row in what[0].ravel().tolist():
                num_gathered += 1
                assert any(np.any((f <= row) & (row < e)) for f, e in advised), row
                assert not any(f <= row < e for f, e in released), row
    assert num_gathered == 36 * (3 + 2) * 2 and len(released) >= 1
    _assert_same(batches, reference)  # advice changes nothing that is read
    events.clear()
    list(BatchMetaDataLoader(sampler, np.arange(36), **kwargs))
    assert not [kind for kind, *_ in events if kind == "released"]  # release is opt-in
    assert encoded_store.will_need(np.array([0, 10]), np.array([10, 20])) == 2  # merged


def test_order_settings_are_checked_and_kept_in_the_state(encoded_store):
    sinusoid = build_task_sampler("sinusoid", num_tasks=20)
    with pytest.raises(ValueError, match="order='blocked'.*needs a sampler that says where"):
        BatchMetaDataLoader(sinusoid, np.arange(20), batch_size=2, order="blocked")
    with pytest.raises(ValueError, match="release=True needs order='blocked'"):
        BatchMetaDataLoader(sinusoid, np.arange(20), batch_size=2, release=True)
    with pytest.raises(ValueError, match="order must be one of"):
        BatchMetaDataLoader(sinusoid, np.arange(20), batch_size=2, order="sorted")
    with pytest.raises(ValueError, match="block_bytes must be a positive integer"):
        BatchMetaDataLoader(
            "forecast",
            np.arange(4),
            batch_size=1,
            store=encoded_store,
            order="blocked",
            block_bytes=0,
            sampler_options=FORECAST,
        )
    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    blocked = BatchMetaDataLoader(sampler, np.arange(36), batch_size=2, **BLOCKED)
    random = BatchMetaDataLoader(sampler, np.arange(36), batch_size=2)
    with pytest.raises(ValueError, match="saved with order random, this loader has blocked"):
        blocked.load_state_dict(random.state_dict())


def test_read_ahead_defaults_on_where_the_store_outgrows_the_page_cache(encoded_store, monkeypatch):
    import metadist.data.loader_settings as settings_module

    sampler = build_task_sampler("forecast", encoded_store, **FORECAST)
    make = lambda **kw: BatchMetaDataLoader(sampler, np.arange(36), batch_size=2, **kw)  # noqa: E731
    assert not settings_module.larger_than_page_cache(encoded_store)  # a few KB
    assert make().read_ahead == 0 and make(**BLOCKED).read_ahead == 4
    monkeypatch.setattr(settings_module, "larger_than_page_cache", lambda store: True)
    assert make().read_ahead == 4 and make(read_ahead=0).read_ahead == 0
    sinusoid = build_task_sampler("sinusoid", num_tasks=20)
    assert BatchMetaDataLoader(sinusoid, np.arange(20), batch_size=2).read_ahead == 0
