"""Sample order and per-sample randomness: pure functions of (seed, epoch, rank, world_size),
and the ``Plan`` that fixes which samples batch k of epoch e holds.

The order of an epoch never depends on worker count, timing or machine, so a loader's state is
just a position, and resuming is exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import SourceError

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


#: How an epoch is split across ranks: "pad" wraps the order round so every rank gets the
#: same count (``DistributedSampler(drop_last=False)``), "drop" drops the tail that does not
#: divide evenly (``drop_last=True``), "once" gives every sample to exactly one rank (counts
#: differ by at most one: for evaluation, where each sample must be scored once).
SPLITS = ("pad", "drop", "once")


@dataclass
class Plan:
    """Everything that fixes which samples a batch holds; the same in every process."""

    n: int
    batch_size: int
    seed: int
    shuffle: bool
    drop_last: bool
    rank: int = 0
    world_size: int = 1
    #: Rows per storage block (Parquet row group) in order, from ``source.block_sizes``; when
    #: set and ``shuffle`` is on, epochs use the quasi-random ``block_order`` so a dataset
    #: larger than RAM is read a few blocks at a time.
    block_sizes: tuple[int, ...] | None = None
    #: How the epoch is split across ranks: "pad", "drop" or "once" (``order.SPLITS``).
    split: str = "pad"

    def __post_init__(self) -> None:
        if self.shuffle and self.block_sizes and sum(self.block_sizes) != self.n:
            raise SourceError(
                f"block sizes add up to {sum(self.block_sizes)} samples, the source has "
                f"{self.n}; the source's block_sizes must cover every sample once"
            )

    #: ``(epoch, samples, steps)``: that epoch was resumed after ``samples`` global samples
    #: of its order (``steps`` global steps) were consumed by a run with another global batch;
    #: its rest, the samples after them, is split over the ranks as a whole epoch is. None:
    #: every epoch from its start.
    resume: tuple[int, int, int] | None = None
    #: ``((epoch, samples), ...)``: these samples (sorted, numbered as this source) are left
    #: out of that epoch and every later one; the others keep their order relative to each
    #: other (see ``global_order``).
    exclude: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def global_batch(self) -> int:
        """Samples one step takes over all ranks: ``batch_size x world_size``."""
        return self.batch_size * self.world_size

    def excluded(self, epoch: int) -> np.ndarray:
        """The samples left out of ``epoch`` (sorted int64)."""
        parts = [np.asarray(s, dtype=np.int64) for e, s in self.exclude if e <= epoch]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

    def count(self, epoch: int) -> int:
        """Samples in ``epoch``'s global order: ``n``, less those excluded from it."""
        return self.n - len(self.excluded(epoch)) if self.exclude else self.n

    def global_order(self, epoch: int) -> np.ndarray:
        """The epoch's global order before the split over ranks: a permutation of all ``n``
        samples, with the excluded ones taken out (the rest keep their relative order)."""
        if self.shuffle and self.block_sizes:
            order = block_order(self.block_sizes, seed=self.seed, epoch=epoch)
        else:
            order = epoch_order(self.n, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
        out = self.excluded(epoch) if self.exclude else None
        if out is None or not len(out):
            return order
        return np.ascontiguousarray(order[~np.isin(order, out)])

    def start(self, epoch: int) -> int:
        """Global samples of ``epoch`` consumed before this plan's first batch of it."""
        return self.resume[1] if self.resume is not None and self.resume[0] == epoch else 0

    def first_step(self, epoch: int) -> int:
        """The global step number of this plan's batch 0 of ``epoch``."""
        return self.resume[2] if self.resume is not None and self.resume[0] == epoch else 0

    def _total(self, epoch: int) -> tuple[int, int]:
        """``(start, total)``: the epoch's positions from ``start(epoch)`` on that the ranks
        visit, ``total`` of them (the rest padded, cut or left uneven as ``split`` says)."""
        start = self.start(epoch)
        rest = self.count(epoch) - start
        if self.world_size == 1 or self.split == "once":
            return start, rest
        return start, per_rank_count(rest, self.world_size, self.split) * self.world_size

    def slots(self, epoch: int) -> np.ndarray:
        """This rank's positions in the epoch's global order (int64; a position ``p`` holds
        sample ``global_order[p % count]``): every ``world_size``-th one from
        ``start(epoch)``, padded with the epoch's first samples, cut or left uneven as
        ``split`` says."""
        start, total = self._total(epoch)
        return np.arange(start + self.rank, start + total, self.world_size, dtype=np.int64)

    def batch_slots(self, epoch: int, batch: int) -> np.ndarray:
        """The positions in the global order of this rank's batch ``batch`` of ``epoch``
        (``slots(epoch)[batch * batch_size:][:batch_size]``, without building the epoch's)."""
        start, total = self._total(epoch)
        first = batch * self.batch_size
        count = max(0, min(self.batch_size, -(-(total - self.rank) // self.world_size) - first))
        return start + self.rank + self.world_size * (first + np.arange(count, dtype=np.int64))

    def order(self, epoch: int) -> np.ndarray:
        """This rank's sample order for ``epoch``."""
        order = self.global_order(epoch)
        if self.world_size == 1 and not self.start(epoch):
            return order
        return np.ascontiguousarray(order[self.slots(epoch) % max(1, len(order))])

    def per_rank(self) -> int:
        """Samples this rank visits in an epoch of all ``n`` samples."""
        return per_rank_count(self.n, self.world_size, self.split, self.rank)

    def batches(self) -> int:
        """Batches for this rank in an epoch of all ``n`` samples (counted, not by building an
        epoch's order)."""
        return self._batches_of(self.per_rank())

    def epoch_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` for this rank: a resumed epoch's rest, or a whole one, less
        the samples excluded from it."""
        start = self.start(epoch)
        if not start and not self.exclude:
            return self.batches()
        rest = self.count(epoch) - start
        return self._batches_of(per_rank_count(rest, self.world_size, self.split, self.rank))

    def _batches_of(self, samples: int) -> int:
        full, rest = divmod(samples, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1


def epoch_order(
    n: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    rank: int = 0,
    world_size: int = 1,
    split: str = "pad",
) -> np.ndarray:
    """Return the sample indices (int64) that ``rank`` visits in ``epoch`` (see ``SPLITS``)."""
    if shuffle:
        gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0x0DE4])))
        order = gen.permutation(n).astype(np.int64, copy=False)
    else:
        order = np.arange(n, dtype=np.int64)
    return rank_split(order, rank=rank, world_size=world_size, split=split)


def rank_split(
    order: np.ndarray, *, rank: int = 0, world_size: int = 1, split: str = "pad"
) -> np.ndarray:
    """The part of an epoch's ``order`` that ``rank`` visits: every ``world_size``-th sample,
    with the tail padded, dropped or left uneven as ``split`` says (see ``SPLITS``)."""
    if world_size == 1:
        return order
    if split == "once":
        return np.ascontiguousarray(order[rank::world_size])
    n = len(order)
    total = per_rank_count(n, world_size, split) * world_size
    if total > n:
        order = np.resize(order, total)
    return np.ascontiguousarray(order[rank:total:world_size])


def per_rank_count(n: int, world_size: int = 1, split: str = "pad", rank: int = 0) -> int:
    """How many of ``n`` samples ``rank`` visits per epoch (see ``rank_split``)."""
    if world_size == 1:
        return n
    if split == "drop":
        return n // world_size
    if split == "once":
        return n // world_size + (1 if rank < n % world_size else 0)
    return -(-n // world_size)


def block_order(
    block_sizes: Sequence[int] | np.ndarray, *, seed: int, epoch: int, window: int = 8
) -> np.ndarray:
    """A quasi-random permutation for data read in blocks (Parquet row groups, shards).

    Blocks are visited in a random order; the samples of each run of ``window`` consecutive
    blocks (in that order) are shuffled together. A reader then touches only ``window`` blocks
    at a time, so a dataset far larger than RAM streams from disk while batches still mix
    samples of many blocks. Sample ``i`` is the ``i``-th sample in storage order (blocks laid
    end to end). A pure function of ``(block_sizes, seed, epoch, window)``.
    """
    sizes = np.asarray(block_sizes, dtype=np.int64).reshape(-1)
    if (sizes < 0).any():
        raise ValueError("block sizes must be >= 0")
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    n = int(sizes.sum())
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, 0xB10C])))
    starts = np.cumsum(sizes) - sizes
    visit = gen.permutation(len(sizes))
    vsizes = sizes[visit]
    # storage index of every sample, blocks laid out in visiting order
    first = np.repeat(starts[visit] - (np.cumsum(vsizes) - vsizes), vsizes)
    stored = first + np.arange(n, dtype=np.int64)
    group = np.repeat(np.arange(len(sizes), dtype=np.int64) // window, vsizes)
    keys = gen.random(n)
    return np.ascontiguousarray(stored[np.lexsort((keys, group))])


def shuffle_quality(
    order: np.ndarray,
    block_sizes: Sequence[int] | np.ndarray | None = None,
    *,
    labels: np.ndarray | None = None,
    batch_size: int = 64,
) -> dict[str, float]:
    """How well shuffled ``order`` is, as numbers comparable across datasets.

    - ``displacement``: mean ``|output position - stored position| / n``; a uniform random
      permutation gives ~1/3, no shuffle 0.
    - ``displacement_ratio``: ``displacement`` over the uniform value (1.0 = as good as uniform).
    - ``adjacent``: share of neighbouring output pairs that were neighbours in storage
      (uniform: ~2/n; no shuffle: 1.0).
    - ``blocks_per_batch`` (with ``block_sizes``): mean number of distinct blocks in a batch
      of ``batch_size`` consecutive samples (uniform: ~min(batch_size, blocks)).
    - ``classes_per_batch`` / ``classes_per_batch_uniform`` (with ``labels``): mean distinct
      labels per batch, and the same for a uniform permutation of those labels.
    """
    order = np.asarray(order, dtype=np.int64)
    n = len(order)
    out: dict[str, float] = {}
    if n < 2:
        return {"displacement": 0.0, "displacement_ratio": 0.0, "adjacent": 0.0}
    disp = float(np.abs(np.arange(n) - order).mean() / n)
    uniform = (n * n - 1) / (3 * n * n)
    out["displacement"] = disp
    out["displacement_ratio"] = disp / uniform
    out["adjacent"] = float((np.abs(np.diff(order)) == 1).mean())
    if block_sizes is not None:
        bounds = np.cumsum(np.asarray(block_sizes, dtype=np.int64))
        out["blocks_per_batch"] = _distinct_per_batch(
            np.searchsorted(bounds, order, side="right"), batch_size
        )
    if labels is not None:
        lab = np.asarray(labels)
        out["classes_per_batch"] = _distinct_per_batch(lab[order], batch_size)
        perm = np.random.default_rng(0).permutation(len(lab))
        out["classes_per_batch_uniform"] = _distinct_per_batch(lab[perm], batch_size)
    return out


def _distinct_per_batch(values: np.ndarray, batch_size: int) -> float:
    """Mean count of distinct values in each full batch of consecutive ``values``."""
    full = len(values) // batch_size
    if full == 0:
        return float(len(np.unique(values)))
    chunks = np.sort(values[: full * batch_size].reshape(full, batch_size), axis=1)
    return float((1 + (np.diff(chunks, axis=1) != 0).sum(axis=1)).mean())


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


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A numpy Generator for one sample (user transforms): SeedSequence([seed, epoch, index])."""
    return np.random.default_rng(np.random.SeedSequence([seed, epoch, int(index)]))


SPLIT_KEY = 0x5917  # keeps the split's permutation apart from every epoch's


def split(
    n: int, fraction: float, seed: int, labels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(training, validation)`` sample indices (sorted, disjoint, covering ``n``): a pure
    function of ``(n, fraction, seed)``, the same in every process and run.

    The validation part is ``int(fraction * n)`` samples of a seeded permutation, as Keras
    counts it; with ``labels`` (class ids) it is stratified: ``int(fraction * count)`` of each
    class, so both parts keep the class balance."""
    gen = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, SPLIT_KEY])))
    perm = gen.permutation(n).astype(np.int64)
    if labels is None:
        val = perm[: int(fraction * n)]
    else:
        shuffled = np.asarray(labels)[perm]
        parts = [
            perm[shuffled == c][: int(fraction * int((shuffled == c).sum()))]
            for c in np.unique(shuffled)
        ]
        val = np.concatenate(parts) if parts else perm[:0]
    mask = np.zeros(n, dtype=bool)
    mask[val] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def split_last(n: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(training, validation)``: the first ``floor(n * (1 - fraction))`` samples and the
    rest, in order, exactly as Keras' ``fit(validation_split=)`` cuts arrays."""
    split_at = math.floor(n * (1.0 - fraction))
    return np.arange(split_at, dtype=np.int64), np.arange(split_at, n, dtype=np.int64)


def shuffle_note(
    order: np.ndarray, block_sizes: Sequence[int], labels: np.ndarray | None, batch_size: int
) -> str:
    """One line for ``stats()``: how well a block (row-group) shuffle mixes the data."""
    q = shuffle_quality(order, block_sizes, labels=labels, batch_size=batch_size)
    line = (
        f"block shuffle: displacement {q['displacement_ratio']:.2f} of a full shuffle's, "
        f"{q['blocks_per_batch']:.1f} row groups"
    )
    if "classes_per_batch" not in q:
        return line + " per batch"
    return line + (
        f" and {q['classes_per_batch']:.1f} classes per batch (full shuffle: "
        f"{q['classes_per_batch_uniform']:.1f})"
    )
