"""Sample order and per-sample randomness: pure functions of (seed, epoch, rank, world_size).

The order of an epoch never depends on worker count, timing or machine, so a loader's state is
just a position, and resuming is exact.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective, well-mixed hash of uint64 values."""
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def _key(seed: int, epoch: int) -> np.uint64:
    """Combine seed and epoch into one hashed key without the ``seed + epoch`` collisions."""
    with np.errstate(over="ignore"):
        k = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        k = _mix(k ^ (np.uint64(epoch & 0xFFFFFFFFFFFFFFFF) * _GOLDEN + _GOLDEN))
    return k[0]


def epoch_order(
    n: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
) -> np.ndarray:
    """Return the sample indices (int64) that ``rank`` visits in ``epoch``.

    Every rank gets the same count: with ``drop_last`` the tail that does not divide evenly is
    dropped, otherwise the order wraps around to pad it (as ``DistributedSampler`` does).
    """
    if shuffle:
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x0DE4])))
        order = gen.permutation(n).astype(np.int64, copy=False)
    else:
        order = np.arange(n, dtype=np.int64)
    if world_size == 1:
        return order
    per_rank = n // world_size if drop_last else -(-n // world_size)
    total = per_rank * world_size
    if total > n:
        order = np.resize(order, total)
    return np.ascontiguousarray(order[rank:total:world_size])


def sample_uniforms(seed: int, epoch: int, indices: np.ndarray, count: int) -> np.ndarray:
    """Uniform floats in [0, 1), shape ``(len(indices), count)``, a pure function of each index.

    A counter-based hash (splitmix64) stands in for a per-sample ``Generator``: the same numbers
    for a sample whatever batch or worker it lands in, at a fraction of a microsecond per sample.
    """
    key = _key(seed, epoch)
    idx = np.asarray(indices, dtype=np.uint64)[:, None]
    ctr = np.arange(count, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        x = _mix((idx * _GOLDEN) ^ key)
        x = _mix(x + (ctr + np.uint64(1)) * _GOLDEN)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A numpy Generator for one sample (user transforms): SeedSequence([seed, epoch, index])."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, int(index)]))
