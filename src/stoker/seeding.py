"""The global RNGs that ported code calls (``np.random.*``, Python's ``random``, torch's CPU
generator), seeded per sample from the sample's own generator, so a user's ``augment=``
callable or a dataset's ``__getitem__`` draws the same numbers for the same ``(seed, epoch,
index)`` whatever the worker count, and a resumed run replays them.

One procedure for every user callable that loads a sample (``with seeded(rng): ...``): the
seeds come from ``rng``'s ``SeedSequence`` (``[seed, epoch, index]`` and its spawn key), mixed
apart from ``rng``'s own stream. Torch is seeded only when it is imported: a worker never
imports it for this; if the callable itself imports torch, torch is seeded the moment that
import ends, so even the first sample's torch draws are the sample's. In the calling process
(``workers=0``, ``peek()``) the user's own global states are put back afterwards; in a worker
process (``mark_worker()``) they are the loader's and are not saved.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np

from .importhook import after_import

GLOBALS_KEY = 0x6C0B
"""Mixed into the global RNGs' seeds: streams apart from ``sample_rng()``'s own."""
_M64 = (1 << 64) - 1
_STATE: dict[str, Any] = {"worker": False, "kept": False, "torch_seed": None, "hook": False}


def mark_worker() -> None:
    """In a worker process: the global RNGs are the loader's (reseeded, never put back)."""
    _STATE["worker"] = True


def _splitmix(x: int) -> int:
    """One splitmix64 step: a well-spread 64-bit mix of ``x`` (stable, and cheap)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def global_seeds(entropy: Any) -> tuple[int, int, int]:
    """Seeds of numpy's global RNG (32 bits: its fast legacy seeding), Python's ``random`` and
    torch (64 bits each) from a sample's ``(seed, epoch, index)``, mixed apart from each other.
    Mixed with splitmix64, not a SeedSequence: this runs before every sample, so it stays
    a small share of a decode (see benchmarks/README.md#seeding)."""
    h = GLOBALS_KEY
    for word in entropy if isinstance(entropy, (list, tuple)) else [entropy]:
        word = int(word)
        h = _splitmix(h ^ (word & _M64))
        while word >> 64:  # a seed wider than 64 bits: every bit counts
            word >>= 64
            h = _splitmix(h ^ (word & _M64))
    return h & 0xFFFFFFFF, _splitmix(h ^ 1), _splitmix(h ^ 2)


def _entropy(rng: np.random.Generator) -> list[int]:
    """The words ``rng`` was seeded from: its SeedSequence's entropy, then its spawn key."""
    seq = rng.bit_generator.seed_seq
    entropy = getattr(seq, "entropy", None)
    words = list(entropy) if isinstance(entropy, (list, tuple)) else [entropy or 0]
    return words + [int(k) for k in getattr(seq, "spawn_key", ())]


def seed_globals(rng: np.random.Generator) -> None:
    """Seed numpy's global RNG, Python's ``random`` and (when imported) torch's CPU generator
    from the seed sequence of ``rng`` (``SeedSequence([seed, epoch, index])``); its cost is in
    benchmarks/README.md#seeding."""
    numpy_seed, random_seed, torch_seed = global_seeds(_entropy(rng))
    np.random.seed(numpy_seed)
    random.seed(random_seed)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        torch.default_generator.manual_seed(torch_seed)
    else:
        _STATE["torch_seed"] = torch_seed
        _watch_torch()


def _global_states() -> tuple[Any, Any, Any]:
    """The global RNGs' states (numpy, random, torch CPU or None), to put back afterwards."""
    torch = sys.modules.get("torch")
    saved = torch.get_rng_state() if torch is not None and hasattr(torch, "get_rng_state") else None
    return np.random.get_state(), random.getstate(), saved


def _restore(states: tuple[Any, Any, Any]) -> None:
    np.random.set_state(states[0])
    random.setstate(states[1])
    torch = sys.modules.get("torch")
    if states[2] is not None and torch is not None:
        torch.set_rng_state(states[2])


@contextmanager
def user_states_kept(active: bool = True) -> Iterator[None]:
    """Save the user's global RNG states once around many ``seeded`` samples (a batch) and
    put them back at the end: saving numpy's costs far more than seeding it. Nothing in a
    worker process, or when not ``active``."""
    if not active or _STATE["worker"] or _STATE["kept"]:
        yield
        return
    saved = _global_states()
    _STATE["kept"] = True
    try:
        yield
    finally:
        _STATE["kept"] = False
        _restore(saved)


@contextmanager
def seeded(rng: np.random.Generator) -> Iterator[None]:
    """Run the body (a user's callable on one sample) with the global RNGs seeded from
    ``rng``; outside a worker process the user's global states are put back afterwards (at
    the end of the enclosing ``user_states_kept``, if any)."""
    saved = None if _STATE["worker"] or _STATE["kept"] else _global_states()
    seed_globals(rng)
    try:
        yield
    finally:
        _STATE["torch_seed"] = None  # torch imported after this sample: not seeded by it
        if saved is not None:
            _restore(saved)


def _watch_torch() -> None:
    """Seed torch the moment it is imported, if a sample is being loaded then (its seed is
    ``_STATE["torch_seed"]``); watched once per process."""
    if not _STATE["hook"]:
        _STATE["hook"] = True
        after_import("torch", _seed_imported_torch)


def _seed_imported_torch(torch: ModuleType) -> None:
    """Seed a just-imported torch's CPU generator for the current sample (if any)."""
    seed = _STATE["torch_seed"]
    if seed is not None and hasattr(torch, "default_generator"):
        torch.default_generator.manual_seed(seed)
