"""Shared helpers for the stoker benchmarks: datasets, epoch timing, CPU/memory, tables, facts.

Everything here is plain Python + numpy + psutil (no ML framework is imported), so a
controller process can use it without paying for TensorFlow/PyTorch.

CPU and memory are measured over the *process tree* (the process and all its descendants),
with `stoker.cli.bench.tree_cpu` / `tree_pss`. `tree_cpu` counts live descendants and
the children already reaped (e.g. the `multiprocessing.Pool` that Keras creates and closes every
epoch), each once, so pipelines whose workers come and go are charged fully.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from stoker.cli import bench as _bench

DEFAULT_DATA = "/data/imagenet_like"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")

# ---------------------------------------------------------------------------- dataset


def list_items(data: str | os.PathLike[str]) -> list[tuple[str, int]]:
    """``(absolute path, label)`` for every image of an ImageFolder dataset, sorted by path.

    Uses ``labels.csv`` (``path,label``, paths relative to the folder) when present, otherwise
    walks the class subfolders (labels = index of the sorted class name).
    """
    root = Path(data)
    table = root / "labels.csv"
    items: list[tuple[str, int]] = []
    if table.is_file():
        with open(table, newline="") as f:
            for row in csv.DictReader(f):
                items.append((str(root / row["path"]), int(row["label"])))
    else:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and e.name[0] != ".")
        for label, cls in enumerate(classes):
            for dirpath, _, files in os.walk(root / cls):
                for name in files:
                    if name.lower().endswith(IMAGE_EXTENSIONS):
                        items.append((os.path.join(dirpath, name), label))
    if not items:
        raise SystemExit(f"{root}: no images found (expected an ImageFolder layout)")
    return sorted(items)


def subset(
    items: list[tuple[str, int]], max_images: int | None, seed: int = 0
) -> list[tuple[str, int]]:
    """A deterministic random subset of ``max_images`` items (all of them when None/0)."""
    if not max_images or max_images >= len(items):
        return items
    pick = np.random.default_rng(seed).permutation(len(items))[:max_images]
    return [items[i] for i in sorted(pick)]


def warm_page_cache(paths: Iterable[str]) -> tuple[int, float]:
    """Read every file once so epochs run on a warm page cache; returns (bytes, seconds)."""
    t0, total = time.perf_counter(), 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total, time.perf_counter() - t0


# ---------------------------------------------------------------------------- process tree


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process, its live descendants and reaped children.

    `stoker.cli.bench.tree_cpu`, which already adds the children this process waited for (workers
    that exited, e.g. Keras' per-epoch pool). Use differences of two calls around the work.
    (Adding ``os.times()``'s children times on top, as an earlier version did, counted exited
    workers twice: the Keras peer's CPU per image came out doubled.)
    """
    return _bench.tree_cpu()


tree_pss = _bench.tree_pss
"""PSS (bytes) of this process and its descendants: `stoker.cli.bench.tree_pss`."""


def pid_tree_pss(pid: int) -> int:
    """PSS (bytes) of process ``pid`` and its descendants, measured from another process."""
    total = 0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.Error, AttributeError):
            continue
    return total


class PeakPss:
    """Samples the PSS of a process tree every ``interval`` s in a thread; ``.peak`` is the max.

    Run it in a *controller* process watching the measured one (``pid``), so sampling costs
    no GIL time in the measured process. Use as a context manager around the measured work.
    """

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.peak = max(self.peak, pid_tree_pss(self.pid))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakPss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, pid_tree_pss(self.pid))


# ---------------------------------------------------------------------------- timing


@dataclass
class Epoch:
    """One timed pass: images delivered, wall seconds, process-tree CPU seconds."""

    images: int
    seconds: float
    cpu_s: float
    batches: int = 0

    @property
    def rate(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_ms_per_image(self) -> float:
        return 1000 * self.cpu_s / self.images if self.images else float("nan")


def batch_len(batch: Any) -> int:
    """Images in a batch: ``(images, labels)`` with numpy, tf or torch images."""
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(images.shape[0])


def time_epoch(batches: Iterable[Any], step: Any = None) -> Epoch:
    """Consume one epoch of ``batches`` (calling ``step(batch)`` on each if given) and time it.

    Wall time runs from asking for the first batch to receiving the last (plus ``step``);
    CPU is the process-tree CPU (`tree_cpu`) over the same span.
    """
    cpu0, t0 = tree_cpu(), time.perf_counter()
    images = n = 0
    for batch in batches:
        images += batch_len(batch)
        n += 1
        if step is not None:
            step(batch)
    return Epoch(images, time.perf_counter() - t0, tree_cpu() - cpu0, n)


def time_stream(stream: Iterator[Any], batches: int, ready_s: float = 0.025) -> tuple[Epoch, Epoch]:
    """Time an endless, prefetching batch stream (stoker's); returns ``(steady, cold)``.

    stoker's workers keep filling the prefetch ring across epochs, also while the consumer is
    away (while other pipelines are measured), so its next batches are often made already: a
    head start no continuous run gets. So:

    1. drain: batches that arrive within ``ready_s`` (made ahead while idle) are taken untimed
       (making a batch of 256 takes >= 90 ms even at 2,900 img/s; a ready one comes in ~1 ms);
    2. cold: the next ``batches`` batches, from the request of the first to the arrival of the
       last -- one epoch timed the way per-epoch peers are timed (the wait for the first
       batch, with every worker starting at once, included);
    3. steady: the following ``batches`` batches, from the arrival of the last cold batch to
       the arrival of the last of these -- ``batches`` batch intervals with the workers busy
       in their natural phase: what continuous training sees, where cross-epoch prefetch
       hides every epoch boundary.

    CPU is the process-tree CPU over the same spans.
    """
    while True:
        cpu_req, t_req = tree_cpu(), time.perf_counter()
        images = batch_len(next(stream))  # hold no batch: stoker lends its ring slots
        if time.perf_counter() - t_req > ready_s:
            break  # the first batch that had to be waited for starts the cold window
    for _ in range(batches - 1):
        images += batch_len(next(stream))
    t1, c1 = time.perf_counter(), tree_cpu()
    cold = Epoch(images, t1 - t_req, c1 - cpu_req, batches)
    images = 0
    for _ in range(batches):
        images += batch_len(next(stream))
    t2, c2 = time.perf_counter(), tree_cpu()
    return Epoch(images, t2 - t1, c2 - c1, batches), cold


def wait_idle(threshold: float = 0.05, interval: float = 0.1, max_s: float = 15.0) -> float:
    """Wait until this process tree uses under ``threshold`` cores for two ``interval`` samples.

    Used after a timed epoch so work a pipeline still does in the background (stoker filling
    its prefetch ring for the next epoch) finishes before another pipeline is timed. Returns
    the seconds waited.
    """
    t0, quiet = time.perf_counter(), 0
    last = tree_cpu()
    while time.perf_counter() - t0 < max_s and quiet < 2:
        time.sleep(interval)
        now = tree_cpu()
        quiet = quiet + 1 if now - last < threshold * interval else 0
        last = now
    return time.perf_counter() - t0


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Summary:
    """Median/min/max of a list of per-epoch rates plus CPU and memory."""

    name: str
    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    peak_pss: int = 0
    note: str = ""

    @property
    def median(self) -> float:
        return median(self.rates)

    def row(self) -> list[str]:
        if not self.rates:
            return [self.name, "-", "-", "-", "-", "-", self.note]
        return [
            self.name,
            f"{self.median:,.0f}",
            f"{min(self.rates):,.0f}",
            f"{max(self.rates):,.0f}",
            f"{median(self.cpu_ms):.2f}" if self.cpu_ms else "-",
            f"{self.peak_pss / 2**20:,.0f}" if self.peak_pss else "-",
            self.note,
        ]


# ---------------------------------------------------------------------------- output


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain-text table (right-aligned numbers, left-aligned text)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(row: list[str]) -> str:
        out = []
        for i, c in enumerate(row):
            numeric = c.replace(",", "").replace(".", "").replace("-", "").replace("x", "")
            out.append(c.rjust(widths[i]) if numeric.isdigit() or c == "-" else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [fmt(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells[1:]]
    return "\n".join(lines)


def ratio_line(label: str, num: float, den: float, goal: str) -> list[str]:
    """A row for the ratio table: ``label, value, goal, verdict``."""
    if not (num > 0 and den > 0):
        return [label, "-", goal, "n/a"]
    value = num / den
    op, target = goal.split()
    ok = value >= float(target) if op == ">=" else value <= float(target)
    return [label, f"{value:.2f}", goal, "PASS" if ok else "MISS"]


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
        print(f"wrote {path}")


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    return str(obj)


# ---------------------------------------------------------------------------- machine facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


_DISTS = (
    "stoker",
    "numpy",
    "simplejpeg",
    "opencv-python-headless",
    "opencv-python",
    "pillow",
    "pillow-simd",
    "tensorflow-cpu",
    "tensorflow",
    "keras",
    "torch",
    "psutil",
)


def versions() -> dict[str, str]:
    """Installed versions of the libraries involved (from package metadata: nothing imported)."""
    out = {"python": platform.python_version()}
    for dist in _DISTS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def machine_facts() -> dict[str, Any]:
    """CPU model, cores (logical / usable), RAM, load average, kernel, library versions."""
    vm = psutil.virtual_memory()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {
        "cpu": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable,
        "ram_gib": round(vm.total / 2**30, 1),
        "available_gib": round(vm.available / 2**30, 1),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "versions": versions(),
        "argv": " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def print_facts(facts: dict[str, Any] | None = None) -> dict[str, Any]:
    facts = facts or machine_facts()
    v = facts["versions"]
    print(
        f"machine: {facts['cpu']}; {facts['usable_cores']} usable cores "
        f"({facts['logical_cores']} logical, {facts['physical_cores']} physical); "
        f"RAM {facts['ram_gib']} GiB ({facts['available_gib']} available); "
        f"load avg {facts['load_avg_1_5_15']}; kernel {facts['kernel']}"
    )
    print("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    if facts["load_avg_1_5_15"][0] > 0.5 * facts["usable_cores"]:
        print(
            "WARNING: the machine is busy (1-min load average above half the cores); "
            "numbers will be noisy. Run on a quiet machine for the record."
        )
    return facts
