"""``stoker bench``: the loader's throughput next to this machine's decode ceiling for the same
data and work, CPU time and memory per image, and which stage is the bottleneck; ``--plot``
draws the measured epochs (``plot.py``).

A timed epoch counts only the batches made inside it. When it starts, the prefetch ring may
already hold batches made during the warm-up or the pause before it (up to every slot but the
one the consumer holds: :func:`made_ahead`), so the first that many batches of each epoch are
taken but not counted, and its rate is a lower bound of what the workers made in it. An epoch of
no more batches than that cannot be timed and is refused; one shorter than ``PRECISE`` times
that count is measured with a warning naming the count it needs.

A bucket (``stoker bench s3://bucket/shards``) is measured the same way as a disk; its report
adds what the requests cost (``stats().requests``: GETs/s and per image, MB/s and bytes fetched
per byte decoded, latency median and p99, retries, throttling replies).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil

from ..decode import decoder_name, jpegcrop
from ..errors import ConfigError
from ..loader import Loader, config
from ..requeststats import request_lines
from ..workers.engine import HELD
from ..workers.jobs import map_jobs
from .outputs import output_file
from .plot import Arrival, bench_chart


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
    arrays = loader.recipe.schema.slot_layout.arrays()
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
PRECISE = 10  # an epoch of this many times the batches made ahead is timed within 10 %


def _silent(line: str) -> None:
    """No progress output (the default of :func:`run_bench`)."""


def made_ahead(loader: Loader) -> int:
    """Batches that may be ready, or in the making, when a timed epoch starts: every slot of
    the prefetch ring but the one the consumer still holds (none when batches are filled on
    demand in this process). A batch after them needs a slot the epoch frees, so it is made
    inside the epoch."""
    depth = loader.stats().prefetch
    return depth + HELD - 1 if depth else 0


@dataclass
class Timeline:
    """The measured epochs batch by batch, for ``--plot``: times count seconds inside the
    measured epochs only (the pauses between them, for memory readings, are left out); a batch
    made ahead of its epoch is drawn with no images, as it is not counted."""

    elapsed: float = 0.0
    batches: list[Arrival] = field(default_factory=list)
    epoch_starts: list[float] = field(default_factory=list)


@dataclass
class Epoch:
    """One timed epoch: images counted (made inside it) and taken, seconds, CPU seconds, and
    the batches made ahead of it (taken, not counted)."""

    counted: int
    taken: int
    seconds: float
    cpu: float
    ahead: int

    @property
    def rate(self) -> float:
        """Images per second made inside the epoch."""
        return self.counted / self.seconds


def _epoch(
    batches: Iterator[tuple[Any, Any]],
    size: int,
    ahead: int,
    label: str = "",
    progress: Callable[[str], None] = _silent,
    timeline: Timeline | None = None,
) -> Epoch:
    """Take ``size`` batches from ``batches``; the first ``ahead`` are taken, not counted."""
    cpu0, t0 = tree_cpu(), time.perf_counter()
    counted = taken = 0
    last = ready = t0
    if timeline is not None:
        timeline.epoch_starts.append(timeline.elapsed)
    for i in range(size):
        x, _ = next(batches)
        taken += len(x)
        mine = len(x) if i >= ahead else 0
        counted += mine
        now = time.perf_counter()
        if timeline is not None:
            timeline.batches.append(Arrival(timeline.elapsed + now - t0, mine, now - ready))
        if now - last >= PROGRESS_EVERY_S:
            last = now
            progress(
                f"stoker bench: {label}: {i + 1}/{size} batches, "
                f"{counted / (now - t0):,.0f} img/s so far"
            )
        ready = time.perf_counter()
    seconds = time.perf_counter() - t0
    if timeline is not None:
        timeline.elapsed += seconds
    return Epoch(counted, taken, seconds, tree_cpu() - cpu0, ahead)


def check_epoch(size: int, ahead: int, images: int, max_batches: int, workers: int) -> str:
    """Refuse an epoch of ``size`` batches that cannot be timed (no more than the ``ahead``
    made before it starts); for one shorter than ``PRECISE`` x ``ahead``, the warning line."""
    need = PRECISE * ahead
    if size >= need:
        return ""
    if max_batches and max_batches < need:
        fix = f"--max-batches {need} or more"
    elif images >= need:
        fix = f"a --batch-size of at most {images // need} for {images} images, or fewer --workers"
    else:
        fix = f"at least {need} images at --batch-size 1, or fewer --workers"
    ring = f"the prefetch ring of {workers} worker{'s' if workers != 1 else ''}"
    if size <= ahead:
        raise ConfigError(
            f"cannot time an epoch of {size} batch{'es' if size != 1 else ''}"
            + (f" (--max-batches {max_batches})" if max_batches else "")
            + f": up to {ahead} batches are made ahead of an epoch by {ring}, and only the "
            f"batches made inside it are counted; an epoch needs more than {ahead} batches to "
            f"count any, and at least {need} for a rate within 10%: {fix}"
        )
    return (
        f"  warning: short epochs: up to {ahead} of each {size} batches are made ahead of the "
        f"epoch by {ring} and not counted, so the rate is a lower bound, up to "
        f"{ahead / size:.0%} low; time at least {need} batches an epoch for a rate within "
        f"10%: {fix}"
    )


@dataclass
class Measured:
    """What ``stoker bench`` measured; ``report()`` is its text, ``draw(path)`` its chart."""

    title: str
    epochs: list[Epoch]
    warning: str
    one_core: float
    busy: list[float]
    peak_pss: int
    stages: dict[str, float]
    wait_share: float
    timeline: Timeline
    #: ``stats().requests`` of the timed run: what reading a bucket cost ({} on a disk)
    requests: dict = field(default_factory=dict)

    @property
    def ceiling(self) -> float:
        """Images/s of the busy cores decoding at once."""
        return sum(self.busy)

    def report(self) -> str:
        """The report, line by line."""
        rates = [e.rate for e in self.epochs]
        rate = statistics.median(rates)
        cpu_ms = 1000 * sum(e.cpu for e in self.epochs) / sum(e.taken for e in self.epochs)
        slowest = max(self.stages, key=self.stages.__getitem__)
        ahead = max(e.ahead for e in self.epochs)
        counted = (
            f"; the first {ahead} batches of each epoch, made ahead of it, are not counted"
            if ahead
            else ""
        )
        lines = [
            self.title,
            f"  JPEG decoder: {decoder_name()}"
            + ("" if jpegcrop.AVAILABLE else "; the ceiling below uses the same slower decoder"),
            f"  throughput: {rate:,.0f} img/s (median of {len(rates)} epochs: "
            + ", ".join(f"{r:,.0f}" for r in rates)
            + counted
            + ")",
            f"  ceiling: {len(self.busy)} busy cores decode {self.ceiling:,.0f} img/s ("
            + " + ".join(f"{r:,.0f}" for r in self.busy)
            + f"); ratio {rate / self.ceiling:.2f}. One core alone: {self.one_core:,.0f} img/s",
            f"  CPU per image: {cpu_ms:.2f} ms (whole process tree); "
            f"peak PSS {self.peak_pss / 2**20:,.0f} MiB",
            "  stage time per image: "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in self.stages.items())
            + f"; slowest: {slowest}",
            f"  consumer waited {self.wait_share:.0%} of the time (no compute here, so ~100% "
            "is expected); in training, stats() tells whether input is the bottleneck",
        ]
        lines += request_lines(self.requests, storage_bound=False)
        return "\n".join(lines + ([self.warning] if self.warning else []))

    def draw(self, plot: str | os.PathLike[str]) -> None:
        """The chart of the measured epochs beside the ceiling, as a PNG at ``plot``."""
        t = self.timeline
        bench_chart(t.batches, self.ceiling, t.epoch_starts, plot, self.title)


def measure(
    source: Any,
    *,
    batch_size: int = 256,
    image_size: int = 224,
    augment: Any = "train",
    workers: Any = "auto",
    epochs: int = 3,
    max_batches: int = 0,
    progress: Callable[[str], None] = _silent,
) -> Measured:
    """Run the benchmark: a warm-up epoch, ``epochs`` timed ones (each ``max_batches`` long
    when given, else a whole epoch), one core's rate and the busy cores' ceiling."""
    options = {
        "batch_size": batch_size,
        "image_size": image_size,
        "augment": augment,
        "drop_last": False,  # the last, partial batch counts its own images
    }
    with Loader(source, workers=workers, **options) as loader:
        size = min(len(loader), max_batches) if max_batches else len(loader)
        title = (
            f"stoker bench {source}: batch {batch_size}, image {image_size}, augment {augment}, "
            f"workers {loader.run.workers}"
        )
        batches = loader.stream()
        try:
            progress(f"stoker bench: warm-up epoch ({size} batches; workers start)")
            _epoch(batches, size, 0, "warm-up", progress)  # worker start, page cache
            ahead = made_ahead(loader)
            warning = check_epoch(
                size, ahead, len(loader.recipe.source), max_batches, loader.run.workers
            )
            runs, peak, timeline = [], 0, Timeline()
            count = max(1, epochs)
            for k in range(count):
                label = f"epoch {k + 1}/{count}"
                runs.append(_epoch(batches, size, made_ahead(loader), label, progress, timeline))
                peak = max(peak, tree_pss())
                progress(f"stoker bench: {label}: {runs[-1].rate:,.0f} img/s")
        finally:
            batches.close()  # type: ignore[attr-defined]
        report = loader.stats()
    progress("stoker bench: one core's rate, in this process (3 s)")
    with Loader(source, workers=0, **options) as probe:
        one = single_core_rate(probe)
    used = min(config.usable_cpus(), max(1, loader.run.workers))
    progress(f"stoker bench: ceiling, {used} pinned core(s) decoding at once (4 s)")
    busy = busy_cores_rate(source, options, used)
    stages = {"read": report.read_ms, "decode": report.decode_ms, "transform": report.transform_ms}
    return Measured(
        title,
        runs,
        warning,
        one,
        busy,
        peak,
        stages,
        report.wait_share,
        timeline,
        report.requests,
    )


def run_bench(
    source: Any,
    *,
    plot: str | os.PathLike[str] | None = None,
    on_report: Callable[[str], None] = _silent,
    **settings: Any,
) -> str:
    """Run the benchmark (``settings``: those of :func:`measure`, ``progress`` a callable that
    gets a line per step while it measures) and return its report. ``plot``: also draw the
    measured epochs (img/s over time, the wait share, the decode ceiling) as a PNG there; the
    path is checked before anything is measured. ``on_report`` gets the report as soon as it is
    measured, before the chart is drawn, so a chart that cannot be written loses no report."""
    if plot is not None:
        output_file("--plot", plot, ".png", "the chart")
    measured = measure(source, **settings)
    report = measured.report()
    on_report(report)
    if plot is None:
        return report
    measured.draw(plot)
    return report + f"\n  plot: {plot}"
