import numpy as np
import pytest

from metadist.data import StratifiedTaskPartitioner, UnitDealer

# 5 strata of unequal sizes: 60, 37, 23, 11, 6 units (137 in all).
STRATA = np.repeat(np.arange(5), [60, 37, 23, 11, 6])
np.random.default_rng(3).shuffle(STRATA)


def _partitioner(seed=0, **kwargs):
    return StratifiedTaskPartitioner(STRATA, seed=seed, **kwargs)


def test_split_is_disjoint_complete_stratified_and_seeded():
    part = _partitioner()
    splits = [part.units(s) for s in ("train", "val", "test")]
    everything = np.concatenate(splits)
    assert len(everything) == len(STRATA) and len(np.unique(everything)) == len(STRATA)
    for code, size in enumerate(np.bincount(STRATA)):
        counts = [int(np.sum(STRATA[units] == code)) for units in splits]
        assert sum(counts) == size
        for count, fraction in zip(counts, (0.8, 0.1, 0.1), strict=True):
            assert abs(count - fraction * size) <= 1
            assert count >= 1  # every split sees every stratum
    same = _partitioner()
    other = _partitioner(seed=1)
    for s in ("train", "val", "test"):
        np.testing.assert_array_equal(part.units(s), same.units(s))
    assert not np.array_equal(part.units("test"), other.units("test"))


def test_pinned_test_units_stay_in_test():
    pins = np.flatnonzero(STRATA == 4)[:4]  # 4 of the 6 units of the smallest stratum
    part = _partitioner(pinned_test_units=pins)
    assert set(pins.tolist()) <= set(part.units("test").tolist())
    for seed in range(3):
        assert set(pins.tolist()) <= set(_partitioner(seed, pinned_test_units=pins).units("test"))
    assert np.sum(STRATA[part.units("train")] == 4) >= 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fractions": (0.5, 0.5)}, "fractions must be"),
        ({"fractions": (0.7, 0.2, 0.2)}, "sum to 1"),
        ({"fractions": (0.0, 0.5, 0.5)}, r"fractions\[0\] \(train\)"),
        ({"pinned_test_units": [1000]}, "pinned_test_units .*outside"),
        ({"pinned_test_units": np.flatnonzero(STRATA == 4)}, "stratum 4"),
        ({"seed": 2**64}, r"seed must be below 2\*\*64"),  # task seeds keep 64 bits
    ],
)
def test_bad_configurations_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _partitioner(**kwargs)


def test_strata_too_small_for_the_splits_are_drawn_together():
    """Strata with fewer units than splits with a share (a category of one series) are
    pooled into one remainder stratum for the split draw, instead of refusing the run;
    a partition without small strata is drawn exactly as before."""
    strata = np.array([0] * 20 + [1, 1] + [2])  # strata 1 and 2: fewer than three units
    part = StratifiedTaskPartitioner(strata, seed=0)
    assert part.merged_strata == [1, 2]
    units = np.concatenate([part.units(s) for s in ("train", "val", "test")])
    assert sorted(units.tolist()) == list(range(23))  # every unit in exactly one split
    small = np.flatnonzero(strata > 0)
    split_of = {int(u): s for s in ("train", "val", "test") for u in part.units(s)}
    assert {split_of[int(u)] for u in small} == {"train", "val", "test"}  # drawn as one
    # One stratum alone too small, the remainder too: it joins the smallest large stratum.
    lone = StratifiedTaskPartitioner(np.array([0] * 20 + [1] * 5 + [2]), seed=0)
    assert lone.merged_strata == [2]
    # Large enough everywhere: nothing merged, the same split as always.
    plain = np.array([0] * 20 + [1] * 4)
    assert StratifiedTaskPartitioner(plain, seed=0).merged_strata == []
    # Fewer units in all than splits: still refused, naming what is needed.
    with pytest.raises(ValueError, match=r"has 1 unit\(s\).*3 needed"):
        StratifiedTaskPartitioner(np.array([0, 1]), seed=0)
    part = StratifiedTaskPartitioner(strata, seed=0, fractions=(0.9, 0.1, 0.0))
    assert len(part.units("test")) == 0


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_deal_disjoint_equal_and_balanced_per_stratum(world_size):
    part = _partitioner()
    train = part.units("train")
    deal = part.deal("train", epoch=0, world_size=world_size)
    assert deal.units.shape == (world_size, len(train) // world_size)
    flat = deal.units.ravel()
    assert len(np.unique(flat)) == flat.size and set(flat.tolist()) <= set(train.tolist())
    order = part.epoch_order("train", 0)
    np.testing.assert_array_equal(np.sort(flat), np.sort(order[: flat.size]))
    np.testing.assert_array_equal(order[deal.positions], deal.units)
    dealt_per_stratum = np.bincount(STRATA[flat], minlength=5)
    for rank in range(world_size):
        per_stratum = np.bincount(STRATA[deal.units[rank]], minlength=5)
        share = dealt_per_stratum / world_size
        assert np.all(np.abs(per_stratum - share) <= 1), (rank, per_stratum, share)
        assert np.all((per_stratum == np.floor(share)) | (per_stratum == np.ceil(share)))
    # every round (one task per rank) is a consecutive block of the global order
    for column in range(deal.num_rounds):
        np.testing.assert_array_equal(
            np.sort(deal.positions[:, column]),
            np.arange(column * world_size, (column + 1) * world_size),
        )


def test_epoch_order_is_seeded_and_reshuffled_each_epoch():
    part, same = _partitioner(), _partitioner()
    orders = [part.epoch_order("train", epoch) for epoch in range(4)]
    for epoch, order in enumerate(orders):
        np.testing.assert_array_equal(order, same.epoch_order("train", epoch))
        np.testing.assert_array_equal(np.sort(order), part.units("train"))
    assert all(not np.array_equal(orders[0], o) for o in orders[1:])
    assert not np.array_equal(orders[0], _partitioner(seed=1).epoch_order("train", 0))
    assert not np.array_equal(part.epoch_order("val", 0), part.epoch_order("val", 1))


def test_epoch_order_interleaves_strata():
    # every 20 consecutive tasks hold each stratum within 2 of its share
    part = _partitioner()
    order = part.epoch_order("train", 5)
    share = np.bincount(STRATA[order], minlength=5) / len(order)
    for begin in range(0, len(order) - 20, 20):
        counts = np.bincount(STRATA[order[begin : begin + 20]], minlength=5)
        assert np.all(np.abs(counts - 20 * share) <= 2)


def test_resume_with_another_world_size_covers_the_rest_exactly_once():
    dealer = UnitDealer(np.arange(62), np.arange(62) % 4, seed=11)
    order = dealer.epoch_order(2)
    first = dealer.deal(2, world_size=2, num_rounds=10)  # ranks consume 20 tasks
    consumed = first.units.ravel()
    np.testing.assert_array_equal(np.sort(consumed), np.sort(order[:20]))
    position = first.units.size
    rest = dealer.deal(2, world_size=3, start=position)  # 42 left: 14 rounds of 3
    assert rest.units.shape == (3, 14)
    remaining = rest.units.ravel()
    assert len(np.unique(remaining)) == 42
    np.testing.assert_array_equal(np.sort(remaining), np.sort(order[position:]))
    assert not set(remaining.tolist()) & set(consumed.tolist())
    # a tail that does not fill a round is left for the next epoch's reshuffle
    tail = dealer.deal(2, world_size=4, start=position)
    assert tail.units.size == 40
    assert set(order[position:].tolist()) - set(tail.units.ravel().tolist()) == set(
        order[60:].tolist()
    )


def test_deal_errors_name_the_numbers():
    part = _partitioner()
    num_val = len(part.units("val"))
    with pytest.raises(ValueError, match=rf"world_size={num_val + 1} is larger than the {num_val}"):
        part.deal("val", 0, num_val + 1)
    with pytest.raises(ValueError, match="split must be one of"):
        part.units("validation")
    with pytest.raises(ValueError, match="rank must be in 0..1"):
        part.rank_slice("train", 0, rank=2, world_size=2)
    units, positions = part.rank_slice("train", 0, rank=1, world_size=2)
    np.testing.assert_array_equal(units, part.deal("train", 0, 2).units[1])
    assert len(positions) == len(units)


def test_unit_groups_stay_in_one_split():
    groups = np.arange(len(STRATA)) // 3  # units 3g, 3g+1, 3g+2 form group g
    strata = STRATA[groups * 3]  # one stratum per group
    part = StratifiedTaskPartitioner(strata, seed=2, unit_groups=groups)
    split_of_group = {}
    for name in ("train", "val", "test"):
        for unit in part.units(name):
            assert split_of_group.setdefault(int(groups[unit]), name) == name
    assert len(split_of_group) == groups.max() + 1
    assert set(split_of_group.values()) == {"train", "val", "test"}
    pinned = StratifiedTaskPartitioner(strata, seed=2, unit_groups=groups, pinned_test_units=[4])
    assert {3, 4, 5} <= set(pinned.units("test").tolist())
    with pytest.raises(ValueError, match="a group must lie in one stratum"):
        StratifiedTaskPartitioner(STRATA, seed=0, unit_groups=np.zeros(len(STRATA)))
    with pytest.raises(ValueError, match="one entry per unit"):
        StratifiedTaskPartitioner(STRATA, seed=0, unit_groups=np.zeros(3))


def test_blocked_order_is_a_seeded_permutation_of_shuffled_windows_in_file_order():
    sizes = np.random.default_rng(0).integers(1, 30, 137)  # bytes of units 0..136
    dealer = UnitDealer(np.arange(137), STRATA, seed=5).reordered(
        "blocked", unit_bytes=sizes, block_bytes=100, window_blocks=3
    )
    assert dealer.num_blocks == -(-int(sizes.sum()) // 100) or dealer.num_blocks > 10
    block = dealer.block_of  # units are 0..136, so block[u] is unit u's block
    assert np.all(np.diff(block) >= 0)
    for b in range(dealer.num_blocks):  # a block closes once it holds 100 bytes
        assert sizes[block == b][:-1].sum() < 100
    orders = [dealer.epoch_order(epoch) for epoch in range(3)]
    for epoch, order in enumerate(orders):
        np.testing.assert_array_equal(np.sort(order), np.arange(137))
        np.testing.assert_array_equal(
            order,
            dealer.reordered(
                "blocked", unit_bytes=sizes, block_bytes=100, window_blocks=3
            ).epoch_order(epoch),
        )
        blocks_in_order = block[order]
        # windows: runs of 3 blocks, each block entirely inside one run
        seen = []
        for b in blocks_in_order:
            if b not in seen:
                seen.append(b)
        window_of = {b: i // 3 for i, b in enumerate(seen)}
        assert np.all(np.diff([window_of[b] for b in blocks_in_order]) >= 0)
        for b in seen:  # every block in file order
            assert np.all(np.diff(order[blocks_in_order == b]) > 0)
        assert seen != sorted(seen)  # blocks shuffled
    assert not np.array_equal(orders[0], orders[1])
    deal = dealer.deal(1, world_size=3)
    dealt = np.bincount(STRATA[deal.units.ravel()], minlength=5)
    for rank in range(3):
        per_stratum = np.bincount(STRATA[deal.units[rank]], minlength=5)
        assert np.all(np.abs(per_stratum - dealt / 3) < 1)


@pytest.mark.parametrize(
    ("n", "fractions"),
    [
        (5_000_000, (0.3333333, 0.3333333, 0.3333325)),  # the floors miss n by 3
        (10_000_000, (0.6999995, 0.3, 0.0)),  # by 2, with a share of 0
        (4_000_000, (0.5000005, 0.4, 0.1)),  # the floors pass n by 1
        (137, (0.8, 0.1, 0.1)),
        (7, (0.0000005, 0.9999995, 0.0)),
    ],
)
def test_split_counts_sum_to_the_units_and_give_none_to_a_zero_share(n, fractions):
    """Fractions summing to 1 within the 1e-6 `check_fractions` allows: every unit gets
    a split (the floors could miss n by more than the remainders gave, leaving units to
    uninitialised memory), and a split with share 0 gets none."""
    from metadist.data.meta_split import check_fractions, split_counts

    counts = split_counts(n, check_fractions(fractions), 0)
    assert sum(counts) == n
    for count, share in zip(counts, fractions, strict=True):
        assert (count == 0) if share == 0 else (count >= 1 and abs(count - n * share) <= 3)


def test_split_counts_are_those_of_the_largest_remainder_where_fractions_sum_to_1():
    """The counts every existing run's split was drawn with are unchanged."""
    from metadist.data.meta_split import split_counts

    for fractions in [(0.8, 0.1, 0.1), (0.7, 0.15, 0.15), (0.6, 0.2, 0.2), (0.5, 0.0, 0.5)]:
        for n in range(3, 400):
            exact = [n * f for f in fractions]
            floors = [int(np.floor(x)) for x in exact]
            order = sorted(range(3), key=lambda i: (-(exact[i] - floors[i]), i))
            for i in order[: n - sum(floors)]:
                floors[i] += 1
            for i in range(3):
                while fractions[i] > 0 and floors[i] == 0:
                    donor = max(range(3), key=lambda j: floors[j])
                    floors[donor] -= 1
                    floors[i] += 1
            assert split_counts(n, fractions, 0) == floors, (n, fractions)


@pytest.mark.parametrize("world_size", [1, 3])
def test_partitioner_deals_from_any_start_the_dealer_takes(world_size):
    """`StratifiedTaskPartitioner.deal` takes every `start` that `UnitDealer.deal` takes,
    with the same deal: a start at the end, or with fewer tasks left than a round, deals
    nothing; past the end both refuse, naming the start."""
    part = _partitioner()
    dealer = part.dealer("train")
    n = dealer.num_units
    for start in (0, n - 2, n - 1, n):
        got = part.deal("train", 1, world_size, start=start)
        expected = dealer.deal(1, world_size, start=start)
        np.testing.assert_array_equal(got.units, expected.units)
        np.testing.assert_array_equal(got.positions, expected.positions)
    end = part.deal("train", 1, world_size, start=n)
    assert end.units.shape == (world_size, 0)
    for deal in (part.deal, lambda *a, **k: dealer.deal(*a[1:], **k)):
        with pytest.raises(ValueError, match=rf"start position {n + 1} is outside"):
            deal("train", 1, world_size, start=n + 1)
