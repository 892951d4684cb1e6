"""Epoch order and per-sample randomness are pure functions of (seed, epoch, rank, world)."""

import numpy as np
import pytest

from stoker.order import epoch_order, sample_uniforms


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


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n,world", [(10, 3), (12, 4), (7, 2), (5, 5)])
def test_ranks_get_equal_counts_and_cover_the_data(n, world, drop_last):
    parts = [
        epoch_order(n, seed=0, epoch=0, shuffle=True, rank=r, world_size=world, drop_last=drop_last)
        for r in range(world)
    ]
    assert len({len(p) for p in parts}) == 1
    joined = np.concatenate(parts)
    if drop_last:
        assert len(set(joined.tolist())) == len(joined) == (n // world) * world
    else:
        assert set(joined.tolist()) == set(range(n))


def test_uniforms_depend_only_on_the_sample_not_its_batch():
    u_all = sample_uniforms(7, 1, np.arange(100), 5)
    u_some = sample_uniforms(7, 1, np.array([42, 3]), 5)
    assert np.array_equal(u_all[[42, 3]], u_some)
    assert ((u_all >= 0) & (u_all < 1)).all()
    assert abs(u_all.mean() - 0.5) < 0.05
    assert not np.array_equal(u_all, sample_uniforms(7, 2, np.arange(100), 5))
