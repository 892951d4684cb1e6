"""Validate the Loader's keyword arguments up front, with messages that say how to fix them,
and make the sized choices (``workers="auto"``, prefetch depth) with their reasons."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np
import psutil

from ..decode.common import DEFAULT_MAX_PIXELS as DEFAULT_MAX_PIXELS  # the Loader's default
from ..errors import ConfigError, user_stacklevel, warn
from ..order import SPLITS
from ..sources.fetchpolicy import DEFAULT_RATE
from ..sources.readahead import PAGE_CACHE, ReadSettings
from ..stats import AUTO_NONE
from . import ranks

START_METHODS = ("spawn",)


DEFAULT_IMAGE_SIZE = 224


def image_size(value: Any) -> tuple[int, int] | None:
    """``224`` or ``(height, width)`` as a tuple of positive ints; ``None`` (the default) stays
    None: the images' own size for a source of decoded arrays, else 224 (``sized``)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return (value, value)
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return (int(value[0]), int(value[1]))
    raise ConfigError(
        f"image_size={value!r}: give a positive int (224), (height, width), or None (the "
        "arrays' own size; 224 for image files)"
    )


def sized(size: tuple[int, int] | None, pixels: tuple[int, int] | None) -> tuple[int, int]:
    """The output size of a resolved ``image_size``: as given, else the arrays' own size
    (``pixels``), else 224."""
    if size is not None:
        return size
    return pixels if pixels is not None else (DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)


def augment(value: Any, pixels: tuple[int, int] | None, subset: Any = None) -> Any:
    """``augment="auto"`` (the default): ``"train"`` (random crop + flip) for image files,
    ``"eval"`` for their ``subset="validation"``, None (no random change) for a source of
    decoded arrays, which are usually the model's input as they are (and a flip would be
    wrong for positional targets)."""
    if isinstance(value, str) and value == "auto":
        if pixels is not None:
            return None
        return "eval" if subset == "validation" else "train"
    return value


#: Loader options that ``subset="both"`` may give each half of (a dict by half).
PER_HALF = ("augment", "batch_transform")
HALVES = ("training", "validation")


def per_half(kwargs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``subset="both"``: each half's keyword arguments, a ``PER_HALF`` option given as a dict
    ``{"training": ..., "validation": ...}`` split between them (a half left out gets the
    option's default)."""
    halves: dict[str, dict[str, Any]] = {half: dict(kwargs) for half in HALVES}
    for name in PER_HALF:
        value = kwargs.get(name)
        if not isinstance(value, dict):
            continue
        wrong = [k for k in value if k not in HALVES]
        if wrong or not value:
            raise ConfigError(
                f"{name}={value!r}: with subset='both', a dict gives each half its own "
                f"{name}; its keys are 'training' and 'validation' (not {wrong or 'none'})"
            )
        for half in HALVES:
            if half in value:
                halves[half][name] = value[half]
            else:
                halves[half].pop(name)
    return halves


def no_per_half(kwargs: dict[str, Any]) -> None:
    """A dict of per-half options is refused for one loader: it needs ``subset="both"``."""
    for name in PER_HALF:
        value = kwargs.get(name)
        if isinstance(value, dict) and value and set(value) <= set(HALVES):
            raise ConfigError(
                f"{name}={{'training': ..., 'validation': ...}} gives each half of "
                "subset='both' its own; pass subset='both' (with validation_split=), or a "
                f"single {name} for this loader"
            )


def positive_int(name: str, value: Any) -> int:
    """A positive int, or a ConfigError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name}={value!r}: must be a positive integer")
    return int(value)


def fast_decode(value: Any) -> bool | None:
    """Check ``fast_decode``: True or False as given, None for "auto" (``fast_for``)."""
    if isinstance(value, str) and value == "auto":
        return None
    if isinstance(value, bool):
        return value
    raise ConfigError(f"fast_decode={value!r}: use True, False or 'auto' (True for 'train')")


def fast_for(given: bool | None, augment: Any) -> bool:
    """Resolve a checked ``fast_decode``: "auto" (None) is True for ``augment="train"`` (also
    when ops follow it, ``["train", op, ...]``) only.

    The fast integer IDCT and plain chroma upsampling change a few pixel values by a level or
    two, far less than a random crop and flip change them, and decode a little faster (see
    benchmarks/README.md#crop-window-decode); evaluation and plain resizing keep libjpeg's
    accurate, reference-identical decode."""
    if given is not None:
        return given
    if isinstance(augment, (list, tuple)) and augment:
        augment = augment[0]
    return isinstance(augment, str) and augment == "train"


def usable_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


AUTO_MAX_WORKERS = 32  # the most workers "auto" starts, however many cores the host has
HEADROOM_ABOVE = 8  # hosts with more usable cores than this ...
HEADROOM_EVERY = 8  # ... leave one core in this many to the training process


def auto_count(cpus: int) -> tuple[int, str]:
    """``workers="auto"``'s count on a host with ``cpus`` usable cores, and the reason.

    One worker per usable core, except that a host with more than ``HEADROOM_ABOVE`` cores
    leaves one core in ``HEADROOM_EVERY`` to the training process (its step, the framework's
    own threads, the consumer that hands batches on), and never more than
    ``AUTO_MAX_WORKERS``. A pure function of the count: the one rule, at construction and at
    the first batch."""
    cpus = max(1, cpus)
    if cpus <= HEADROOM_ABOVE:
        return cpus, f"one per usable CPU core ({cpus})"
    kept = cpus // HEADROOM_EVERY
    count = min(cpus - kept, AUTO_MAX_WORKERS)
    why = f"{count} of {cpus} usable CPU cores, one in {HEADROOM_EVERY} left to the training "
    why += "process"
    if count == AUTO_MAX_WORKERS:
        why += f", at most {AUTO_MAX_WORKERS}"
    return count, why


def workers(value: Any) -> tuple[int, str]:
    """Worker count and the reason for it (``check_workers``, then ``worker_count``)."""
    return worker_count(check_workers(value))


def check_workers(value: Any) -> Any:
    """``workers``: "auto" or a count up to ``MAX_WORKERS_PER_CORE`` per usable core (warned
    past one per core, at the user's line); returned as given."""
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(f"workers={value!r}: use 'auto', 0 (load in this process) or a count")
    value, cpus = int(value), usable_cpus()
    if value > MAX_WORKERS_PER_CORE * cpus:
        raise ConfigError(
            f"workers={value}: more than {MAX_WORKERS_PER_CORE} per usable CPU core ({cpus} here, "
            f"so at most {MAX_WORKERS_PER_CORE * cpus}); each worker is a process of its own "
            f"(~{WORKER_MIB} MiB and a start-up), and past the cores they add no speed. "
            "Use workers='auto'"
        )
    if value > cpus:
        warn(
            f"workers={value} is more than the {cpus} usable CPU cores: the extra "
            f"{value - cpus} workers add no decoding speed but cost about {WORKER_MIB} MiB of "
            f"memory each ({(value - cpus) * WORKER_MIB} MiB) and a slower start; use "
            "workers='auto' unless your samples wait on slow storage"
        )
    return value


def worker_count(value: Any) -> tuple[int, str]:
    """The count a checked ``workers`` value starts, and the reason for it."""
    if value == "auto":
        count, why = auto_count(usable_cpus())
        return count, f"auto: {why}"
    return int(value), "set by you" if value else "in the calling process (workers=0)"


def worker_threads(value: Any) -> int | None:
    """Threads per pool (torch, OpenMP/BLAS, OpenCV, TensorFlow, XLA) in each worker: a
    positive int (1, the default: the workers are the parallelism) or None (each library's own
    default, the environment as the trainer has it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(
            f"worker_threads={value!r}: give the threads each worker's pools may use, a positive "
            "integer (1, the default), or None to leave each library's own default"
        )
    return int(value)


MAX_WORKERS_PER_CORE = 4
WORKER_MIB = 45  # typical resident memory of one idle worker (numpy + OpenCV imported)


def seed(value: Any) -> int:
    """A non-negative integer seed (numpy integers too); never truncated or parsed."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ConfigError(
            f"seed={value!r}: give a non-negative integer (seed=0); the same seed gives the same "
            "batches"
        )
    return int(value)


def timeout(value: Any) -> float:
    """Seconds to wait for a batch before WorkerHung: a positive number (inf: no limit)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not value > 0
    ):
        raise ConfigError(
            f"timeout={value!r}: give the seconds to wait for a batch before a worker counts as "
            "hung, a number > 0 (timeout=300; float('inf') for no limit)"
        )
    return float(value)


def listing_ttl(value: Any) -> float:
    """Seconds a cached bucket listing is trusted: a number >= 0 (0: list every time)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not value >= 0
    ):
        raise ConfigError(
            f"listing_ttl={value!r}: give the seconds a cached bucket listing is used without "
            "listing the prefix again, a number >= 0 (listing_ttl=600; 0 lists every time)"
        )
    return float(value)


def flag(name: str, value: Any, allow_none: bool = False) -> Any:
    """A True/False argument (numpy bools too); ``None`` where it means "the default"."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    fix = "True, False or None (the default)" if allow_none else "True or False"
    raise ConfigError(f"{name}={value!r}: give {fix}")


def prefetch_arg(value: Any) -> Any:
    """``"auto"`` or a positive int, checked before anything starts."""
    if not (isinstance(value, str) and value == "auto"):
        positive_int("prefetch", value)
    return value


CHEAP_BATCH_S = 0.02  # below this much work per batch, worker processes cost more than they give


def auto_workers(per_image_s: float | None, batch_size: int, probed: int) -> tuple[int, str]:
    """``workers="auto"`` from the measured cost of a sample: one worker per usable core, or
    none (load in the calling process) when a whole batch is too little work for processes to
    pay for themselves: their start-up, a message per batch, and the cores they take from the
    training step."""
    count, why = auto_count(usable_cpus())
    if per_image_s is None:
        return count, f"auto: {why}"
    batch_s = per_image_s * batch_size
    measured = f"{per_image_s * 1e3:.3f} ms/img measured on {probed} samples"
    if batch_s < CHEAP_BATCH_S:
        return 0, (
            f"{AUTO_NONE}, loading in this process: a batch is {batch_s * 1e3:.1f} ms of work "
            f"({measured}), less than worker processes cost to start and feed"
        )
    if count == 1:
        return 1, f"auto: 1, the only usable core; a batch is {batch_s * 1e3:.0f} ms ({measured})"
    return count, (
        f"auto: {count}, {why}; a batch is {batch_s * 1e3:.0f} ms of one core's work ({measured})"
    )


def max_errors(value: Any) -> int | float:
    """Check the bad-sample budget: a count (an int >= 0) or a fraction in [0, 1)."""
    if isinstance(value, bool):
        raise ConfigError(f"max_errors={value!r}: give a count (10) or a fraction (0.001)")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and 0.0 <= value < 1.0:
        return value
    raise ConfigError(f"max_errors={value!r}: give a count (10) or a fraction in [0, 1) (0.001)")


def error_count(budget: int | float, n: int) -> int:
    """A checked budget as a count: an int as is, a fraction of ``n`` samples rounded up."""
    return budget if isinstance(budget, int) else math.ceil(budget * n)


def prefetch(value: Any, count: int, held: int, slot_bytes: int) -> tuple[int, int, int, str]:
    """``(per_worker, deepest, slots, reason)``: batches in flight per worker to start with,
    the most the engine may deepen that to, and slots in the ring.

    ``"auto"`` starts at 1 per worker, not 2: while the consumer waits for its next batch it
    hands each worker its next task at once, so a deeper ring only holds memory (a slot is a
    whole batch: 38 MB at 256 x 224 x 224 x 3). The engine deepens to 2 per worker when it
    measures workers waiting for work while the consumer waited for batches (a training step
    long enough for a worker to finish and sit idle), within a quarter of available memory."""
    if value != "auto":
        depth = positive_int("prefetch", value)
        per_worker = max(1, math.ceil(depth / count))
        return per_worker, per_worker, depth + held, "set by you"
    budget = psutil.virtual_memory().available // 4
    for deepest in (2, 1):
        if (deepest * count + held) * slot_bytes <= budget:
            slots = count + held
            why = f"auto: 1 per worker, {slots * slot_bytes / 2**20:.0f} MiB ring"
            if deepest > 1:
                why += f" (up to {deepest} per worker when the workers are measured waiting)"
            return 1, deepest, slots, why
    raise ConfigError(
        f"a batch takes {slot_bytes / 2**20:.0f} MiB and {count + held} of them do not fit in a "
        f"quarter of available memory ({budget / 2**20:.0f} MiB): lower batch_size or workers"
    )


def read_settings(
    read_ahead: Any, page_cache: Any, timeout: float, request_rate: float = DEFAULT_RATE
) -> ReadSettings:
    """The read settings of checked ``read_ahead`` and ``page_cache``; each read's deadline is a
    quarter of ``timeout`` (at most 60 s), so a file that never answers is a bad sample, not a
    hung worker."""
    return ReadSettings(
        window=check_read_ahead(read_ahead),
        timeout=min(60.0, timeout / 4),
        page_cache=check_page_cache(page_cache),
        request_rate=request_rate,
    )


def request_rate(value: Any) -> float:
    """``request_rate``: requests/s per prefix of an object store, a number > 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not value > 0
    ):
        raise ConfigError(
            f"request_rate={value!r}: give the most requests per second to one prefix of an "
            f"object store, a number > 0 (default {DEFAULT_RATE:g}, below S3's ~5,500/s and "
            "GCS's ~5,000/s)"
        )
    return float(value)


def check_read_ahead(value: Any) -> Any:
    """``read_ahead``: "auto", or reads in flight per worker (0 = off)."""
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(
            f"read_ahead={value!r}: give 'auto', a number of reads in flight per worker "
            "(8), or 0 to read each sample only when it is decoded"
        )
    return value


def check_page_cache(value: Any) -> Any:
    """``page_cache``: "auto", "keep" or "drop"."""
    if value not in PAGE_CACHE:
        raise ConfigError(
            f"page_cache={value!r}: give 'auto' (drop the pages of files already read "
            "when the dataset does not fit in RAM), 'keep' or 'drop'"
        )
    return value


def start_method(value: Any) -> str | None:
    """Deprecated (removed in 0.3; None: not given): 'spawn' is the only start method, each
    worker a fresh interpreter started from stoker's own entry point (never the user's
    script). 'fork' is unsafe with threads; 'forkserver' is not offered: its server re-imports
    the user's script."""
    if value is None:
        return None
    if value not in START_METHODS:
        raise ConfigError(
            f"start_method={value!r}: only 'spawn' is supported (the default; drop the "
            "argument): workers are fresh interpreters started from stoker's own entry point, "
            "which never re-run your script; 'fork' is unsafe once threads (of torch, tf, jax "
            "or the loader) are running"
        )
    warnings.warn(
        "Loader(start_method=) is deprecated and will be removed in stoker 0.3: 'spawn' is "
        "the only start method; drop the argument",
        DeprecationWarning,
        stacklevel=user_stacklevel(),
    )
    return str(value)


def rank_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """Explicit rank/world_size, else the distributed runtime's (``ranks.detect``), else
    (0, 1)."""
    if rank is None and world_size is None:
        return ranks.detect()
    if rank is None or world_size is None:
        raise ConfigError("give both rank= and world_size=, or neither")
    world = positive_int("world_size", world_size)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ConfigError(f"rank={rank!r}: must be an int in [0, world_size={world})")
    return rank, world


def check_rank_split(value: Any) -> str:
    """``rank_split``: "pad", "drop" or "once" (see ``order.SPLITS``)."""
    if not isinstance(value, str) or value not in SPLITS:
        raise ConfigError(
            f"rank_split={value!r}: use 'pad' (equal counts, the order wrapped round, as "
            "DistributedSampler), 'drop' (equal counts, the tail dropped) or 'once' (every "
            "sample on exactly one rank, for evaluation)"
        )
    return value
