"""Storage: cold reads, the page cache, read-ahead hints, remote shards, large photos.

Cases (one per former script; `python benchmarks/storage.py CASE --help` for each one's options):

    cold         (was cold.py) Data larger than RAM: stoker vs torch DataLoader + simplejpeg vs
                 tf.data, cold and warm.
    page-cache   (was page_cache.py) Page-cache citizenship on a dataset that fits in RAM: does
                 ``page_cache="auto"`` cost the second epoch anything?
    mmap-hint    (was mmap_hint.py) Cold rows of a memory-mapped array through the read-ahead
                 window: page faults alone vs ``MADV_WILLNEED`` first (what ``NpySource.read``
                 does).
    io-cpu       (was io_cpu.py) What reading cold files costs the CPU: the ceiling a cold epoch's
                 rate has on this machine.
    remote       (was remote_latency.py) Remote shards behind network latency: img/s through the
                 read-ahead window vs plain reads.
    eval-large   (was eval_large.py) augment="eval" on large camera photos (2-12 MP): stoker's
                 reduced-size decode vs full decode.
    s3-ceiling   The S3 endpoints' own ceilings (moto, benchmarks/s3local.py, s3local behind
                 tests/faultproxy.py): GETs/s and MB/s.
    clients      S3 clients (s3fs, obstore, boto3) on one latency-shaped endpoint: img/s and
                 img per CPU second.
    bucket       Data in a bucket behind latency: stoker vs litdata, MosaicML Streaming,
                 s3torchconnector and WebDataset, each on its own format; GETs per image.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse
import collections
import concurrent.futures as cf
import functools
import http.server
import json
import math
import multiprocessing as mp
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bucketbench
import common
import cv2
import numpy as np
import psutil
import s3clients

from stoker.sources.arrays import NpySource
from stoker.sources.base import drop_pages
from stoker.sources.readahead import ReadAhead, ReadSettings

# ---------------------------------------------------------------------------- cold

COLD_DOC = """\
Data larger than RAM: stoker vs torch DataLoader + simplejpeg vs tf.data, cold and warm.

What it does
1. Builds (or reuses) an ImageFolder larger than this machine's RAM from the ImageNet-like set
   (``/work/shared/make_dataset.py``; built under ``--root`` if missing) by distinct copies of
   its files (real copies, never links: a link shares its pages). ``--size``: GB, or ``small``
   (2 GB, to check the script); default 1.5 x RAM. Free disk space is checked first and the
   script says what it needs. Optionally converts part of it to Parquet shards
   (``stoker convert``; ``--parquet-gb``) and to WebDataset tars (``--tar-gb``) for the same
   measurement on shards and tars.
2. Before each cold run, drops every file's pages from the page cache
   (``posix_fadvise(DONTNEED)`` on each file, after one ``sync``), so the run reads from disk.
3. Runs each pipeline in its own process for ``--seconds`` after its first batch, the runs
   being the peers of `common.interleave` (``--rounds`` rounds, the cold runs then the warm
   ones in one order each round; a run that fails skips its peer): stoker (defaults:
   read_ahead="auto", page_cache="auto"), stoker with read_ahead=0 (each worker reads, then
   decodes: the old path), torch DataLoader + simplejpeg (2 workers) and tf.data with
   decode_and_crop_jpeg (num_parallel_calls AUTOTUNE). Same work for all: shuffled,
   RandomResizedCrop 224 + flip, batch 256, 2 workers.
   Then the same pipelines warm, on ``--warm-copies`` copies of the base set (6 by default,
   ~3.5 GB: it fits in RAM, read once before, and no pipeline reaches an epoch's end in a
   timed run; 1: the base set itself).
4. Reports img/s (median of rounds; then `common.report`'s table, ratios to stoker cold as
   medians of the per-round ratios), MB/s read (the process tree's read_bytes from storage per
   second), peak PSS of the process tree (sampled every 0.5 s from this process), page-cache
   growth (the system's Cached memory, end minus start of the timed window: other processes'
   I/O counts too), the machine's CPU time by kind over each timed run (``/proc/stat``: user,
   sys, irq, steal, idle: where a cold epoch's CPU goes), and the disk's own random-read rate
   with 2/8/32 reads in flight.

Usage
    python benchmarks/storage.py cold --size small --seconds 20 --rounds 1       # check the script
    python benchmarks/storage.py cold --seconds 45 --rounds 2 --parquet-gb 12      # the measurement
    python benchmarks/storage.py cold --clean                                      # delete the data
"""

MAKE_DATASET = "/work/shared/make_dataset.py"
PEERS = ("stoker", "stoker-noahead", "torch-simplejpeg", "tf-fused")
# also: stoker-window (read_ahead=8), stoker-windowN (read_ahead=N)
SHARD_PEERS = ("stoker-parquet", "stoker-parquet-noahead")
TAR_PEERS = ("stoker-tar", "stoker-tar-noahead")
GB = 1e9


# ---------------------------------------------------------------------------- data


def base_set(root: Path) -> Path:
    """The ImageNet-like set (6,000 JPEGs), generated under ``root`` if missing."""
    base = root / "base"
    if not (base / "labels.csv").is_file():
        print(f"generating the ImageNet-like set in {base} ...", flush=True)
        subprocess.run(
            [sys.executable, MAKE_DATASET, "--out", str(base), "--workers", "2"], check=True
        )
    return base


def folder_bytes(folder: Path) -> int:
    return sum(os.path.getsize(p) for p, _ in common.list_items(folder))


def check_space(root: Path, need: float) -> None:
    free = shutil.disk_usage(root).free
    if free < need:
        raise SystemExit(
            f"{root}: this run needs {need / GB:.1f} GB free on its disk and has "
            f"{free / GB:.1f} GB: free space, pass --root on a larger disk, or a smaller --size"
        )
    print(f"disk: {free / GB:.1f} GB free at {root}, {need / GB:.1f} GB needed", flush=True)


def build_big(root: Path, base: Path, size: float, extra: float, name: str = "big") -> Path:
    """An ImageFolder ``root/name`` of ``ceil(size / base size)`` distinct copies of the base
    set, with a labels.csv; reused when a complete one of that many copies is there."""
    items = common.list_items(base)
    base_size = sum(os.path.getsize(p) for p, _ in items)
    copies = max(1, math.ceil(size / base_size))
    big = root / name
    if complete(big, copies):
        print(f"reusing {big}: {copies} copies, {copies * base_size / GB:.1f} GB", flush=True)
        return big
    start_fresh(big, copies * base_size + extra + 2 * GB)  # + the shards and a margin
    print(
        f"building {big}: {copies} copies of {len(items)} files = "
        f"{copies * base_size / GB:.1f} GB ...",
        flush=True,
    )
    t0 = time.perf_counter()
    rows = []
    jobs = []
    for c in range(copies):
        for path, label in items:
            rel = os.path.relpath(path, base)
            cls, name = os.path.split(rel)
            dst = os.path.join(cls, f"c{c:03d}_{name}")
            rows.append(f"{dst},{label}")
            jobs.append((path, str(big / dst)))
    for cls in {os.path.dirname(d) for _, d in jobs}:
        os.makedirs(cls, exist_ok=True)
    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: shutil.copyfile(*job), jobs, chunksize=256))
    (big / "labels.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    mark_complete(big, copies, "built", t0)
    return big


def complete(folder: Path, count: int) -> bool:
    """Whether ``folder`` was built whole for ``count`` (its ``.complete`` stamp says so)."""
    stamp = folder / ".complete"
    return stamp.is_file() and stamp.read_text().strip() == str(count)


def start_fresh(folder: Path, need: float) -> None:
    """Delete what a build of ``folder`` left unfinished; check ``need`` bytes are free."""
    if folder.exists():
        shutil.rmtree(folder)
    check_space(folder.parent, need)


def mark_complete(folder: Path, count: int, done: str, t0: float) -> None:
    """Stamp ``folder`` as built whole for ``count``, once its files are on disk."""
    os.sync()
    (folder / ".complete").write_text(str(count))
    print(f"  {done} in {time.perf_counter() - t0:.0f} s", flush=True)


def warm_set(root: Path, base: Path, copies: int) -> Path:
    """The folder warm runs read: the base set, or ``copies`` distinct copies of it (an epoch
    of the 6,000-file set is 5-9 s, so a 30 s run crossed several epoch ends, and each
    pipeline's restart there, tf.data's shuffle and map refill above all, is not its steady
    rate)."""
    if copies <= 1:
        return base
    return build_big(root, base, (copies - 0.5) * folder_bytes(base), extra=0.0, name="warm")


def first_files(folder: Path, size: float) -> tuple[list[tuple[str, int]], int]:
    """``folder``'s first ``size`` bytes' worth of ``(path, label)`` (whole copies of the base
    set, in listing order) and their bytes."""
    picked, total = [], 0
    for path, label in common.list_items(folder):
        if total >= size:
            break
        picked.append((path, label))
        total += os.path.getsize(path)
    return picked, total


def build_shards(shards: Path, big: Path, size: float) -> Path:
    """Parquet shards (``stoker convert``) in ``shards`` of the first ``size`` bytes' worth of
    ``big``'s files (whole copies of the base set); reused when complete."""
    picked, total = first_files(big, size)
    if complete(shards, len(picked)):
        print(f"reusing {shards}: {len(picked)} images", flush=True)
        return shards
    start_fresh(shards, 1.05 * total + GB)
    listing = shards.parent / f"{shards.name}.csv"
    listing.write_text("path,label\n" + "".join(f"{p},{y}\n" for p, y in picked))
    print(
        f"converting {len(picked)} files ({total / GB:.1f} GB) to Parquet in {shards} ...",
        flush=True,
    )
    t0 = time.perf_counter()
    from stoker.cli.convert import convert

    convert(str(listing), shards, workers=2, progress=False)
    from stoker.sources.shards import ShardSource

    ShardSource(shards).close()  # builds the byte-offset index now, not in a timed run
    mark_complete(shards, len(picked), "converted", t0)
    return shards


def build_tars(tars: Path, big: Path, size: float, per_tar: float = GB) -> Path:
    """WebDataset tars (``<key>.jpg`` + ``<key>.cls`` members, ``per_tar`` bytes each) in
    ``tars`` of the first ``size`` bytes' worth of ``big``'s files; reused when complete."""
    import io
    import tarfile

    picked, total = first_files(big, size)
    if complete(tars, len(picked)):
        print(f"reusing {tars}: {len(picked)} images", flush=True)
        return scanned(tars)
    start_fresh(tars, 1.05 * total + GB)
    tars.mkdir(parents=True)
    print(f"writing {len(picked)} files ({total / GB:.1f} GB) to tars in {tars} ...", flush=True)
    t0, tar, written = time.perf_counter(), None, per_tar
    for k, (path, label) in enumerate(picked):
        if written >= per_tar:
            if tar is not None:
                tar.close()
            tar, written = tarfile.open(tars / f"shard-{k:07d}.tar", "w"), 0
        tar.add(path, arcname=f"{k:07d}.jpg")
        text = b"%d" % label
        info = tarfile.TarInfo(f"{k:07d}.cls")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
        written += os.path.getsize(path)
    if tar is not None:
        tar.close()
    mark_complete(tars, len(picked), "written", t0)
    return scanned(tars)


def scanned(tars: Path) -> Path:
    """``tars``, once stoker's scan of them is cached (not in a timed run)."""
    from stoker.sources.tar import TarSource

    TarSource(tars).close()
    return tars


def data_files(folder: Path) -> list[str]:
    """Every file under ``folder``."""
    return [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names]


def drop_cache(folder: Path) -> float:
    """``posix_fadvise(DONTNEED)`` on every file under ``folder``; returns the seconds."""
    t0 = time.perf_counter()
    os.sync()
    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(drop_pages, data_files(folder), chunksize=512))
    return time.perf_counter() - t0


def disk_ceiling(
    folder: Path, seconds: float, threads: int = 32, direct: bool = False
) -> dict[str, float]:
    """Random whole-file reads with ``threads`` in flight for ``seconds`` (``direct``: with
    O_DIRECT, as stoker reads data larger than RAM). Each thread takes the next file as it
    finishes one, so exactly ``threads`` reads are in flight; the rate counts the reads done
    over the time they took (an earlier version also timed the submission of 200,000 futures,
    and so reported well under the disk's rate)."""
    import random

    from stoker.sources.base import read_file, read_file_direct

    files = data_files(folder)
    random.Random(threads * 2 + direct).shuffle(files)  # each run its own random files
    paths = iter(files)
    lock = threading.Lock()
    done = [0, 0]

    def reader(deadline: float) -> None:
        while time.perf_counter() < deadline:
            with lock:
                path = next(paths, None)
            if path is None:
                return
            data = (read_file_direct(path) if direct else None) or read_file(path)
            with lock:
                done[0] += 1
                done[1] += len(data)

    t0 = time.perf_counter()
    pool = [threading.Thread(target=reader, args=(t0 + seconds,)) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    dt = time.perf_counter() - t0
    return {
        "files_s": done[0] / dt,
        "mb_s": done[1] / GB * 1000 / dt,
        "threads": threads,
        "direct": direct,
    }


def disk_ceilings(folder: Path, seconds: float) -> list[dict[str, float]]:
    """``disk_ceiling`` at 2, 8 and 32 reads in flight, cached and O_DIRECT, printed. Pages
    are dropped once: each run reads its own random files, few of them read before."""
    drop_cache(folder)
    out = []
    for threads in (2, 8, 32):
        for direct in (False, True):
            r = disk_ceiling(folder, seconds, threads, direct)
            print(
                f"disk random reads, {threads:2d} in flight, pages dropped"
                f"{', O_DIRECT' if direct else ''}: {r['files_s']:,.0f} files/s, "
                f"{r['mb_s']:,.0f} MB/s",
                flush=True,
            )
            out.append(r)
    return out


# ---------------------------------------------------------------------------- one run


def _tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def tree_read_bytes() -> int:
    """Bytes this process and its descendants read from storage (``/proc/<pid>/io``)."""
    total = 0
    for proc in _tree(os.getpid()):
        try:
            total += proc.io_counters().read_bytes
        except (psutil.Error, AttributeError):
            continue
    return total


def make_pipeline(name: str, data: str) -> tuple[Any, Any]:
    """``(endless batch iterator, close)`` for peer ``name`` over the folder/shards ``data``."""
    import peers

    if name.startswith("stoker"):
        import stoker

        loader = stoker.Loader(
            data,
            batch_size=256,
            image_size=224,
            augment="train",
            workers=2,
            seed=0,
            shuffle=True,
            read_ahead=_read_ahead(name),
        )
        return loader.stream(), loader
    items = common.list_items(data)
    pipe = peers.make(name, items, batch_size=256, workers=2, autotune=True)

    def endless() -> Any:
        while True:
            yield from pipe.epoch()

    return endless(), pipe


def _read_ahead(name: str) -> int | str:
    """A stoker peer's read_ahead: 0 for "-noahead", 8 for "-window" (N for "-windowN"), else
    auto."""
    if name.endswith("noahead"):
        return 0
    tail = name.rsplit("window", 1)
    if len(tail) == 2:
        return int(tail[1]) if tail[1].isdigit() else 8
    return "auto"


CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far by kind (``/proc/stat``'s first line)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1 : 1 + len(CPU_FIELDS)]]


def cpu_shares(before: list[int], after: list[int]) -> dict[str, float]:
    """Percent of the machine's CPU time by kind between two ``cpu_ticks``: where a cold run's
    CPU goes (decoding, the kernel's I/O, the hypervisor's steal) against a warm one's."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent) or 1
    return {k: round(100 * v / total, 1) for k, v in zip(CPU_FIELDS, spent, strict=True)}


def _cold_run_one(name: str, data: str, seconds: float) -> dict[str, Any]:
    """Time ``name`` for ``seconds`` after its first batch (in this, a fresh process)."""
    t0 = time.perf_counter()
    stream, obj = make_pipeline(name, data)
    common.batch_len(next(stream))
    first = time.perf_counter() - t0
    cpu0 = cpu_ticks()
    read0, cached0, t1 = tree_read_bytes(), psutil.virtual_memory().cached, time.perf_counter()
    images = 0
    while time.perf_counter() - t1 < seconds:
        images += common.batch_len(next(stream))
    dt = time.perf_counter() - t1
    read1, cached1 = tree_read_bytes(), psutil.virtual_memory().cached
    out = {
        "cpu": cpu_shares(cpu0, cpu_ticks()),
        "name": name,
        "images": images,
        "seconds": dt,
        "img_s": images / dt,
        "mb_s": (read1 - read0) / GB * 1000 / dt,
        "cache_growth_gb": (cached1 - cached0) / GB,
        "first_batch_s": first,
    }
    if name.startswith("stoker"):
        out["stats"] = str(obj.stats())
        print(out["stats"], file=sys.stderr)
    obj.close()
    return out


def _cold_measure(name: str, data: Path, seconds: float, cold: bool) -> dict[str, Any]:
    """One run of ``name`` in a fresh process (pages of ``data`` dropped first when ``cold``),
    its process tree's PSS sampled from here."""
    dropped = drop_cache(data) if cold else 0.0
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "cold",
        "--one",
        name,
        "--data",
        str(data),
        "--seconds",
        str(seconds),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    with common.PeakPss(proc.pid) as pss:
        out_text, _ = proc.communicate(timeout=seconds + 600)
    if proc.returncode != 0:
        return {"name": name, "error": f"exit {proc.returncode}", "cold": cold}
    result = json.loads(out_text.strip().splitlines()[-1])
    result.update(peak_pss_mib=pss.peak / 2**20, cold=cold, drop_s=dropped)
    tag = "cold" if cold else "warm"
    print(
        f"  {tag} {name:24s} {result['img_s']:7,.0f} img/s  {result['mb_s']:6,.0f} MB/s  "
        f"PSS {result['peak_pss_mib']:5,.0f} MiB  cache {result['cache_growth_gb']:+5.1f} GB  "
        f"first batch {result['first_batch_s']:.1f} s  CPU {cpu_line(result['cpu'])}",
        flush=True,
    )
    return result


def _cold_peer(
    name: str,
    data: Path,
    seconds: float,
    cold: bool,
    results: list[dict[str, Any]],
    warm_first: Path | None = None,
) -> common.Peer:
    """A `_cold_measure` run of ``name`` on ``data`` as a peer (its img/s), each run kept in
    ``results``; ``warm_first``: a folder read into the page cache (every file) before each run;
    a failed run skips the peer."""

    def measure() -> float:
        if warm_first is not None:
            common.warm_page_cache(data_files(warm_first))
        results.append(_cold_measure(name, data, seconds, cold))
        if "error" in results[-1]:
            raise common.Skip(results[-1]["error"])
        return float(results[-1]["img_s"])

    return common.Peer(f"{name} {'cold' if cold else 'warm'}", measure)


def cpu_line(cpu: dict[str, float]) -> str:
    """``cpu_shares`` in one line: user, sys, irq (hard + soft), steal, idle (+ iowait)."""
    irq = cpu["irq"] + cpu["softirq"]
    return (
        f"user {cpu['user']:.0f}% sys {cpu['system']:.0f}% irq {irq:.0f}% "
        f"steal {cpu['steal']:.0f}% idle {cpu['idle'] + cpu['iowait']:.0f}%"
    )


# ---------------------------------------------------------------------------- report


def summarize(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    keys = sorted(
        {(r["name"], r["cold"]) for r in results if "img_s" in r}, key=lambda k: (not k[1], k[0])
    )
    for name, cold in keys:
        runs = [r for r in results if r["name"] == name and r["cold"] == cold and "img_s" in r]
        rates = [r["img_s"] for r in runs]
        rows.append(
            [
                name,
                "cold" if cold else "warm",
                f"{common.median(rates):,.0f}",
                f"{min(rates):,.0f}-{max(rates):,.0f}",
                f"{common.median([r['mb_s'] for r in runs]):,.0f}",
                f"{max(r['peak_pss_mib'] for r in runs):,.0f}",
                f"{common.median([r['cache_growth_gb'] for r in runs]):+.1f}",
                f"{common.median([r['first_batch_s'] for r in runs]):.1f}",
            ]
        )
    return rows


def _cold_rate(results: list[dict[str, Any]], name: str, cold: bool) -> float:
    return common.median(
        [r["img_s"] for r in results if r["name"] == name and r["cold"] == cold and "img_s" in r]
    )


def cold_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=COLD_DOC.split("\n\n")[0])
    ap.add_argument("--root", default="/work/data-cold", help="where the data is built")
    ap.add_argument("--size", default="", help="GB of the big folder, 'small' (2); 1.5 x RAM")
    ap.add_argument("--seconds", type=float, default=45.0, help="timed seconds per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--parquet-gb", type=float, default=0.0, help="GB of Parquet shards (0: none)")
    ap.add_argument("--tar-gb", type=float, default=0.0, help="GB of WebDataset tars (0: none)")
    ap.add_argument("--warm-copies", type=int, default=6, help="copies of the base set, warm")
    ap.add_argument("--no-warm", action="store_true", help="skip the warm runs")
    ap.add_argument("--disk-seconds", type=float, default=15.0, help="of the disk probe (0: none)")
    ap.add_argument("--disk-only", action="store_true", help="only the disk's random-read rate")
    ap.add_argument("--json", default=None)
    ap.add_argument("--clean", action="store_true", help="delete --root's data and exit")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_cold_run_one(args.one, args.data, args.seconds)))
        return 0
    root = Path(args.root)
    if args.clean:
        shutil.rmtree(root, ignore_errors=True)
        print(f"deleted {root}")
        return 0
    facts = common.print_facts()
    ram = psutil.virtual_memory().total
    size = 2 * GB if args.size == "small" else float(args.size) * GB if args.size else 1.5 * ram
    parquet = min(args.parquet_gb * GB, size)
    tar_size = min(args.tar_gb * GB, size)
    root.mkdir(parents=True, exist_ok=True)
    base = base_set(root)
    big = build_big(root, base, size, extra=1.05 * (parquet + tar_size) + folder_bytes(base))
    shards = build_shards(root / "shards", big, parquet) if parquet else None
    base_shards = build_shards(root / "base-shards", base, size) if parquet else None
    warm = warm_set(root, base, args.warm_copies)
    tars = build_tars(root / "tars", big, tar_size) if tar_size else None
    base_tars = build_tars(root / "base-tars", base, size) if tar_size else None
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    disk = disk_ceilings(big, args.disk_seconds) if args.disk_seconds else []
    if args.disk_only:
        common.write_json(args.json, {"facts": facts, "disk": disk})
        return 0
    results: list[dict[str, Any]] = []
    runs = [(n, big, None) for n in names]
    runs += [(n, shards, None) for n in SHARD_PEERS if shards]
    runs += [(n, tars, None) for n in TAR_PEERS if tars]
    cold_peers = [_cold_peer(n, d, args.seconds, True, results) for n, d, _ in runs]
    warm_runs = [(n, warm, warm if i == 0 else None) for i, n in enumerate(names)]
    for name, folder in ((SHARD_PEERS[0], base_shards), (TAR_PEERS[0], base_tars)):
        warm_runs += [(name, folder, folder)] if folder is not None else []
    warm_peers = [_cold_peer(n, d, args.seconds, False, results, w) for n, d, w in warm_runs]
    every = cold_peers + ([] if args.no_warm else warm_peers)
    rounds = common.interleave(every, args.rounds, warmup=0, progress="{:,.0f}")
    header = (
        "pipeline|cache|img/s|range|MB/s read|peak PSS MiB|cache growth GB|first batch s".split("|")
    )
    print(common.table(summarize(results), header))
    if "stoker" in names and not args.no_warm:
        cold_rate, warm_rate = (
            _cold_rate(results, "stoker", True),
            _cold_rate(results, "stoker", False),
        )
        print(f"stoker cold / warm: {cold_rate / warm_rate:.2f} (goal >= 0.9)")
        for peer in (n for n in names if not n.startswith("stoker")):
            print(
                f"stoker / {peer}: cold {cold_rate / _cold_rate(results, peer, True):.2f}, "
                f"warm {warm_rate / _cold_rate(results, peer, False):.2f}"
            )
    for r in results:
        if r.get("stats") and r["name"] == "stoker" and r["cold"]:
            print("stoker stats() of its last cold run:\n" + r["stats"])
    base = "stoker cold" if "stoker cold" in rounds.values else None
    print(f"\nrounds (ratios: medians of the per-round ratios to {base}):")
    common.report(rounds, base, None)
    payload = {"facts": facts, "size_gb": size / GB, "disk": disk, "results": results}
    common.write_json(args.json, {**payload, "rounds": rounds.to_json(base)})
    return 0


# ---------------------------------------------------------------------------- page-cache

PAGE_CACHE_DOC = """\
Page-cache citizenship on a dataset that fits in RAM: does ``page_cache="auto"`` cost the
second epoch anything?

For each policy (``auto``, ``keep``, ``drop``: the peers of `common.interleave`, ``--rounds``
rounds, ratios against ``keep``), in a fresh process each: the
folder's pages are dropped (``posix_fadvise(DONTNEED)``), then a Loader (shuffled,
RandomResizedCrop 224 + flip, batch 256, 2 workers) runs two epochs. Reported per policy: epoch 1
(cold) and epoch 2 img/s, and how much the page cache grew over the run. ``auto`` must equal
``keep`` on epoch 2 (it drops pages only for data larger than RAM); ``drop`` shows what dropping
would have cost.

    python benchmarks/storage.py page-cache --data /work/data-cold/base --rounds 2
"""

POLICIES = ("auto", "keep", "drop")


def _page_cache_run_one(policy: str, data: str, batch_size: int = 256) -> dict[str, float]:
    """Two epochs under ``policy`` in this (fresh) process."""
    import stoker

    cached0 = psutil.virtual_memory().cached
    with stoker.Loader(
        data, batch_size=batch_size, image_size=224, augment="train", workers=2, page_cache=policy
    ) as loader:
        first = common.time_epoch(loader)
        second = common.time_epoch(loader)
        dropped = loader.stats().pages_dropped
    return {
        "policy": policy,
        "epoch1_img_s": first.rate,
        "epoch2_img_s": second.rate,
        "cache_growth_gb": (psutil.virtual_memory().cached - cached0) / GB,
        "pages_dropped": dropped,
    }


def _page_cache_measure(policy: str, data: Path, batch_size: int = 256) -> dict[str, float]:
    """One fresh-process run of ``policy`` with the folder's pages dropped first."""
    drop_cache(data)
    cmd = [sys.executable, __file__, "page-cache", "--one", policy, "--data", str(data)]
    cmd += ["--batch-size", str(batch_size)]
    result = common.child_json(cmd, f"page-cache --one {policy}")
    print(
        f"  {policy:5s} epoch 1 {result['epoch1_img_s']:7,.0f} img/s  epoch 2 "
        f"{result['epoch2_img_s']:7,.0f} img/s  cache {result['cache_growth_gb']:+.2f} GB  "
        f"dropped {result['pages_dropped']:,}",
        flush=True,
    )
    return result


def page_cache_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=PAGE_CACHE_DOC.split("\n\n")[0])
    ap.add_argument("--data", default=common.DEFAULT_DATA, help="an ImageFolder that fits in RAM")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(_page_cache_run_one(args.one, args.data, args.batch_size)))
        return 0
    common.print_facts()
    runs: dict[str, list[dict[str, float]]] = {policy: [] for policy in POLICIES}

    def measure(policy: str) -> float:
        runs[policy].append(_page_cache_measure(policy, Path(args.data), args.batch_size))
        return runs[policy][-1]["epoch2_img_s"]

    peers = [common.Peer(policy, lambda policy=policy: measure(policy)) for policy in POLICIES]
    common.interleave(peers, args.rounds, warmup=0)
    figures = {"epoch 1 img/s": "epoch1_img_s", "epoch 2 img/s": "epoch2_img_s"}
    figures["cache growth GB"] = "cache_growth_gb"
    rows, payload = [], {}
    for label, key in figures.items():
        result = common.Result({p: [r[key] for r in rs] for p, rs in runs.items()}, args.rounds, 0)
        payload[label] = result.to_json("keep")
        rows += [[label, *row] for row in result.rows("keep")]
    print(common.table(rows, ["figure", *result.header("keep", unit="")]))
    common.write_json(args.json, {"runs": runs, "figures": payload})
    return 0


# ---------------------------------------------------------------------------- mmap-hint

MMAP_HINT_DOC = """\
Cold rows of a memory-mapped array through the read-ahead window: page faults alone vs
``MADV_WILLNEED`` first (what ``NpySource.read`` does).

What it does
Maps each given file read-only as raw rows of 224 x 224 x 3 uint8 (150,528 bytes, an ImageNet
image as a ``.npy`` row) and reads every row once, in a random order, in batches of 64 through
``ReadAhead``: four variants (read_ahead=0 and "auto", each with and without the hint) are the
peers of `common.interleave`, a round one batch each (every row is read once, so a round reads
four different batches of the same file), so a cache warming up during the run (the machine's
or, on a virtual machine, the host's) favours none. Each row is copied, as a decode would touch
it. Printed: each variant's rows/s over all its rows (the harmonic mean of its batches' rates),
then the table of per-batch medians and ratios to read_ahead=0 without the hint.

Cold means cold: pass big files nobody has read since the machine started (old wheels,
archives; files you just wrote are still in the host's cache on a virtual machine). The files
are only read. Pages are dropped first (``POSIX_FADV_DONTNEED``), which cannot drop the pages of
a file some process has mapped (a loaded library): don't pass those.

Usage
    python benchmarks/storage.py mmap-hint /opt/pypi/files/*.whl
"""

SHAPE = (224, 224, 3)
ROW = int(np.prod(SHAPE))
BATCH = 64


class RawRows(NpySource):
    """A file read as rows of ``SHAPE`` uint8, with NpySource's reading (and its hint)."""

    def __init__(self, path: str) -> None:
        n = os.path.getsize(path) // ROW
        self.path, self.shape, self.classes = path, (n, *SHAPE), None
        self.labels = np.zeros(n, np.int64)
        self._array = None

    def _images(self) -> np.ndarray:
        if self._array is None:
            self._array = np.memmap(self.path, mode="r", dtype=np.uint8, shape=self.shape)
        return self._array


class FaultsOnly(RawRows):
    """The same rows without the hint: each page waits for its own fault."""

    def read(self, index: int) -> np.ndarray:
        return np.asarray(self._images()[index])


VARIANTS = [(w, kind) for w in (0, "auto") for kind in (FaultsOnly, RawRows)]


def _mmap_batches(files: list[str], batch: int) -> Iterator[tuple[list[ReadAhead], np.ndarray]]:
    """``(a reader per variant, a batch of row indices)`` over every file's rows in a random
    order, each file's pages dropped before its readers open."""
    for f, path in enumerate(files):
        drop_pages(path)
        readers = [
            ReadAhead(kind(path), ReadSettings(window=w, page_cache="keep")) for w, kind in VARIANTS
        ]
        order = np.random.default_rng(f).permutation(os.path.getsize(path) // ROW)
        try:
            for start in range(0, len(order) - batch + 1, batch):
                yield readers, order[start : start + batch]
        finally:
            for reads in readers:
                reads.close()


def _mmap_hint_peer(v: int, batches: Iterator[tuple[list[ReadAhead], np.ndarray]]) -> common.Peer:
    """Variant ``v``: its rows/s over the next batch of ``batches``, read by its reader."""
    w, kind = VARIANTS[v]

    def measure() -> float:
        readers, rows = next(batches)
        t0 = time.perf_counter()
        readers[v].start(rows)
        for i in rows:
            np.array(readers[v].take(int(i))[0])
        return len(rows) / (time.perf_counter() - t0)

    hint = "faults only" if kind is FaultsOnly else "MADV_WILLNEED"
    return common.Peer(f"read_ahead={w!r} {hint}", measure)


def mmap_hint_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=MMAP_HINT_DOC.split("\n")[0])
    parser.add_argument("files", nargs="+", help="big files not read since the machine started")
    parser.add_argument("--batch", type=int, default=BATCH, help="rows per batch (a trial)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = parser.parse_args(argv)
    files = [p for p in args.files if os.path.getsize(p) >= args.batch * ROW]
    common.print_facts()
    print(f"{len(files)} files, {sum(map(os.path.getsize, files)) / 1e9:.2f} GB")
    rounds = sum(os.path.getsize(p) // ROW // args.batch for p in files) // len(VARIANTS)
    if not rounds:
        raise SystemExit("fewer batches than variants: pass more or bigger files")
    batches = _mmap_batches(files, args.batch)
    peers = [_mmap_hint_peer(v, batches) for v in range(len(VARIANTS))]
    result = common.interleave(peers, rounds=rounds, warmup=0)
    batches.close()
    for name, rates in result.values.items():
        rate = len(rates) / sum(1 / r for r in rates)  # all rows / all their seconds
        print(f"{name:31} {rate:6.0f} rows/s  {rate * ROW / 1e6:4.0f} MB/s  ({len(rates)} batches)")
    common.report(result, peers[0].name, args.json, unit="rows/s")


# ---------------------------------------------------------------------------- io-cpu

IO_CPU_DOC = """\
What reading cold files costs the CPU: the ceiling a cold epoch's rate has on this machine.

A cold epoch reads every image from disk while two workers decode. If the reads cost CPU (the
kernel's block layer, interrupts, and on a virtual machine the hypervisor's time emulating the
disk, which the guest sees as *steal*), the decoders get less of the cores than on a warm epoch,
whatever the loader does. This measures that share without any loader:

1. **Alone**: two processes decode JPEGs held in memory (stoker's crop-window decoder, the
   RandomResizedCrop work of the loader's ``augment="train"``) for ``--seconds``; decodes/s.
2. **Beside reads**: the same, while a third process reads random files of the cold folder
   (pages dropped first) at ``--rate`` files/s on native threads (stoker's own reader,
   ``O_DIRECT`` as stoker reads data larger than RAM, or cached with ``--cached``).

The ratio of the two decode rates is the share of the decoders' CPU left beside those reads:
the most a cold epoch at that read rate can reach against a warm one, for any loader. The
machine's CPU time by kind (user, sys, irq, steal, idle; ``/proc/stat``) is printed for each.

Usage
    python benchmarks/storage.py io-cpu --data /work/data-cold/big --seconds 30 --rounds 2
"""


def decoder(files: list[str], seconds: float, start: Any, out: Any) -> None:
    """Decode random crops of ``files`` (read once, held in memory) until ``seconds`` pass."""
    from stoker.decode import jpegcrop

    datas = [Path(f).read_bytes() for f in files]
    rng = random.Random(os.getpid())
    start.wait()
    t0, done = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        data = datas[done % len(datas)]
        h, w = jpegcrop.header(data)[:2]
        side = int(min(h, w) * rng.uniform(0.35, 1.0))
        top, left = rng.randrange(h - side + 1), rng.randrange(w - side + 1)
        jpegcrop.decode_region(data, (top, left, side, side), (224, 224), image_size=(h, w))
        done += 1
    out.put(done / (time.perf_counter() - t0))


def reader(
    files: list[str], rate: float, direct: bool, prefix: int, start: Any, stop: Any, out: Any
) -> None:
    """Read ``files`` in turn at ``rate`` files/s on native threads, 32 in flight at most
    (``prefix`` > 0: only each file's first ``prefix`` bytes)."""
    from stoker.sources import _readfiles  # type: ignore[attr-defined]

    pool = _readfiles.Reader(threads=32)
    pool.set_mode(direct, not direct)
    start.wait()
    cpu0 = os.times()[:2]
    t0, sent, taken, nbytes = time.perf_counter(), 0, 0, 0
    while not stop.is_set():
        now = time.perf_counter() - t0
        if sent < int(now * rate) and sent - taken < 32:
            path = files[sent % len(files)]
            if prefix:
                pool.submit(sent, path, 0, prefix, -1)
            else:
                pool.submit(sent, path)
            sent += 1
        elif taken < sent:  # blocks until the oldest read ends
            got = pool.take(taken, 5.0)
            nbytes += len(got[0]) if got is not None and len(got) == 2 else 0
            taken += 1
        else:
            time.sleep(max(0.0, (sent + 1) / rate - now))
    dt = time.perf_counter() - t0
    cpu = os.times()
    out.put((taken / dt, nbytes / dt / 1e6, (cpu.user - cpu0[0]) / dt, (cpu.system - cpu0[1]) / dt))


def one_run(
    sample: list[str], cold_files: list[str], args: argparse.Namespace, rate: float
) -> dict[str, Any]:
    """Decode rate of two processes (beside a reader at ``rate`` files/s when ``rate``)."""
    ctx = mp.get_context("spawn")
    start, stop, out, reads = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=decoder, args=(sample, args.seconds, start, out)) for _ in range(2)]
    if rate:
        procs.append(
            ctx.Process(
                target=reader,
                args=(cold_files, rate, not args.cached, args.prefix_kb * 1024, start, stop, reads),
            )
        )
    for p in procs:
        p.start()
    time.sleep(3.0)  # let them import and load
    before, requests = cpu_ticks(), disk_reads()
    start.set()
    rates = [out.get(timeout=args.seconds + 120) for _ in range(2)]
    after, requests = cpu_ticks(), disk_reads() - requests
    stop.set()
    read = reads.get(timeout=60) if rate else (0.0, 0.0, 0.0, 0.0)
    for p in procs:
        p.join(timeout=60)
    return {
        "rate": rate,
        "decodes_s": sum(rates),
        "files_s": read[0],
        "mb_s": read[1],
        "reader_user": read[2],
        "reader_sys": read[3],
        "requests_s": requests / args.seconds,
        "cpu": cpu_shares(before, after),
    }


def disk_reads() -> int:
    """Read requests completed so far by the machine's disks (``/sys/block/*/stat``)."""
    total = 0
    for name in os.listdir("/sys/block"):
        if not name.startswith(("loop", "ram", "zram")):
            with open(f"/sys/block/{name}/stat") as f:
                total += int(f.read().split()[0])
    return total


def io_cpu_main(argv: list[str] | None = None) -> int:
    """Decode-alone and decode-beside-reads runs as `common.interleave` peers; print each run,
    then the table of their ratios to decoding alone."""
    ap = argparse.ArgumentParser(description=IO_CPU_DOC.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/work/data-cold/big"))
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, action="append", help="files/s read (default 1000)")
    ap.add_argument("--cached", action="store_true", help="read through the page cache")
    ap.add_argument("--prefix-kb", type=int, default=0, help="read each file's first N KiB only")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = ap.parse_args(argv)
    files = [f for f in data_files(args.data) if f.lower().endswith((".jpg", ".jpeg"))]
    if len(files) < 2:
        ap.error(f"--data {args.data}: needs JPEG files to decode and read")
    random.Random(0).shuffle(files)
    n = min(200, len(files) // 2)  # decoded; the rest are read cold
    sample = files[:n]
    alone: list[dict[str, Any]] = []

    def decode_alone() -> float:
        drop_cache(args.data)  # each round starts cold
        alone.append(one_run(sample, [], args, 0))
        print(
            f"round {len(alone)}: decode alone {alone[-1]['decodes_s']:,.0f}/s  "
            f"{cpu_line(alone[-1]['cpu'])}",
            flush=True,
        )
        return float(alone[-1]["decodes_s"])

    def decode_beside(rate: float) -> float:
        rest = files[n + (len(alone) - 1) * 200_000 :] or files[n:]
        beside = one_run(sample, rest, args, rate)
        print(
            f"round {len(alone)}: decode beside {beside['files_s']:,.0f} files/s "
            f"({beside['mb_s']:,.0f} MB/s{', cached' if args.cached else ', O_DIRECT'})"
            f"{f' first {args.prefix_kb} KiB' if args.prefix_kb else ''}"
            f" {beside['decodes_s']:,.0f}/s = {beside['decodes_s'] / alone[-1]['decodes_s']:.3f}"
            f" of alone; the reader's own CPU: user {beside['reader_user']:.1%} sys "
            f"{beside['reader_sys']:.1%} of a core; "
            f"{beside['requests_s'] / max(beside['files_s'], 1):.2f} disk requests a file"
            f"  {cpu_line(beside['cpu'])}",
            flush=True,
        )
        return float(beside["decodes_s"])

    peers = [common.Peer("decode alone", decode_alone)]
    peers += [
        common.Peer(f"beside {rate:,.0f} files/s", lambda rate=rate: decode_beside(rate))
        for rate in args.rate or [1000.0]
    ]
    result = common.interleave(peers, args.rounds, warmup=0)
    print("\ndecodes/s, and the ratio to decoding alone")
    common.report(result, "decode alone", args.json, unit="decodes/s")
    return 0


# ---------------------------------------------------------------------------- remote

REMOTE_DOC = """\
Remote shards behind network latency: img/s through the read-ahead window vs plain reads.

What it does
Serves a folder of stoker shards (``stoker convert`` output) from an HTTP server on 127.0.0.1
that answers every request after ``--delay`` seconds (the latency of an object store), and
times ``Loader(url)`` over it: shuffled, RandomResizedCrop 224 + flip, batch 64, 2 workers, for
``--seconds`` after the first batch, once per ``--read-ahead`` value: the peers of
`common.interleave` for ``--rounds``, ratios against read_ahead=0 (or the first value).
``--src`` imports another stoker checkout instead (to compare an older read-ahead), in a
subprocess per run.

Usage
    python /work/shared/make_dataset.py --out /tmp/rl/images --classes 10 --per-class 60
    stoker convert /tmp/rl/images /tmp/rl/shards
    python benchmarks/storage.py remote /tmp/rl/shards --delay 0.03 --read-ahead auto 0
"""

RUN = """
import json, sys, time
import stoker
kw = json.loads(sys.argv[2])
with stoker.Loader(sys.argv[1], batch_size=64, image_size=224, augment="train", seed=0,
                   workers=2, **kw) as loader:
    it, n = iter(loader), 0
    next(it)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < float(sys.argv[3]):
        try:
            n += len(next(it)[1])
        except StopIteration:
            it = iter(loader)
    print(json.dumps({"img_s": n / (time.perf_counter() - t0)}))
"""


class Slow(http.server.SimpleHTTPRequestHandler):
    """Files under the served folder, with Range, each answer after ``delay`` seconds."""

    delay = 0.0

    def log_message(self, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        time.sleep(self.delay)
        rng = self.headers.get("Range", "")
        if not rng.startswith("bytes="):
            return super().send_head()
        path = self.translate_path(self.path)
        start_s, _, end_s = rng[6:].partition("-")
        size = os.path.getsize(path)
        start, end = int(start_s), min(int(end_s) if end_s else size - 1, size - 1)
        f = open(path, "rb")  # noqa: SIM115 - closed by copyfile's caller
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        return _Limited(f, end - start + 1)


class _Limited:
    def __init__(self, f, n):  # type: ignore[no-untyped-def]
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        size = self.n if size < 0 else min(size, self.n)
        data = self.f.read(size)
        self.n -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen backlog: a burst of connections is not left to SYN retries


def serve(folder: str, delay: float) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(type("H", (Slow,), {"delay": delay}), directory=folder)
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def remote_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=REMOTE_DOC.split("\n")[0])
    parser.add_argument("shards")
    parser.add_argument("--delay", type=float, default=0.03)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--read-ahead", nargs="+", default=["auto", "0"])
    parser.add_argument("--src", default=os.path.join(os.path.dirname(__file__), "..", "src"))
    parser.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = parser.parse_args(argv)
    server, url = serve(args.shards, args.delay)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.src), "HOME": "/tmp/rl-home"}
    print(f"delay {args.delay * 1e3:.0f} ms per request; load average {os.getloadavg()[0]:.1f}")

    def measure(ra: str) -> float:
        kw = {"read_ahead": ra if ra == "auto" else int(ra)}
        cmd = [sys.executable, "-c", RUN, url, json.dumps(kw), str(args.seconds)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            server.shutdown()
            sys.exit(out.stderr[-2000:])
        return float(json.loads(out.stdout.splitlines()[-1])["img_s"])

    peers = [common.Peer(f"read_ahead={ra}", lambda ra=ra: measure(ra)) for ra in args.read_ahead]
    result = common.interleave(peers, args.rounds, warmup=0, progress="{:,.0f}")
    server.shutdown()
    base = "read_ahead=0" if "0" in args.read_ahead else peers[0].name
    common.report(result, base, args.json)


# ---------------------------------------------------------------------------- eval-large

EVAL_LARGE_DOC = """\
augment="eval" on large camera photos (2-12 MP): stoker's reduced-size decode vs full decode.

Work per image: read, decode, "resize the shorter side to 224/0.875, centre-crop 224x224"
(stoker's eval transform). Everything runs on ONE core (the process is pinned to one CPU and
OpenCV to one thread), so the numbers are per-core decode efficiency, not parallelism.

    stoker                  Loader(augment="eval", workers=0), timed with
                            stoker.cli.bench.single_core_rate: it picks the DCT scale (1/8, 1/4,
                            1/2) from the header so the centre box still has >= 224 px
    stoker fast_decode      the same with fast_decode=True
    full decode (same)      simplejpeg full-size decode (accurate IDCT), the same centre box
                            (stoker.transforms.center_box), the same resize
                            (stoker.transforms.resize_into: INTER_AREA past a 2x shrink)
    full decode (linear)    the same with a plain cv2.INTER_LINEAR resize (cheaper, aliased)
    pillow draft            Pillow with Image.draft (its own reduced-size JPEG decode), the
                            same box, BILINEAR resize: what a savvy Pillow user can do

Methods run interleaved (round 1: each for --seconds, round 2: ...); medians are reported.
Goal: stoker / full decode (same resize) >= 2.

The photos are made by stoker.datasets.make_large_photos into --out (default
/tmp/large_photos; reused when already complete with the same --count).

Usage
    python benchmarks/storage.py eval-large                          # 64 photos, 3 rounds of 3 s
    python benchmarks/storage.py eval-large --count 4 --rounds 1 --seconds 1   # smoke
"""

SIZE, FRACTION = 224, 0.875


def _eval_large_rate(
    fn: Callable[[str, np.ndarray], None], paths: list[str], seconds: float
) -> float:
    """Images/s of ``fn(path, out)`` cycling over ``paths`` for at least ``seconds``."""
    out = np.empty((SIZE, SIZE, 3), np.uint8)
    fn(paths[0], out)  # warm-up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn(paths[done % len(paths)], out)
        done += 1
    return done / (time.perf_counter() - t0)


def full_decode(linear: bool) -> Callable[[str, np.ndarray], None]:
    import simplejpeg

    from stoker.transforms import center_box, resize_into

    def fn(path: str, out: np.ndarray) -> None:
        with open(path, "rb") as f:
            img = simplejpeg.decode_jpeg(f.read(), colorspace="RGB")
        t, left, h, w = center_box(img.shape[0], img.shape[1], SIZE, SIZE, FRACTION)
        region = img[t : t + h, left : left + w]
        if linear:
            cv2.resize(region, (SIZE, SIZE), dst=out, interpolation=cv2.INTER_LINEAR)
        else:
            resize_into(region, out)

    return fn


def pillow_draft(path: str, out: np.ndarray) -> None:
    from PIL import Image

    from stoker.transforms import center_box

    with Image.open(path) as im:
        full_w, full_h = im.size
        short = round(SIZE / FRACTION)
        scale = short / min(full_w, full_h)  # keep the shorter side >= 256 after draft
        im.draft("RGB", (max(1, int(full_w * scale)), max(1, int(full_h * scale))))
        im = im.convert("RGB")
        k = im.size[0] / full_w
        t, left, h, w = center_box(full_h, full_w, SIZE, SIZE, FRACTION)
        box = (left * k, t * k, (left + w) * k, (t + h) * k)
        out[...] = np.asarray(im.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box))


def eval_large_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=EVAL_LARGE_DOC.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/large_photos")
    ap.add_argument("--count", type=int, default=64, help="photos to generate/use")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="per method per round")
    ap.add_argument("--batch-size", type=int, default=8, help="stoker batch size")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import stoker
    from stoker.cli import bench
    from stoker.datasets import make_large_photos
    from stoker.decode import jpegcrop
    from stoker.transforms import center_box

    facts = common.print_facts()
    t0 = time.perf_counter()
    root = make_large_photos(args.out, count=args.count)
    print(f"photos: {root} ({args.count}, ready in {time.perf_counter() - t0:.1f} s)")
    items = common.list_items(root)
    paths = [p for p, _ in items]
    nbytes, _ = common.warm_page_cache(paths)
    scales: collections.Counter[int] = collections.Counter()
    mp = []
    for p in paths:
        with open(p, "rb") as f:
            h, w = jpegcrop.header(f.read(1 << 20))[:2] if jpegcrop.AVAILABLE else (0, 0)
        if h:
            mp.append(h * w / 1e6)
            _, _, bh, bw = center_box(h, w, SIZE, SIZE, FRACTION)
            scales[jpegcrop.pick_denom(bh, bw, SIZE, SIZE)] += 1
    if mp:
        print(
            f"{len(paths)} JPEGs, {nbytes / len(paths) / 2**20:.1f} MiB each on average, "
            f"{min(mp):.1f}-{max(mp):.1f} MP (median {np.median(mp):.1f}); DCT scale stoker "
            "can use for the centre box: "
            + ", ".join(f"1/{d}: {n}" for d, n in sorted(scales.items(), reverse=True))
        )

    cv2.setNumThreads(1)
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    print(f"pinned to CPU {cpu}, OpenCV on 1 thread")

    bs = min(args.batch_size, len(paths))
    loaders = {
        "stoker": stoker.Loader(root, batch_size=bs, augment="eval", shuffle=False, workers=0),
        "stoker fast_decode": stoker.Loader(
            root, batch_size=bs, augment="eval", shuffle=False, workers=0, fast_decode=True
        ),
    }
    methods: dict[str, Callable[[], float]] = {
        name: (lambda ld=ld: bench.single_core_rate(ld, args.seconds))
        for name, ld in loaders.items()
    }
    methods["full decode (same resize)"] = lambda: _eval_large_rate(
        full_decode(False), paths, args.seconds
    )
    methods["full decode (linear)"] = lambda: _eval_large_rate(
        full_decode(True), paths, args.seconds
    )
    methods["pillow draft"] = lambda: _eval_large_rate(pillow_draft, paths, args.seconds)
    try:
        peers = [common.Peer(name, fn) for name, fn in methods.items()]
        result = common.interleave(peers, args.rounds, warmup=0, progress="{:,.1f}")
        rates = result.values
    finally:
        for ld in loaders.values():
            ld.close()

    rows = [
        [k, f"{common.median(v):,.1f}", f"{min(v):,.1f}", f"{max(v):,.1f}"]
        for k, v in rates.items()
    ]
    print(f"\naugment='eval' to {SIZE}x{SIZE}, one core, median of {args.rounds} rounds")
    print(common.table(rows, ["method", "img/s", "min", "max"]))
    med = {k: common.median(v) for k, v in rates.items()}
    ratios = [
        common.ratio_line(
            "stoker / full decode (same resize)",
            med["stoker"],
            med["full decode (same resize)"],
            ">= 2",
        ),
        common.ratio_line(
            "stoker / full decode (linear) (info)",
            med["stoker"],
            med["full decode (linear)"],
            ">= 2",
        ),
        common.ratio_line(
            "stoker / pillow draft (info)", med["stoker"], med["pillow draft"], ">= 1"
        ),
    ]
    print()
    print(common.table(ratios, ["ratio (medians)", "value", "goal", "verdict"]))
    baseline = "full decode (same resize)"
    print()
    print(common.table(result.rows(baseline), result.header(baseline)))
    common.write_json(
        args.json,
        {
            "facts": facts,
            "photos": len(paths),
            "megapixels": mp,
            "dct_scales": dict(scales),
            "rates": rates,
            "ratio_lines": ratios,
            **result.to_json(baseline),
        },
    )
    return 0


# ---------------------------------------------------------------------------- cases

CASES = common.cases(
    cold_main,
    page_cache_main,
    mmap_hint_main,
    io_cpu_main,
    remote_main,
    eval_large_main,
    s3clients.s3_ceiling_main,
    s3clients.clients_main,
    bucketbench.bucket_main,
)


if __name__ == "__main__":
    sys.exit(common.run_cases(__doc__, CASES))
