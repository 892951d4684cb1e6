"""Epoch order and per-sample randomness are pure functions of (seed, epoch, rank, world)."""

import numpy as np
import pytest

from stoker.order import epoch_order, per_rank_count, sample_uniforms


def test_shuffled_order_is_a_permutation_and_repeats_for_a_seed():
    a = epoch_order(1000, seed=3, epoch=0, shuffle=True)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, epoch_order(1000, seed=3, epoch=0, shuffle=True))
    assert not np.array_equal(a, np.arange(1000))


def test_epochs_and_seeds_differ_without_seed_plus_epoch_collisions():
    one = epoch_order(500, seed=1, epoch=2, shuffle=True)
    other = epoch_order(500, seed=2, epoch=1, shuffle=True)
    assert not np.array_equal(one, other)
    assert not np.array_equal(one, epoch_order(500, seed=1, epoch=3, shuffle=True))


def test_unshuffled_order_is_sequential():
    assert np.array_equal(epoch_order(7, seed=0, epoch=5, shuffle=False), np.arange(7))


@pytest.mark.parametrize("split", ["pad", "drop", "once"])
@pytest.mark.parametrize("n,world", [(10, 3), (12, 4), (7, 2), (5, 5)])
def test_ranks_split_the_data_as_asked(n, world, split):
    parts = [
        epoch_order(n, seed=0, epoch=0, shuffle=True, rank=r, world_size=world, split=split)
        for r in range(world)
    ]
    joined = np.concatenate(parts)
    for r, part in enumerate(parts):
        assert len(part) == per_rank_count(n, world, split, r)
    if split == "once":  # every sample on exactly one rank; counts differ by at most one
        assert sorted(joined.tolist()) == list(range(n))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        return
    assert len({len(p) for p in parts}) == 1
    if split == "drop":
        assert len(set(joined.tolist())) == len(joined) == (n // world) * world
    else:
        assert set(joined.tolist()) == set(range(n)) and len(parts[0]) == -(-n // world)


def test_uniforms_depend_only_on_the_sample_not_its_batch():
    u_all = sample_uniforms(7, 1, np.arange(100), 5)
    u_some = sample_uniforms(7, 1, np.array([42, 3]), 5)
    assert np.array_equal(u_all[[42, 3]], u_some)
    assert ((u_all >= 0) & (u_all < 1)).all()
    assert abs(u_all.mean() - 0.5) < 0.05
    assert not np.array_equal(u_all, sample_uniforms(7, 2, np.arange(100), 5))
