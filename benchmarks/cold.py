"""Data larger than RAM: stoker vs torch DataLoader + simplejpeg vs tf.data, cold and warm.

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
3. Runs each pipeline in its own process for ``--seconds`` after its first batch, alternating
   peers, ``--rounds`` times: stoker (defaults: read_ahead="auto", page_cache="auto"),
   stoker with read_ahead=0 (each worker reads, then decodes: the old path), torch DataLoader
   + simplejpeg (2 workers) and tf.data with decode_and_crop_jpeg (num_parallel_calls
   AUTOTUNE). Same work for all: shuffled, RandomResizedCrop 224 + flip, batch 256, 2 workers.
   Then the same pipelines warm, on ``--warm-copies`` copies of the base set (6 by default,
   ~3.5 GB: it fits in RAM, read once before, and no pipeline reaches an epoch's end in a
   timed run; 1: the base set itself).
4. Reports img/s (median of rounds), MB/s read (the process tree's read_bytes from storage per
   second), peak PSS of the process tree (sampled every 0.5 s from this process), page-cache
   growth (the system's Cached memory, end minus start of the timed window: other processes'
   I/O counts too), the machine's CPU time by kind over each timed run (``/proc/stat``: user,
   sys, irq, steal, idle: where a cold epoch's CPU goes), and the disk's own random-read rate
   with 2/8/32 reads in flight.

Usage
    python benchmarks/cold.py --size small --seconds 20 --rounds 1       # check the script
    python benchmarks/cold.py --seconds 45 --rounds 2 --parquet-gb 12      # the measurement
    python benchmarks/cold.py --clean                                      # delete the data
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

MAKE_DATASET = "/work/shared/make_dataset.py"
PEERS = ("stoker", "stoker-noahead", "torch-simplejpeg", "tf-fused")
# also: stoker-window (read_ahead=8, native reads), stoker-pywindow (8, on Python threads)
SHARD_PEERS = ("stoker-parquet", "stoker-parquet-noahead")
# "-py": read_ahead="auto" on Python threads (STOKER_NATIVE_READS=0: how tars read before)
TAR_PEERS = ("stoker-tar", "stoker-tar-py", "stoker-tar-noahead")
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
    from stoker.sources.base import drop_pages

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
        if name.endswith(("pywindow", "-py")):  # the window's reads on Python threads (A/B)
            os.environ["STOKER_NATIVE_READS"] = "0"
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
    """A stoker peer's read_ahead: 0 for "-noahead", 8 for "-window"/"-pywindow" (N for
    "-windowN"), else auto."""
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


def run_one(name: str, data: str, seconds: float) -> dict[str, Any]:
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


def measure(name: str, data: Path, seconds: float, cold: bool) -> dict[str, Any]:
    """One run of ``name`` in a fresh process (pages of ``data`` dropped first when ``cold``),
    its process tree's PSS sampled from here."""
    dropped = drop_cache(data) if cold else 0.0
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
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


def rate(results: list[dict[str, Any]], name: str, cold: bool) -> float:
    return common.median(
        [r["img_s"] for r in results if r["name"] == name and r["cold"] == cold and "img_s" in r]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="/work/data-cold", help="where the data is built")
    ap.add_argument(
        "--size", default="", help="GB of the big folder, or 'small' (2 GB); default 1.5 x RAM"
    )
    ap.add_argument("--seconds", type=float, default=45.0, help="timed seconds per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument(
        "--parquet-gb",
        type=float,
        default=0.0,
        help="also measure stoker on Parquet shards of this many GB (0: skip)",
    )
    ap.add_argument(
        "--tar-gb",
        type=float,
        default=0.0,
        help="also measure stoker on WebDataset tars of this many GB (0: skip)",
    )
    ap.add_argument(
        "--warm-copies",
        type=int,
        default=6,
        help="the warm set: this many copies of the base set (fits in RAM; big "
        "enough that no pipeline reaches an epoch's end in a timed run)",
    )
    ap.add_argument("--no-warm", action="store_true", help="skip the warm runs")
    ap.add_argument(
        "--disk-seconds",
        type=float,
        default=15.0,
        help="seconds of the disk's random-read probe (0: skip)",
    )
    ap.add_argument(
        "--disk-only", action="store_true", help="measure the disk's random-read rate and exit"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--clean", action="store_true", help="delete --root's data and exit")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.data, args.seconds)))
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
    if not args.no_warm:
        common.warm_page_cache(p for p, _ in common.list_items(warm))
    for k in range(args.rounds):
        print(f"round {k + 1} of {args.rounds}", flush=True)
        shift = k % len(names) if names else 0  # --peers "": the shard and tar peers only
        order = names[shift:] + names[:shift]
        for name in order:
            results.append(measure(name, big, args.seconds, cold=True))
        for name in SHARD_PEERS if shards else ():
            results.append(measure(name, shards, args.seconds, cold=True))
        for name in TAR_PEERS if tars else ():
            results.append(measure(name, tars, args.seconds, cold=True))
        if not args.no_warm:
            common.warm_page_cache(p for p, _ in common.list_items(warm))
            for name in order:
                results.append(measure(name, warm, args.seconds, cold=False))
            if base_shards is not None:
                common.warm_page_cache(data_files(base_shards))
                results.append(measure(SHARD_PEERS[0], base_shards, args.seconds, cold=False))
            if base_tars is not None:
                common.warm_page_cache(data_files(base_tars))
                results.append(measure(TAR_PEERS[0], base_tars, args.seconds, cold=False))
    header = [
        "pipeline",
        "cache",
        "img/s",
        "range",
        "MB/s read",
        "peak PSS MiB",
        "cache growth GB",
        "first batch s",
    ]
    print(common.table(summarize(results), header))
    if "stoker" in names and not args.no_warm:
        cold_rate, warm_rate = rate(results, "stoker", True), rate(results, "stoker", False)
        print(f"stoker cold / warm: {cold_rate / warm_rate:.2f} (goal >= 0.9)")
        for peer in (n for n in names if not n.startswith("stoker")):
            print(
                f"stoker / {peer}: cold {cold_rate / rate(results, peer, True):.2f}, "
                f"warm {warm_rate / rate(results, peer, False):.2f}"
            )
    for r in results:
        if r.get("stats") and r["name"] == "stoker" and r["cold"]:
            print("stoker stats() of its last cold run:\n" + r["stats"])
    common.write_json(
        args.json, {"facts": facts, "size_gb": size / GB, "disk": disk, "results": results}
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
