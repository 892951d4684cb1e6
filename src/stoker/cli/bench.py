"""``stoker bench``: the loader's throughput next to this machine's decode ceiling for the same
data and work, CPU time and memory per image, and which stage is the bottleneck; ``--plot``
draws the measured epochs (``plot.py``)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..decode import decoder_name, jpegcrop
from ..errors import ConfigError
from ..loader import Loader, config
from ..workers.jobs import map_jobs
from .plot import Batch, bench_chart


def tree_pss() -> int:
    """Proportional set size of this process and its children, in bytes."""
    total = 0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_full_info().pss
        except (psutil.Error, AttributeError):
            continue
    return total


def tree_cpu() -> float:
    """CPU seconds (user + system) used so far by this process, its live children and the
    children it has already reaped."""
    me = psutil.Process()
    own = me.cpu_times()
    total = own.children_user + own.children_system
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def single_core_rate(loader: Loader, seconds: float = 3.0) -> float:
    """Images/s of read + decode + transform in this process, pinned to one core with OpenCV
    on one thread (as in a worker)."""
    import cv2

    threads, cpus = cv2.getNumThreads(), os.sched_getaffinity(0)
    cv2.setNumThreads(1)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        return _rate(loader, seconds)
    finally:
        cv2.setNumThreads(threads)
        os.sched_setaffinity(0, cpus)


def _rate(loader: Loader, seconds: float) -> float:
    asm = loader.recipe.assembler()
    arrays = loader.slot_layout.arrays()
    asm.fill(0, 0, arrays)  # warm-up
    done, t0, batch = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        batch = (batch + 1) % len(loader)
        done += asm.fill(0, batch, arrays).count
    return done / (time.perf_counter() - t0)


def _pinned_rate(job: tuple[Any, dict[str, Any], int, float]) -> float:
    """In a worker process: one core's rate, pinned to ``core``."""
    source, options, core, seconds = job
    os.sched_setaffinity(0, {core})
    with Loader(source, workers=0, **options) as loader:
        return single_core_rate(loader, seconds)


def busy_cores_rate(
    source: Any, options: dict[str, Any], count: int, seconds: float = 4.0
) -> list[float]:
    """Rates of ``count`` pinned processes decoding at the same time, one per core.

    This is the ceiling that counts: a core may clock higher while the others idle, so one
    core's rate times N overstates what N busy cores can do.
    """
    cores = sorted(os.sched_getaffinity(0))[:count]
    jobs = [(source, options, c, seconds) for c in cores]
    rates = dict(map_jobs(_pinned_rate, jobs, len(cores)))
    return [rates[i] for i in range(len(jobs))]


PROGRESS_EVERY_S = 5.0  # a progress line at least this often during a long epoch


def _silent(line: str) -> None:
    """No progress output (the default of :func:`run_bench`)."""


def _epoch(
    loader: Loader,
    max_batches: int,
    label: str = "",
    progress: Callable[[str], None] = _silent,
    timeline: Timeline | None = None,
) -> tuple[int, float, float]:
    """One epoch (or ``max_batches`` of it): ``(images, seconds, CPU seconds)``; each batch's
    arrival and wait go to ``timeline`` when given."""
    cpu0, t0, n = tree_cpu(), time.perf_counter(), 0
    total = min(len(loader), max_batches) if max_batches else len(loader)
    last = ready = t0
    if timeline is not None:
        timeline.epoch_starts.append(timeline.elapsed)
    for i, (x, _) in enumerate(loader):
        n += len(x)
        now = time.perf_counter()
        if timeline is not None:
            timeline.batches.append(Batch(timeline.elapsed + now - t0, len(x), now - ready))
        if now - last >= PROGRESS_EVERY_S:
            last = now
            progress(
                f"stoker bench: {label}: {i + 1}/{total} batches, "
                f"{n / (now - t0):,.0f} img/s so far"
            )
        if max_batches and i + 1 >= max_batches:
            break
        ready = time.perf_counter()
    seconds = time.perf_counter() - t0
    if timeline is not None:
        timeline.elapsed += seconds
    return n, seconds, tree_cpu() - cpu0


@dataclass
class Timeline:
    """The measured epochs batch by batch, for ``--plot``: times count seconds inside the
    measured epochs only (the pauses between them, for memory readings, are left out)."""

    elapsed: float = 0.0
    batches: list[Batch] = field(default_factory=list)
    epoch_starts: list[float] = field(default_factory=list)


def run_bench(
    source: Any,
    *,
    batch_size: int = 256,
    image_size: int = 224,
    augment: Any = "train",
    workers: Any = "auto",
    epochs: int = 3,
    max_batches: int = 0,
    progress: Callable[[str], None] = _silent,
    plot: str | os.PathLike[str] | None = None,
) -> str:
    """Run the benchmark and return its report; ``progress`` gets a line per step (and every
    few seconds of a long epoch) while it measures. ``plot``: also draw the measured epochs
    (img/s over time, the wait share, the decode ceiling) as a PNG there."""
    if plot is not None and not str(plot).lower().endswith(".png"):
        raise ConfigError(f"--plot {plot}: the chart is written as PNG; name it *.png")
    options = {"batch_size": batch_size, "image_size": image_size, "augment": augment}
    progress("stoker bench: one core's rate, in this process (3 s)")
    with Loader(source, workers=0, **options) as probe:
        one = single_core_rate(probe)
    cores = config.usable_cpus()
    with Loader(
        source, batch_size=batch_size, image_size=image_size, augment=augment, workers=workers
    ) as loader:
        progress(f"stoker bench: warm-up epoch ({len(loader)} batches; workers start)")
        _epoch(loader, max_batches, "warm-up", progress)  # worker start, page cache
        runs, peak = [], 0
        count = max(1, epochs)
        timeline = Timeline()
        for k in range(count):
            runs.append(_epoch(loader, max_batches, f"epoch {k + 1}/{count}", progress, timeline))
            peak = max(peak, tree_pss())
            n, dt, _ = runs[-1]
            progress(f"stoker bench: epoch {k + 1}/{count}: {n / dt:,.0f} img/s")
        report = loader.stats()
    rates = [n / dt for n, dt, _ in runs]
    rate = statistics.median(rates)
    cpu_ms = 1000 * sum(c for _, _, c in runs) / sum(n for n, _, _ in runs)
    used = min(cores, max(1, loader.workers))
    progress(f"stoker bench: ceiling, {used} pinned core(s) decoding at once (4 s)")
    busy = busy_cores_rate(source, options, used)
    ceiling = sum(busy)
    stages = {"read": report.read_ms, "decode": report.decode_ms, "transform": report.transform_ms}
    slowest = max(stages, key=stages.__getitem__)
    plotted = []
    if plot is not None:
        bench_chart(
            timeline.batches,
            ceiling,
            timeline.epoch_starts,
            plot,
            f"stoker bench {source}: batch {batch_size}, image {image_size}, "
            f"augment {augment}, workers {loader.workers}",
        )
        plotted = [f"  plot: {plot}"]
    return "\n".join(
        [
            f"stoker bench {source}: batch {batch_size}, image {image_size}, augment {augment}, "
            f"workers {loader.workers}",
            f"  JPEG decoder: {decoder_name()}"
            + ("" if jpegcrop.AVAILABLE else "; the ceiling below uses the same slower decoder"),
            f"  throughput: {rate:,.0f} img/s (median of {len(runs)} epochs: "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + ")",
            f"  ceiling: {used} busy cores decode {ceiling:,.0f} img/s ("
            + " + ".join(f"{r:,.0f}" for r in busy)
            + f"); ratio {rate / ceiling:.2f}. One core alone: {one:,.0f} img/s",
            f"  CPU per image: {cpu_ms:.2f} ms (whole process tree); "
            f"peak PSS {peak / 2**20:,.0f} MiB",
            "  stage time per image: "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in stages.items())
            + f"; slowest: {slowest}",
            f"  consumer waited {report.wait_share:.0%} of the time (no compute here, so ~100% "
            "is expected); in training, stats() tells whether input is the bottleneck",
            *plotted,
        ]
    )
