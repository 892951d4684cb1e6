"""The benchmarks' shared harness: peers and interleaved rounds, statistics, ratios, machine facts,
one JSON schema, and the case dispatcher of the theme scripts; plus datasets, epoch timing,
CPU/memory and tables.

The harness, in use::

    peers = [common.Peer("stoker", run_stoker), common.Peer("pillow", run_pillow)]
    result = common.interleave(peers, rounds=args.rounds, warmup=args.warmup)  # ABAB, not AABB
    common.report(result, baseline="pillow", path=args.json)

`interleave` runs every peer once per round, in the same order each round, after ``warmup``
untimed rounds; `Result` gives each peer's median and a distribution-free confidence interval of
the median, and each peer's ratio to a named baseline peer of the same run (the median of the
per-round ratios, so a drift that slows a whole round cancels). `run_cases` is the ``main`` of
every theme script (``python benchmarks/THEME.py CASE [options]``); `write_json` writes every
case's ``--json`` output in one schema (`SCHEMA`): the case, its command line, the machine facts
at the start and at the end of the run (load average, stoker commit and decoder included), and
the case's results.

Everything here is plain Python + numpy + psutil (no ML framework is imported), so a
controller process can use it without paying for TensorFlow/PyTorch.

CPU and memory are measured over the *process tree* (the process and all its descendants),
with `stoker.cli.bench.tree_cpu` / `tree_pss`. `tree_cpu` counts live descendants and
the children already reaped (e.g. the `multiprocessing.Pool` that Keras creates and closes every
epoch), each once, so pipelines whose workers come and go are charged fully.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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


def data_items(args: argparse.Namespace) -> tuple[list[tuple[str, int]], str | None]:
    """The items of ``args.data`` (its ``--max-images`` subset), their files read into the page
    cache; and the folder itself when every item is used (None for a subset)."""
    all_items = list_items(args.data)
    items = subset(all_items, args.max_images)
    warm_page_cache(p for p, _ in items)
    return items, (args.data if len(items) == len(all_items) else None)


def warm_page_cache(paths: Iterable[str]) -> tuple[int, float]:
    """Read every file once so epochs run on a warm page cache; returns (bytes, seconds)."""
    t0, total = time.perf_counter(), 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                total += len(chunk)
    return total, time.perf_counter() - t0


def child_json(
    cmd: Sequence[str], what: str, env: dict[str, str] | None = None, timeout: float = 1800
) -> dict[str, Any]:
    """Run ``cmd`` (a fresh process) and parse the JSON of its last stdout line; a failure
    exits with ``what`` and the end of its stderr."""
    out = subprocess.run(
        list(cmd), capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"{what} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


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


MAX_DRAIN = 64  # batches drained untimed at most (more than any ring's slots)


def time_stream(stream: Iterator[Any], batches: int, ready_s: float = 0.025) -> tuple[Epoch, Epoch]:
    """Time an endless, prefetching batch stream (stoker's); returns ``(steady, cold)``.

    stoker's workers keep filling the prefetch ring across epochs, also while the consumer is
    away (while other pipelines are measured), so its next batches are often made already: a
    head start no continuous run gets. So:

    1. drain: batches that arrive within ``ready_s`` (made ahead while idle) are taken untimed
       (making a batch of 256 takes >= 90 ms even at 2,900 img/s; a ready one comes in ~1 ms),
       at most ``MAX_DRAIN`` of them (a batch of a few tiny images never has to be waited for);
    2. cold: the next ``batches`` batches, from the request of the first to the arrival of the
       last -- one epoch timed the way per-epoch peers are timed (the wait for the first
       batch, with every worker starting at once, included);
    3. steady: the following ``batches`` batches, from the arrival of the last cold batch to
       the arrival of the last of these -- ``batches`` batch intervals with the workers busy
       in their natural phase: what continuous training sees, where cross-epoch prefetch
       hides every epoch boundary.

    CPU is the process-tree CPU over the same spans.
    """
    for _ in range(MAX_DRAIN):  # at most what a ring can hold: tiny batches never wait
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


SCHEMA = "stoker-bench/1"
"""The ``schema`` field of every ``--json`` file: ``{schema, script, case, argv, facts: {start,
end}, results}``; ``results`` is the case's own payload (for harness rounds: `Result.to_json`)."""

_RUN: dict[str, Any] = {}  # script, case and the facts at the start, set by `run_cases`


def envelope(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` in the one JSON schema (`SCHEMA`), with the facts at the start and now."""
    results = dict(payload)
    start = results.pop("facts", None) or _RUN.get("facts") or machine_facts()
    return {
        "schema": SCHEMA,
        "script": _RUN.get("script", Path(sys.argv[0]).name),
        "case": _RUN.get("case", ""),
        "argv": " ".join(sys.argv),
        "facts": {"start": start, "end": machine_facts()},
        "results": results,
    }


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` (when given) in the one schema of `envelope`."""
    if path:
        text = json.dumps(envelope(payload), indent=1, default=_jsonable)
        Path(path).write_text(text + "\n")
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


_DISTS = tuple(
    "stoker numpy simplejpeg opencv-python-headless opencv-python pillow pillow-simd"
    " tensorflow-cpu tensorflow keras torch psutil".split()
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


def git_commit() -> str:
    """The commit of the stoker checkout imported here (``+dirty`` with local changes)."""
    import stoker

    root = str(Path(stoker.__file__).resolve().parents[2])
    try:
        head, dirty = (
            subprocess.run(
                ["git", "-C", root, *cmd], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            for cmd in (["rev-parse", "--short=12", "HEAD"], ["status", "--porcelain", "-uno"])
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + ("+dirty" if dirty else "")


def decoder() -> str:
    """The JPEG decoder stoker uses here (`stoker.decode.decoder_name`)."""
    from stoker.decode import decoder_name

    return decoder_name()


def machine_facts() -> dict[str, Any]:
    """CPU model, cores (logical / usable), RAM, load average, kernel, library versions, the
    stoker commit and its JPEG decoder."""
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
        "stoker_commit": git_commit(),
        "decoder": decoder(),
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
    print(f"stoker {facts['stoker_commit']}; decoder: {facts['decoder']}")
    print("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    if facts["load_avg_1_5_15"][0] > 0.5 * facts["usable_cores"]:
        print(
            "WARNING: the machine is busy (1-min load average above half the cores); "
            "numbers will be noisy. Run on a quiet machine for the record."
        )
    return facts


# ---------------------------------------------------------------------------- rounds


@dataclass
class Peer:
    """One contender of a run: ``measure()`` does one timed trial and returns its figure
    (higher is better, e.g. images/s), or several figures of the one trial as ``{label:
    figure}``, each its own series ``"NAME: label"`` of the `Result`."""

    name: str
    measure: Callable[[], float | dict[str, float]]


class Skip(Exception):  # noqa: N818 (a verdict, not an error)
    """Raised by a peer's ``measure`` that cannot go on (its process died, say): `interleave`
    calls it no more, drops its figures and records the reason in `Result.skipped`."""


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free confidence interval of the median: ``(low, high, coverage)``.

    The order statistics ``x(k)`` and ``x(n+1-k)`` with the largest ``k`` whose binomial
    coverage is still >= ``level``; with too few values for ``level`` it is the range
    ``(min, max)``, and ``coverage`` says what that range does cover (``1 - 2^(1-n)``).
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), 0.0
    k, coverage = 1, 1 - 2 * 0.5**n
    for j in range(2, n // 2 + 1):
        cov = 1 - 2 * sum(math.comb(n, i) for i in range(j)) * 0.5**n
        if cov < level:
            break
        k, coverage = j, cov
    return xs[k - 1], xs[n - k], coverage


@dataclass
class Result:
    """The figures of `interleave`: ``values[peer]`` holds one figure per timed round."""

    values: dict[str, list[float]]
    rounds: int
    warmup: int
    skipped: dict[str, str] = field(default_factory=dict)

    def stats(self, name: str) -> dict[str, float]:
        """Median, confidence interval of the median (`median_ci`), min and max of a peer."""
        xs = self.values[name]
        low, high, coverage = median_ci(xs)
        return {
            "median": median(xs),
            "ci_low": low,
            "ci_high": high,
            "ci_coverage": coverage,
            "min": min(xs),
            "max": max(xs),
        }

    def ratio(self, name: str, baseline: str) -> dict[str, float]:
        """``name / baseline``: the median of the per-round ratios and its interval."""
        pairs = zip(self.values[name], self.values[baseline], strict=True)
        rs = [a / b for a, b in pairs if b]
        low, high, coverage = median_ci(rs)
        return {"median": median(rs), "ci_low": low, "ci_high": high, "ci_coverage": coverage}

    def rows(self, baseline: str | None = None, unit: str = "img/s") -> list[list[str]]:
        """Rows for `table` under `header`: each peer's figures, and its ratio to ``baseline``."""
        rows = []
        for name in self.values:
            st = self.stats(name)
            row = [name, _num(st["median"]), f"{_num(st['ci_low'])}-{_num(st['ci_high'])}"]
            row += [_num(st["min"]), _num(st["max"])]
            if baseline:
                r = self.ratio(name, baseline)
                row += [f"{r['median']:.3f}", f"{r['ci_low']:.3f}-{r['ci_high']:.3f}"]
            rows.append(row)
        return rows

    def header(self, baseline: str | None = None, unit: str = "img/s") -> list[str]:
        """The column names of `rows`."""
        cov = median_ci(next(iter(self.values.values()), []))[2]
        names = ["peer", f"median {unit}", f"{cov:.0%} CI", "min", "max"]
        return names + ([f"/ {baseline}", "CI"] if baseline else [])

    def to_json(self, baseline: str | None = None) -> dict[str, Any]:
        """The rounds' figures, per-peer statistics and ratios, for `write_json`."""
        out: dict[str, Any] = {
            "rounds": self.rounds,
            "warmup": self.warmup,
            "baseline": baseline,
            "peers": {n: {"values": v, **self.stats(n)} for n, v in self.values.items()},
            "skipped": self.skipped,
        }
        if baseline:
            out["ratios"] = {n: self.ratio(n, baseline) for n in self.values}
        return out


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def interleave(
    peers: Sequence[Peer], rounds: int, warmup: int = 1, progress: str | None = None
) -> Result:
    """Run every peer once per round, in the same order each round (A B A B ..., never
    A A B B), after ``warmup`` untimed rounds, so a machine that drifts or gets busy during
    the run slows every peer alike. A peer that raises `Skip` is left out from then on (and
    of the `Result`). ``progress`` (a format such as ``"{:,.1f}"``): print each
    timed round's figures as it ends."""
    names = [p.name for p in peers]
    if len(set(names)) != len(names):
        raise ValueError(f"peer names must be unique, got {names}")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0, got {rounds} and {warmup}")
    values: dict[str, list[float]] = {}
    owner: dict[str, str] = {}  # series -> its peer
    skipped: dict[str, str] = {}
    for r in range(warmup + rounds):
        figures = {p.name: _measure(p, skipped) for p in peers if p.name not in skipped}
        if r < warmup:
            continue
        series = [_series(n, x) for n, x in figures.items() if n not in skipped]
        for peer, one in zip([n for n in figures if n not in skipped], series, strict=True):
            for name, figure in one:
                values.setdefault(name, []).append(figure)
                owner[name] = peer
        if progress:
            shown = ", ".join(f"{n} {progress.format(x)}" for one in series for n, x in one)
            print(f"round {r - warmup + 1}: {shown}", flush=True)
    kept = {n: v for n, v in values.items() if owner[n] not in skipped}
    return Result(kept, rounds, warmup, skipped)


def _measure(peer: Peer, skipped: dict[str, str]) -> float | dict[str, float]:
    """``peer.measure()``; a `Skip` puts the peer in ``skipped`` with its reason."""
    try:
        return peer.measure()
    except Skip as exc:
        skipped[peer.name] = str(exc)
        return float("nan")


def _series(name: str, figure: float | dict[str, float]) -> list[tuple[str, float]]:
    """A peer's figure(s) of one round as ``(series name, figure)`` pairs."""
    if isinstance(figure, dict):
        return [(f"{name}: {label}", x) for label, x in figure.items()]
    return [(name, figure)]


def report(result: Result, baseline: str | None, path: str | None, unit: str = "img/s") -> None:
    """Print ``result`` as a table (ratios against ``baseline``) and write it to ``path``."""
    print(table(result.rows(baseline, unit), result.header(baseline, unit)))
    for name, reason in result.skipped.items():
        print(f"skipped {name}: {(reason.strip().splitlines() or [''])[-1][:200]}")
    write_json(path, result.to_json(baseline))


def add_round_options(
    parser: argparse.ArgumentParser, rounds: int = 5, seconds: float = 2.0
) -> None:
    """The options every harness case shares: ``--rounds``, ``--warmup``, ``--seconds``,
    ``--json PATH``."""
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds per peer")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--seconds", type=float, default=seconds, help="timed seconds per trial")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results here")


def add_data_options(
    parser: argparse.ArgumentParser, epochs: int = 3, epochs_help: str = "measured epochs"
) -> None:
    """The options of the cases that run a loader over an ImageFolder: ``--data``,
    ``--epochs``, ``--max-images`` (a random subset, for smoke runs), ``--batch-size``,
    ``--workers``."""
    parser.add_argument("--data", default=DEFAULT_DATA, help="ImageFolder dataset")
    parser.add_argument("--epochs", type=int, default=epochs, help=epochs_help)
    parser.add_argument("--max-images", type=int, default=0, help="random subset (smoke runs)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)


# ---------------------------------------------------------------------------- theme scripts

Case = tuple[Callable[[list[str] | None], Any], str]
"""A theme script's case: ``(main(argv), docstring)``."""


def run_cases(doc: str, cases: dict[str, Case], argv: list[str] | None = None) -> int:
    """The ``main`` of a theme script: ``THEME.py CASE [case options]`` runs one case.

    ``THEME.py --help`` lists the cases; ``THEME.py CASE --help`` shows that case's options.
    The facts at the start are taken here, for `write_json`.
    """
    argv = sys.argv[1:] if argv is None else argv
    script = Path(sys.argv[0]).name
    if not argv or argv[0] in ("-h", "--help"):
        print(doc.strip())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in cases:
        print(
            f"{script}: unknown case {name!r}; the cases are: {', '.join(cases)} "
            f"(python benchmarks/{script} --help)",
            file=sys.stderr,
        )
        return 2
    main, _ = cases[name]
    sys.argv[0] = f"{script} {name}"  # argparse's usage line names the case
    _RUN.update(script=script, case=name, facts=machine_facts())
    return int(main(rest) or 0)


def cases(*mains: Callable[[list[str] | None], Any]) -> dict[str, Case]:
    """A theme script's ``CASES`` from its case mains: ``NAME_main`` is case ``NAME`` (``_`` as
    ``-``), and its docstring is the module's ``NAME_DOC`` (upper case)."""
    table: dict[str, Case] = {}
    for main in mains:
        stem = main.__name__.removesuffix("_main")
        doc = getattr(sys.modules[main.__module__], f"{stem.upper()}_DOC")
        table[stem.replace("_", "-")] = (main, doc)
    return table
