"""Wait-time and per-stage accounting, and the report that answers "is my GPU waiting?".

Time is split three ways: the first batch (worker start-up), the training loop (from a batch
request to the last batch delivered, or the step's end when an adapter says so), and time
outside it (validation, checkpoints, between epochs: the loader is paused at the end of an
epoch and by the Keras callback while validation runs). Wait share and img/s describe the
training loop only. ``Window`` gives the same figures over a stretch of steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .assemble import Report
from .requeststats import request_figures, request_lines
from .sources.fetch import RequestCounts

AUTO_NONE = "auto: 0"  # how workers_reason begins when workers="auto" chose none
INPUT_BOUND = 0.10  # waiting more than this share of wall time means the input is the bottleneck
DISK_BOUND = 0.30  # workers waiting for bytes this share of their time: the disk limits


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
    #: How the workers' thread pools are sized (empty without workers).
    worker_threads: str = ""
    #: seconds in the training loop after the first batch (the base of wait share and img/s)
    train_s: float = 0.0
    #: seconds outside the training loop: validation, checkpoints, between epochs
    outside_s: float = 0.0
    #: seconds the GPU waited for data by its own clock (CUDA events), None where not measured
    device_wait_s: float | None = None
    #: how batches reach the device, and why that way (``torch(device="cuda")``)
    transfer: str = ""
    #: bytes read from the source for the batches delivered, and per second of the run
    read_bytes: int = 0
    read_mb_s: float = 0.0
    #: samples whose file pages were dropped from the page cache after reading (page_cache)
    pages_dropped: int = 0
    #: the source reads from storage (not memory, not a user's __getitem__): only then can
    #: the disk be the bottleneck
    from_storage: bool = True
    #: with ``Loader(cluster=...)``: the data path, per node (cores, img/s, MB/s on the wire,
    #: batches reissued, bad samples), the trainer's receive CPU per image; else {}
    cluster: dict = field(default_factory=dict)
    #: requests to remote storage: GETs (count, per second, per image), bytes (per second, per
    #: byte decoded), latency median and p99 in ms, retries, throttling replies, failures;
    #: {} when nothing was read from remote storage
    requests: dict = field(default_factory=dict)

    @property
    def storage_bound(self) -> bool:
        """True when the data is in remote storage and waiting for it is the bottleneck."""
        return bool(self.requests) and self.disk_bound

    @property
    def cluster_bottleneck(self) -> str:
        """With a cluster: 'cluster' when the trainer waited for batches, else 'trainer'."""
        if not self.cluster or self.batches == 0:
            return ""
        return "cluster" if self.bottleneck == "input" else "trainer"

    @property
    def read_share(self) -> float:
        """Share of the workers' time spent waiting for bytes (vs decoding, transforming)."""
        total = self.read_ms + self.decode_ms + self.transform_ms
        return self.read_ms / total if total > 0 else 0.0

    @property
    def disk_bound(self) -> bool:
        """True when the consumer waits for data and the workers mostly wait for the disk."""
        return self.from_storage and self.bottleneck == "input" and self.read_share >= DISK_BOUND

    @property
    def bottleneck(self) -> str:
        """'input' when the consumer waited a lot for data, else 'compute'."""
        if self.batches == 0:
            return "unknown"
        return "input" if self.wait_share > INPUT_BOUND else "compute"

    @property
    def verdict(self) -> str:
        """The bottleneck as the report words it: where the input is the bottleneck only
        because ``workers="auto"`` chose to load in this process, that choice, its reason and
        the fix, not a verdict on the user's data or code."""
        chose_none = self.workers == 0 and self.workers_reason.startswith(AUTO_NONE)
        if self.bottleneck != "input" or not chose_none:
            return self.bottleneck
        why = self.workers_reason[len(AUTO_NONE) :].lstrip(", ")
        return (
            f'input, because workers="auto" chose 0 worker processes ({why}); this loop '
            "takes batches faster than one process makes them: pass workers=N (your CPU "
            "cores) to make them in parallel"
        )

    def __str__(self) -> str:
        lines = [
            f"stoker: {self.images} images in {self.batches} batches, {self.elapsed_s:.2f} s; "
            f"{self.images_per_s:,.0f} img/s in the training loop after the first batch",
            f"  first batch after {self.first_batch_s:.2f} s; after it, waited "
            f"for data {self.wait_s:.2f} s = {self.wait_share:.1%} of the training loop's "
            f"{self.train_s:.2f} s -> bottleneck: {self.verdict}",
            *([f"  {self.startup}"] if self.startup else []),
            f"  outside the training loop (validation, checkpoints, between epochs): "
            f"{self.outside_s:.2f} s, not counted",
            f"  per image (worker time): read {self.read_ms:.2f} ms, decode {self.decode_ms:.2f} "
            f"ms, transform {self.transform_ms:.2f} ms",
            f"  reading: {self.read_mb_s:,.1f} MB/s ({self.read_bytes / 1e6:,.1f} MB); workers "
            f"waited for bytes {self.read_share:.0%} of their time, decoded and transformed "
            f"{1 - self.read_share:.0%}"
            if self.read_bytes
            else "  reading: nothing read yet",
            *(
                [
                    f"  hint: reading from disk limits you at {self.read_mb_s:,.0f} MB/s: "
                    "convert to shards on local SSD (stoker convert), or raise read-ahead "
                    "(Loader(read_ahead=16))"
                ]
                if self.disk_bound and not self.requests
                else []
            ),
            f"  workers: {self.workers} ({self.workers_reason}); prefetch: {self.prefetch} "
            f"batches ({self.prefetch_reason}); memory in {self.memory_folder}",
            *([f"  {self.worker_threads}"] if self.worker_threads else []),
            f"  skipped samples: {self.skipped}",
        ]
        lines += _listed(self.bad_files)
        if self.warned_files:
            lines.append(
                f"  decoded with warnings (recoverable corrupt data, kept): "
                f"{len(self.warned_files)}"
            )
            lines += _listed(self.warned_files)
        lines += request_lines(self.requests, self.storage_bound)
        if self.pages_dropped:
            lines.append(
                f"  page cache: {self.pages_dropped:,} samples left no pages in it (read with "
                "O_DIRECT where the file system allows, else dropped after reading: the dataset "
                "does not fit in RAM; page_cache='keep' keeps them)"
            )
        if self.decoder:
            lines.append(f"  JPEG decoder: {self.decoder}")
        if self.device_wait_s is not None:
            share = self.device_wait_s / self.train_s if self.train_s > 0 else 0.0
            lines.append(
                f"  GPU waited for data {self.device_wait_s:.2f} s = {share:.1%} by its own "
                "clock (CUDA events around each wait)"
            )
        if self.transfer:
            lines.append(f"  host -> device: {self.transfer}")
        if self.kept_batches:
            lines.append(f"  batches kept by the consumer past reuse: {self.kept_batches}")
        lines += [f"  note: {n}" for n in self.notes]
        lines += _cluster_lines(self.cluster, self.cluster_bottleneck)
        return "\n".join(lines)


def _cluster_lines(cluster: dict, bottleneck: str) -> list[str]:
    """The cluster's part of the report: data path, each node, the receive cost."""
    if not cluster:
        return []
    lines = [
        f"  cluster: {cluster['cores']} remote core(s) over {cluster['transport']}"
        f"{' on ' + cluster['listen'] if cluster['listen'] else ''}; the trainer's receive "
        f"CPU {cluster['receive_ms_per_image']:.3f} ms/image, "
        f"{cluster['wire_bytes_per_image'] / 1e3:,.1f} KB/image on the wire; bottleneck: "
        f"{bottleneck or 'unknown'}; refused connections: {cluster['refused']}"
    ]
    for n in cluster["nodes"]:
        lines.append(
            f"    node {n['node']} ({n['id']}): {n['cores']} core(s), {n['transport']}, "
            f"{'up' if n['alive'] else 'gone'}; {n['img_s']:,.0f} img/s, "
            f"{n['wire_mb_s']:,.1f} MB/s, {n['batches']} batches, {n['reissued']} reissued, "
            f"{n['bad']} bad samples{' (' + n['why'] + ')' if n.get('why') else ''}"
        )
    return lines


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
        self.read_bytes = self.pages_dropped = 0
        self.requests = RequestCounts()
        self.bad: dict[int, tuple[str, str]] = {}
        self.warned: dict[int, tuple[str, str]] = {}
        self.loaded = 0
        self.run_from: float | None = None  # start of the current stretch of training loop
        self.closed_s = 0.0  # training-loop seconds of stretches already ended
        self.outside_s = 0.0
        self.device_wait_s: float | None = None
        self.transfer = ""

    def begin_wait(self) -> float:
        """Mark that the consumer asked for a batch; returns the start time."""
        now = time.perf_counter()
        if self.started is None:
            self.started = now
        elif self.run_from is None and self.first_at is not None:
            self.outside_s += now - self.last  # paused since ``last``: back in the loop
            self.run_from = now
        return now

    def end_wait(self, t0: float, images: int) -> None:
        """The consumer got a batch of ``images`` after waiting since ``t0``."""
        self.last = time.perf_counter()
        if self.first_at is None:
            self.first_at, self.first_wait = self.last, self.last - t0
            self.first_images = images
            self.run_from = self.last
        else:
            self.wait_s += self.last - t0
        self.images += images
        self.batches += 1

    def tick(self) -> None:
        """A training step ended: the training loop's time runs at least to now."""
        if self.run_from is not None:
            self.last = time.perf_counter()

    def pause(self) -> None:
        """The training loop stopped (end of epoch, validation): time until the next batch
        request is counted outside it."""
        if self.run_from is not None:
            self.last = time.perf_counter()
            self.closed_s += self.last - self.run_from
            self.run_from = None

    def add_device_wait(self, seconds: float) -> None:
        """Add time the device waited for data, measured by its own clock."""
        self.device_wait_s = (self.device_wait_s or 0.0) + seconds

    def train_s(self) -> float:
        """Seconds in the training loop after the first batch."""
        open_s = self.last - self.run_from if self.run_from is not None else 0.0
        return self.closed_s + max(0.0, open_s)

    def window(self) -> Window:
        """The counters now, to subtract from a later ``window()`` (see ``Window``)."""
        steady = self.images - (self.first_images if self.batches else 0)
        return Window(steady, self.batches, self.wait_s, self.train_s(), self.device_wait_s)

    def add(self, report: Report) -> list[tuple[int, str, str]]:
        """Fold in a batch's report; returns bad samples not seen before."""
        self.read_s += report.read_s
        self.read_bytes += report.read_bytes
        self.pages_dropped += report.pages_dropped
        self.requests = self.requests + report.requests
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
        share and img/s describe the training loop after it (time outside it not counted).
        """
        # Until a batch arrives (or when none ever does: the first one failed) the time so far.
        end = self.last if self.first_at is not None else time.perf_counter()
        elapsed = max(0.0, end - self.started) if self.started is not None else 0.0
        train = self.train_s()
        per = 1000.0 / max(1, self.loaded)
        steady_images = self.images - (self.first_images if self.batches else 0)
        return StatsReport(
            images=self.images,
            batches=self.batches,
            elapsed_s=elapsed,
            first_batch_s=self.first_wait,
            wait_s=self.wait_s,
            wait_share=self.wait_s / train if train > 0 else 0.0,
            images_per_s=steady_images / train if train > 0 else 0.0,
            read_ms=self.read_s * per,
            decode_ms=self.decode_s * per,
            transform_ms=self.transform_s * per,
            skipped=len(self.bad),
            bad_files=list(self.bad.values()),
            warned_files=list(self.warned.values()),
            train_s=train,
            outside_s=self.outside_s,
            device_wait_s=self.device_wait_s,
            transfer=self.transfer,
            read_bytes=self.read_bytes,
            pages_dropped=self.pages_dropped,
            read_mb_s=self.read_bytes / 1e6 / elapsed if elapsed > 0 else 0.0,
            requests=request_figures(self.requests, self.loaded, elapsed, self.read_bytes),
            **config,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class Window:
    """Counters at one moment; ``later - earlier`` gives the figures of the steps between."""

    images: int
    batches: int
    wait_s: float
    train_s: float
    device_wait_s: float | None

    def __sub__(self, earlier: Window) -> Figures:
        train = self.train_s - earlier.train_s
        figures = Figures(
            data_wait=(self.wait_s - earlier.wait_s) / train if train > 0 else 0.0,
            input_img_s=(self.images - earlier.images) / train if train > 0 else 0.0,
            steps=self.batches - earlier.batches,
        )
        if self.device_wait_s is not None:
            before = earlier.device_wait_s or 0.0
            figures["device_wait"] = (self.device_wait_s - before) / train if train > 0 else 0.0
        return figures


class Figures(dict):
    """This stretch's ``data_wait`` (share of the training loop spent waiting for data),
    ``input_img_s`` (images per second the loop received) and ``steps``, plus ``device_wait``
    (the GPU's own share) where measured. A dict, ready for any logger; prints as a line."""

    def __init__(self, **figures: float) -> None:
        super().__init__(figures)

    def __str__(self) -> str:
        line = (
            f"stoker: {self['steps']} steps, waited for data {self['data_wait']:.1%}, "
            f"input {self['input_img_s']:,.0f} img/s"
        )
        if "device_wait" in self:
            line += f", GPU waited {self['device_wait']:.1%}"
        return line


class WaitMeter:
    """The wait report every ``every`` steps of a hand-written loop (PyTorch, JAX).

    ``step()`` after each training step: it returns ``None``, or every ``every`` steps the
    ``Figures`` of those steps (``data_wait``, ``input_img_s``, ``steps``, and ``device_wait``
    when ``torch(device="cuda")`` measured the GPU's wait with CUDA events).
    """

    def __init__(self, stats: Stats, every: int) -> None:
        self.stats, self.every = stats, every
        self.count = 0
        self.since = stats.window()

    def step(self) -> Figures | None:
        """Count one training step; the figures of the last ``every`` steps, or None."""
        self.stats.tick()
        self.count += 1
        return None if self.count % self.every else self.figures()

    def figures(self) -> Figures:
        """The figures since the last ``figures()`` (or the meter's start); starts a new
        stretch."""
        now = self.stats.window()
        figures, self.since = now - self.since, now
        return figures

    def pause(self) -> None:
        """The training loop stops (validation): time until the next batch is not counted."""
        self.stats.pause()
