"""Wait-time and per-stage accounting, and the report that answers "is my GPU waiting?"."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .assemble import Report

INPUT_BOUND = 0.10  # waiting more than this share of wall time means the input is the bottleneck


@dataclass
class StatsReport:
    """A snapshot of a loader's counters; ``print()`` it for a readable summary."""

    images: int
    batches: int
    elapsed_s: float
    first_batch_s: float
    wait_s: float
    wait_share: float
    images_per_s: float
    read_ms: float
    decode_ms: float
    transform_ms: float
    skipped: int
    bad_files: list[tuple[str, str]]
    workers: int
    workers_reason: str
    prefetch: int
    prefetch_reason: str
    kept_batches: int
    memory_folder: str
    notes: list[str] = field(default_factory=list)
    #: (name, message) of files that decoded despite recoverable corrupt data (libjpeg
    #: warnings): kept in the batch, not skipped.
    warned_files: list[tuple[str, str]] = field(default_factory=list)
    #: The JPEG decoder in use (the crop-window C extension, or simplejpeg without it).
    decoder: str = ""
    #: Seconds the slowest worker took to start (0 without workers), and the parts of it.
    startup_s: float = 0.0
    startup: str = ""

    @property
    def bottleneck(self) -> str:
        """'input' when the consumer waited a lot for data, else 'compute'."""
        if self.batches == 0:
            return "unknown"
        return "input" if self.wait_share > INPUT_BOUND else "compute"

    def __str__(self) -> str:
        lines = [
            f"stoker: {self.images} images in {self.batches} batches, {self.elapsed_s:.2f} s; "
            f"{self.images_per_s:,.0f} img/s after the first batch",
            f"  first batch after {self.first_batch_s:.2f} s; after it, waited "
            f"for data {self.wait_s:.2f} s = {self.wait_share:.1%} of the time"
            f" -> bottleneck: {self.bottleneck}",
            *([f"  {self.startup}"] if self.startup else []),
            f"  per image (worker time): read {self.read_ms:.2f} ms, decode {self.decode_ms:.2f} "
            f"ms, transform {self.transform_ms:.2f} ms",
            f"  workers: {self.workers} ({self.workers_reason}); prefetch: {self.prefetch} "
            f"batches ({self.prefetch_reason}); memory in {self.memory_folder}",
            f"  skipped samples: {self.skipped}",
        ]
        lines += _listed(self.bad_files)
        if self.warned_files:
            lines.append(
                f"  decoded with warnings (recoverable corrupt data, kept): "
                f"{len(self.warned_files)}"
            )
            lines += _listed(self.warned_files)
        if self.decoder:
            lines.append(f"  JPEG decoder: {self.decoder}")
        if self.kept_batches:
            lines.append(f"  batches kept by the consumer past reuse: {self.kept_batches}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _listed(files: list[tuple[str, str]], most: int = 10) -> list[str]:
    """Report lines for up to ``most`` (name, reason) pairs, then how many more."""
    lines = [f"    {name}: {reason}" for name, reason in files[:most]]
    if len(files) > most:
        lines.append(f"    ... and {len(files) - most} more")
    return lines


class Stats:
    """Mutable counters the loader updates; ``report()`` makes a StatsReport."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.first_at: float | None = None
        self.first_wait = 0.0
        self.first_images = 0
        self.last = 0.0
        self.images = self.batches = 0
        self.wait_s = self.read_s = self.decode_s = self.transform_s = 0.0
        self.bad: dict[int, tuple[str, str]] = {}
        self.warned: dict[int, tuple[str, str]] = {}
        self.loaded = 0

    def begin_wait(self) -> float:
        """Mark that the consumer asked for a batch; returns the start time."""
        now = time.perf_counter()
        if self.started is None:
            self.started = now
        return now

    def end_wait(self, t0: float, images: int) -> None:
        """The consumer got a batch of ``images`` after waiting since ``t0``."""
        self.last = time.perf_counter()
        if self.first_at is None:
            self.first_at, self.first_wait = self.last, self.last - t0
            self.first_images = images
        else:
            self.wait_s += self.last - t0
        self.images += images
        self.batches += 1

    def add(self, report: Report) -> list[tuple[int, str, str]]:
        """Fold in a batch's report; returns bad samples not seen before."""
        self.read_s += report.read_s
        self.decode_s += report.decode_s
        self.transform_s += report.transform_s
        self.loaded += report.count
        for index, name, message in report.warned:
            self.warned.setdefault(index, (name, message))
        new = []
        for index, name, reason in report.bad:
            if index not in self.bad:  # once each, even when a batch lists a sample twice
                self.bad[index] = (name, reason)
                new.append((index, name, reason))
        return new

    def report(self, **config: object) -> StatsReport:
        """A snapshot with per-image stage times in ms.

        The first batch's wait (worker start-up, cold caches) is reported on its own; the wait
        share and img/s describe the steady state after it.
        """
        # Until a batch arrives (or when none ever does: the first one failed) the time so far.
        end = self.last if self.first_at is not None else time.perf_counter()
        elapsed = max(0.0, end - self.started) if self.started is not None else 0.0
        steady = (self.last - self.first_at) if self.first_at is not None else 0.0
        per = 1000.0 / max(1, self.loaded)
        steady_images = self.images - (self.first_images if self.batches else 0)
        return StatsReport(
            images=self.images,
            batches=self.batches,
            elapsed_s=elapsed,
            first_batch_s=self.first_wait,
            wait_s=self.wait_s,
            wait_share=self.wait_s / steady if steady > 0 else 0.0,
            images_per_s=steady_images / steady if steady > 0 else 0.0,
            read_ms=self.read_s * per,
            decode_ms=self.decode_s * per,
            transform_ms=self.transform_s * per,
            skipped=len(self.bad),
            bad_files=list(self.bad.values()),
            warned_files=list(self.warned.values()),
            **config,  # type: ignore[arg-type]
        )
