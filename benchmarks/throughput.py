"""Warm throughput against peers, and the pixel path's parts.

Cases (one per former script; `python benchmarks/throughput.py CASE --help` for each one's options):

    compare      (was compare.py) stoker vs tf.data, PyTorch DataLoader and Keras PyDataset on the
                 same data and work.
    scale        (was scale.py) Data at scale: loader memory vs dataset size, and reads from a cold
                 page cache.
    ceiling      (was ceiling_pair.py) Is stoker at the 2-core ceiling? The ceiling measured with
                 BOTH cores busy, beside stoker.
    crop-decode  (was bench_crop_decode.py) Single-core throughput of RandomResizedCrop decoding:
                 full decode vs crop-window decode.
    gray         (was gray_decode.py) ``color_mode="grayscale"`` on JPEGs: libjpeg's own grayscale
                 output (``decode(channels=1)``: the Y plane, chroma never decoded) against the
                 route stoker took before (RGB decode, then BT.601 luma) and against a plain RGB
                 decode, on the sample photos in ``benchmarks/photos``.
    paired       (was paired_ab.py) Paired A/B of stoker's single-core rate: two variants run AT THE
                 SAME TIME, one per core.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse
import csv
import glob
import json
import math
import pathlib
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from multiprocessing import get_context
from typing import Any

import common
import cv2
import numpy as np
import peers
import simplejpeg
from common import median, print_facts, table, write_json

import stoker
from stoker import decode as dec
from stoker.cli.bench import busy_cores_rate, tree_pss
from stoker.decode import jpegcrop
from stoker.decode.common import Box
from stoker.sources.base import drop_pages

# ---------------------------------------------------------------------------- compare

COMPARE_DOC = """\
stoker vs tf.data, PyTorch DataLoader and Keras PyDataset on the same data and work.

Work per image (every peer): read the file, decode the JPEG, RandomResizedCrop (scale 0.08-1,
ratio 3/4-4/3) to 224x224, random horizontal flip; uint8 batches of 256; 2 workers; warm page
cache (every file is read once before the run). See peers.py for each peer's exact code.

How it is measured
- Every peer lives in its own *runner* process (spawned), so each one's memory (PSS) and CPU
  are its own process tree, TensorFlow/PyTorch thread pools are fresh, and no fork happens
  from a process that has another framework's threads running.
- Runs are INTERLEAVED (the runners are `common.interleave` peers): one warm-up epoch of each
  peer (worker start-up, tracing, page cache), then round 1 = one epoch of each peer, round 2 =
  one epoch of each, ..., in the same order every round. Machine noise therefore hits every
  peer alike; a runner that fails is skipped from then on, its reason printed. Only the
  controller asks for an epoch at a time; idle runners sleep.
- img/s = images delivered / wall time of the epoch (first request to last batch); reported as
  the median (and min, max) over the rounds. stoker is the exception, because its workers
  keep prefetching across epoch boundaries (also while idle, so its next epoch would get a
  head start): it is timed on its endless stream, after discarding the batches it made while
  idle. Row "stoker [cold epoch]": the next len(loader) batches timed like the per-epoch peers
  (from the request, first-batch wait included). Row "stoker": the len(loader) batches after
  those, timed from batch arrival to batch arrival -- the steady rate of continuous training,
  where the cross-epoch prefetch hides every epoch boundary. The goal ratios use the steady
  row; both are printed (common.time_stream has the details). The cold row is the
  conservative number: a per-epoch peer pays its epoch-start fill in training too.
- CPU ms/image = CPU time of the runner's whole process tree (main + workers, incl. exited
  workers) per image, median over rounds. Peak PSS = the largest proportional set size of
  the runner's process tree, sampled every --pss-interval s by the controller during the
  measured epochs (PSS splits shared pages fairly between processes; stoker's shared-memory
  ring is counted once).
- The 2-core ceiling (the issue's definition: twice the best single-core decode+crop rate) is
  measured in the same run, interleaved like a peer, each candidate in a runner pinned to one
  CPU with OpenCV on one thread, over the same items, crops, resize and flip, times 2:
  "decoder-ceiling": libjpeg-turbo's crop-window decode (stoker's C extension, standard
  settings: accurate IDCT, fancy upsampling) in a tight loop; "full-decode-ceiling":
  simplejpeg's full decode + crop in a tight loop; "ceiling": stoker's own pipeline,
  `stoker.cli.bench.single_core_rate` of a Loader(workers=0). The goal ratio uses the best of the
  three medians. Each runs while the other core idles, which on some VMs lets one core run
  faster than either of two busy ones (benchmarks/throughput.py ceiling measures that).
  --no-ceiling / --no-raw-ceiling leave out the first / the other two.

Usage
    python benchmarks/throughput.py compare              # full run, all peers, 3 rounds
    python benchmarks/throughput.py compare --epochs 5 --json compare.json
    python benchmarks/throughput.py compare --max-images 1024 --epochs 1 --only stoker,tf-fused
"""

CEILING = "ceiling"
RAW = "decoder-ceiling"
FULL = "full-decode-ceiling"
BEST = "best ceiling"  # the best of the ceiling medians
GOALS = [  # (label, numerator, denominator, goal)
    ("stoker / ceiling (best 1-core decode+crop x 2)", "stoker", BEST, ">= 0.95"),
    ("stoker / tf.data fused", "stoker", "tf-fused", ">= 1.15"),
    ("stoker / DataLoader+Pillow", "stoker", "torch-pillow", ">= 2"),
    ("stoker / Keras PyDataset", "stoker", "keras-pydataset", ">= 3.5"),
]


# ---------------------------------------------------------------------------- runner process


def _pin_one_core() -> str:
    """Pin this process to one CPU and OpenCV to one thread; return a description."""
    import cv2

    cv2.setNumThreads(1)
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def _window_decoder(size: int) -> Any:
    """Crop-window decode with libjpeg-turbo (stoker.decode._jpeg), standard settings."""
    from stoker.decode import jpegcrop

    def decode(data: bytes, h: int, w: int, box: tuple[int, int, int, int]) -> Any:
        return jpegcrop.decode_region(data, box, min_size=(size, size), image_size=(h, w))

    return decode


def _full_decoder(size: int) -> Any:
    """simplejpeg's full decode (libjpeg-turbo, accurate IDCT), then the crop as a view."""
    import simplejpeg

    def decode(data: bytes, h: int, w: int, box: tuple[int, int, int, int]) -> Any:
        image = simplejpeg.decode_jpeg(data)
        return image[box[0] : box[0] + box[2], box[1] : box[1] + box[3]]

    return decode


def _raw_rate(items: list[tuple[str, int]], size: int, seconds: float, decode: Any) -> float:
    """Images/s of read + ``decode`` (the crop) + resize + flip in a tight loop, this core."""
    import cv2
    import numpy as np

    from stoker.decode import jpegcrop
    from stoker.transforms import random_resized_crop_box, resize_into

    rng = np.random.default_rng(0)
    out = np.empty((size, size, 3), np.uint8)
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for path, _ in items:
            with open(path, "rb") as f:
                data = f.read()
            h, w = jpegcrop.header(data)[:2]
            u = rng.random(41)
            box = random_resized_crop_box(h, w, u, peers.SCALE, peers.RATIO)
            resize_into(decode(data, h, w, box), out)
            if u[40] < 0.5:
                cv2.flip(out, 1, dst=out)
            done += 1
            if done % 64 == 0 and time.perf_counter() - t0 >= seconds:
                break
    return done / (time.perf_counter() - t0)


def runner(conn: Any, name: str, cfg: dict[str, Any]) -> None:
    """Build one pipeline and serve 'epoch' requests until 'close'."""
    try:
        import multiprocessing

        # a spawned process defaults to "spawn"; give the peers the platform's default start
        # method (fork on Linux before Python 3.14), as in a user's own script
        multiprocessing.set_start_method(None, force=True)
        note, pipe, probe = "", None, None
        if name == CEILING:
            import stoker

            note = _pin_one_core()
            items = cfg["items"]
            probe = stoker.Loader(
                paths=[p for p, _ in items],
                labels=[y for _, y in items],
                batch_size=cfg["batch_size"],
                image_size=cfg["size"],
                augment="train",
                workers=0,
                seed=cfg["seed"],
            )
        elif name in (RAW, FULL):
            from stoker.decode import jpegcrop

            if not jpegcrop.AVAILABLE:
                raise RuntimeError("stoker.decode._jpeg (the C extension) is not built here")
            note = _pin_one_core()
            decoder = (_window_decoder if name == RAW else _full_decoder)(cfg["size"])
        else:
            pipe = peers.make(
                name,
                cfg["items"],
                data=cfg["data"],
                batch_size=cfg["batch_size"],
                size=cfg["size"],
                workers=cfg["workers"],
                seed=cfg["seed"],
            )
        conn.send(("ready", note))
        while True:
            cmd = conn.recv()
            if cmd == "close":
                extra = ""
                if pipe is not None and name.startswith("stoker"):
                    extra = str(pipe.obj.stats())
                if pipe is not None:
                    pipe.close()
                if probe is not None:
                    probe.close()
                conn.send(("closed", extra))
                return
            if name == CEILING:
                from stoker.cli.bench import single_core_rate

                rate = single_core_rate(probe, cfg["ceiling_seconds"])
                conn.send(("rate", 2 * rate))  # x2: two cores
            elif name in (RAW, FULL):
                rate = _raw_rate(cfg["items"], cfg["size"], cfg["ceiling_seconds"], decoder)
                conn.send(("rate", 2 * rate))
            else:
                assert pipe is not None
                cold = None
                if pipe.stream is not None:  # stoker: see common.time_stream
                    ep, cold = common.time_stream(pipe.stream(), pipe.batches)
                else:
                    ep = common.time_epoch(pipe.epoch())
                common.wait_idle()  # background work must not overlap the next peer's epoch
                conn.send(("epoch", {"main": asdict(ep), "cold": asdict(cold) if cold else None}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


# ---------------------------------------------------------------------------- controller


class Runner:
    def __init__(self, name: str, cfg: dict[str, Any], timeout: float) -> None:
        ctx = get_context("spawn")
        self.name, self.timeout = name, timeout
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=runner, args=(child, name, cfg), name=f"runner-{name}")
        self.proc.start()
        child.close()
        self.summary = common.Summary(name)
        self.cold = common.Summary(
            f"{name} [cold epoch]",
            note="timed like the per-epoch peers"
            " (first-batch wait included, no cross-epoch prefetch)",
        )
        self.epochs: list[dict[str, Any]] = []
        self.warmup: Any = None
        self.failed = ""
        self.stats = ""

    def ask(self, cmd: str) -> tuple[str, Any]:
        self.conn.send(cmd)
        return self.wait()

    def wait(self) -> tuple[str, Any]:
        if not self.conn.poll(self.timeout):
            raise TimeoutError(f"{self.name}: no answer in {self.timeout:.0f} s")
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"{self.name} failed:\n{value}")
        return kind, value

    def close(self) -> None:
        if self.proc.is_alive() and not self.failed:
            try:
                _, self.stats = self.ask("close")
            except (RuntimeError, TimeoutError, OSError) as exc:
                self.failed = self.failed or str(exc).splitlines()[0]
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


def _compare_peer(r: Runner, pss_interval: float) -> common.Peer:
    """Runner ``r`` as a peer: its first call is the warm-up; a failed runner is skipped."""
    calls: list[None] = []

    def measure() -> float:
        _compare_measure(r, pss_interval, warmup=not calls)
        calls.append(None)
        if r.failed:
            raise common.Skip(r.failed)
        return r.summary.rates[-1] if r.summary.rates else float("nan")

    return common.Peer(r.name, measure)


def _compare_measure(r: Runner, pss_interval: float, warmup: bool) -> None:
    """One epoch (or ceiling sample) of runner ``r``, recorded in its summary."""
    if r.failed:
        return
    try:
        with common.PeakPss(r.proc.pid, pss_interval) as pss:
            kind, value = r.ask("epoch")
    except (RuntimeError, TimeoutError, OSError) as exc:
        r.failed = str(exc)
        print(f"  {r.name}: FAILED\n{exc}", flush=True)
        return
    if kind == "rate":
        text = f"{value:,.0f} img/s (x2)"
        if not warmup:
            r.summary.rates.append(value)
    else:
        ep = common.Epoch(**value["main"])
        cold = common.Epoch(**value["cold"]) if value["cold"] else None
        text = (
            f"{ep.rate:,.0f} img/s, {ep.images} images in {ep.seconds:.2f} s, "
            f"CPU {ep.cpu_ms_per_image:.2f} ms/img, PSS {pss.peak / 2**20:,.0f} MiB"
            + (f" (steady stream; cold epoch {cold.rate:,.0f} img/s)" if cold else "")
        )
        if warmup:
            r.warmup = value
        else:
            r.epochs.append(value)
            for summary, e in ((r.summary, ep), (r.cold, cold)):
                if e is not None:
                    summary.rates.append(e.rate)
                    summary.cpu_ms.append(e.cpu_ms_per_image)
                    summary.peak_pss = max(summary.peak_pss, pss.peak)
    print(f"  {r.name:<18} {'warm-up' if warmup else 'epoch'}: {text}", flush=True)


def compare_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=COMPARE_DOC.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common.add_data_options(ap, epochs_help="measured rounds after the warm-up")
    ap.add_argument("--only", default="", help=f"comma-separated peers ({','.join(peers.PEERS)})")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ceiling-seconds", type=float, default=0, help="per sample (0: ~1 epoch)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the 2-core ceiling")
    ap.add_argument("--no-raw-ceiling", action="store_true", help="skip the decoder ceilings")
    ap.add_argument("--pss-interval", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per runner request")
    ap.add_argument("--json", default="", help="write all numbers here")
    args = ap.parse_args(argv)

    facts = common.print_facts()
    all_items = common.list_items(args.data)
    items = common.subset(all_items, args.max_images, args.seed)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(peers.PEERS)
    bad = [n for n in names if n not in peers.PEERS]
    if bad:
        ap.error(f"unknown peer(s) {bad}; choose from {', '.join(peers.PEERS)}")
    nbytes, secs = common.warm_page_cache(p for p, _ in items)
    print(
        f"data: {args.data}: {len(items)} of {len(all_items)} images, "
        f"{nbytes / 2**20:,.0f} MiB (page cache warmed in {secs:.1f} s); batch "
        f"{args.batch_size}, image {args.image_size}, workers {args.workers}, "
        f"{args.epochs} measured rounds after 1 warm-up"
    )
    cfg = {
        "items": items,
        "data": args.data if len(items) == len(all_items) else None,
        "batch_size": args.batch_size,
        "size": args.image_size,
        "workers": args.workers,
        "seed": args.seed,
        "ceiling_seconds": args.ceiling_seconds or max(1.0, len(items) / 2500),
    }
    order = list(names)
    if not args.no_ceiling:
        order.append(CEILING)
    if not args.no_raw_ceiling:
        order += [RAW, FULL]

    runners: list[Runner] = []
    try:
        for name in order:  # start one at a time: start-up is not measured, keep it quiet
            t0 = time.perf_counter()
            r = Runner(name, cfg, args.timeout)
            runners.append(r)
            try:
                _, note = r.wait()
                print(
                    f"started {name} in {time.perf_counter() - t0:.1f} s"
                    + (f" ({note})" if note else ""),
                    flush=True,
                )
            except (RuntimeError, TimeoutError, OSError) as exc:
                r.failed = str(exc)
                print(f"could not start {name}:\n{exc}", flush=True)
        peers_ = [_compare_peer(r, args.pss_interval) for r in runners]
        result = common.interleave(peers_, args.epochs, warmup=1, progress="{:,.0f}")
    finally:
        for r in runners:
            r.close()

    by_name = {r.name: r for r in runners}
    rows = []
    for r in runners:
        s = r.summary
        if r.name == CEILING:
            s.note = "stoker.cli.bench.single_core_rate(Loader(workers=0)) x 2, 1 pinned core"
        elif r.name == RAW:
            s.note = "libjpeg-turbo crop window (stoker.decode._jpeg) + resize + flip, 1 core, x 2"
        elif r.name == FULL:
            s.note = "simplejpeg full decode + crop + resize + flip, 1 pinned core, x 2"
        elif r.cold.rates:
            s.note = "steady stream (continuous training; see common.time_stream)"
        if r.failed:
            s.note = "FAILED: " + r.failed.strip().splitlines()[-1][:80]
        rows.append(s.row())
        if r.cold.rates and not r.failed:
            rows.append(r.cold.row())
    print()
    print(
        f"input pipelines, {len(items)} images/epoch, batch {args.batch_size}, "
        f"{args.workers} workers, median of {args.epochs} interleaved epochs after a warm-up"
    )
    print(
        common.table(
            rows, ["pipeline", "img/s", "min", "max", "CPU ms/img", "peak PSS MiB", "note"]
        )
    )

    def med(name: str) -> float:
        if name == BEST:
            found = [med(n) for n in (CEILING, RAW, FULL) if n in by_name]
            return max((x for x in found if x == x), default=float("nan"))
        r = by_name.get(name)
        return r.summary.median if r and r.summary.rates else float("nan")

    ratio_rows = [common.ratio_line(label, med(a), med(b), goal) for label, a, b, goal in GOALS]
    if "stoker-exact" in by_name:
        ratio_rows += [
            common.ratio_line(
                label.replace("stoker", "stoker-exact", 1), med("stoker-exact"), med(b), goal
            )
            for label, _, b, goal in GOALS
        ]
    ratio_rows += [
        common.ratio_line(f"stoker / {n} (info)", med("stoker"), med(n), ">= 0.95")
        for n in (CEILING, RAW, FULL)
        if n in by_name
    ]
    print()
    print(common.table(ratio_rows, ["ratio (medians)", "value", "goal", "verdict"]))
    base = "stoker" if "stoker" in result.values else None
    print(f"\nrounds (ratios: medians of the per-round ratios to {base}):")
    common.report(result, base, None)
    for r in runners:
        if r.stats:
            print(f"\n{r.name} stats() after the run:\n{r.stats}")
    print(f"\nload average at the end: {[round(x, 2) for x in os.getloadavg()]}")
    common.write_json(
        args.json,
        {
            "facts": facts,
            "config": {k: v for k, v in cfg.items() if k != "items"}
            | {"images": len(items), "epochs": args.epochs, "peers": names},
            "results": {
                r.name: {
                    "summary": asdict(r.summary),
                    "median": r.summary.median,
                    "cold": asdict(r.cold) if r.cold.rates else None,
                    "warmup": r.warmup,
                    "epochs": r.epochs,
                    "failed": r.failed,
                    "stats": r.stats,
                }
                for r in runners
            },
            "ratios": ratio_rows,
            "rounds": result.to_json(base),
        },
    )
    return 1 if any(r.failed for r in runners) else 0


# ---------------------------------------------------------------------------- scale

SCALE_DOC = """\
Data at scale: loader memory vs dataset size, and reads from a cold page cache.

1. Memory: steady-state PSS of the whole process tree (parent + workers) for a 2,000-sample
   and a 200,000-sample CSV source (the same JPEGs listed many times, so the work per batch is
   identical and only the index grows). Goal: within 10%.
2. Cold cache: loader throughput from the image folder and from Parquet shards when every
   file's pages are dropped before each epoch with posix_fadvise(POSIX_FADV_DONTNEED), as for
   a dataset bigger than RAM; warm-cache epochs beside them (cold and warm are the peers of
   `common.interleave` on one loader; cold / warm is the median of the per-round ratios).

    python benchmarks/throughput.py scale --data /data/imagenet_like --shards /tmp/shards
"""


def make_csv(files: list[str], rows: int, path: str) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        for i in range(rows):
            w.writerow([files[i % len(files)], i % 10])
    return path


def steady_pss(source: str, batches: int = 12, batch_size: int = 256) -> tuple[float, float]:
    """(PSS MiB after `batches` batches, bytes of index per sample)."""
    with stoker.Loader(source, batch_size=batch_size, image_size=224, workers=2) as loader:
        it = loader.stream()
        for _ in range(batches):
            next(it)
        pss = tree_pss() / 2**20
        index = loader.recipe.source.index
        per = (index.blob.nbytes + index.offsets.nbytes + loader.recipe.source.labels.nbytes) / len(
            loader.recipe.source
        )
    return pss, per


def epoch_rate(loader: stoker.Loader) -> float:
    t0, n = time.perf_counter(), 0
    for x, _ in loader:
        n += len(x)
    return n / (time.perf_counter() - t0)


def cold_vs_warm(
    source: str, files: list[str], epochs: int, batch_size: int = 256
) -> common.Result:
    """Epochs with every file's pages dropped first and epochs on a warm cache, interleaved
    on one loader after a start-up epoch."""

    def cold(loader: stoker.Loader) -> float:
        for path in files:
            drop_pages(path)
        return epoch_rate(loader)

    with stoker.Loader(source, batch_size=batch_size, image_size=224, workers=2) as loader:
        epoch_rate(loader)  # start-up
        peers = [
            common.Peer("cold", lambda: cold(loader)),
            common.Peer("warm", lambda: epoch_rate(loader)),
        ]
        return common.interleave(peers, epochs, warmup=0)


def scale_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/data/imagenet_like")
    p.add_argument("--shards", default="/tmp/shards")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.data, "*", "*.jpg")))[:2000]
    tmp = tempfile.mkdtemp()
    for rows in (2_000, 200_000):
        pss, per = steady_pss(
            make_csv(files, rows, os.path.join(tmp, f"{rows}.csv")), 12, args.batch_size
        )
        print(f"{rows:>7,} samples: steady PSS {pss:,.1f} MiB, index {per:.0f} bytes/sample")
    all_files = sorted(glob.glob(os.path.join(args.data, "*", "*.jpg")))
    shard_files = sorted(glob.glob(os.path.join(args.shards, "*.parquet")))
    for name, source, paths in (
        ("folder", args.data, all_files),
        ("shards", args.shards, shard_files),
    ):
        result = cold_vs_warm(source, paths, args.epochs, args.batch_size)
        cold, warm = (result.stats(k)["median"] for k in ("cold", "warm"))
        print(
            f"{name}: cold cache {cold:,.0f} img/s, warm {warm:,.0f} img/s "
            f"(median of {args.epochs}); cold / warm {result.ratio('cold', 'warm')['median']:.2f}"
        )


# ---------------------------------------------------------------------------- ceiling

CEILING_DOC = """\
Is stoker at the 2-core ceiling? The ceiling measured with BOTH cores busy, beside stoker.

`throughput.py compare`'s ceiling is one pinned core's rate x 2, measured while the other core
idles; on a machine whose clock boosts when only one core works, that overstates what two busy
cores can do. This case interleaves, for --rounds rounds: a stoker epoch (workers=2), one pinned
single-core run alone, and two pinned single-core runs at the same time (one per core), and
reports stoker / (solo x 2) and stoker / (sum of the concurrent pair).

stoker is timed like `throughput.py compare` times it (`common.time_stream`, steady row): its
workers fill the prefetch ring while the pinned runs go on, so the batches made ahead are drained
untimed first. (An earlier version timed `len(loader)` batches straight away and so counted those
ready-made batches: its stoker figure, and the 1.11 ratio quoted from it, were ~15% high.)

    python benchmarks/throughput.py ceiling --rounds 5
"""


def ceiling_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=CEILING_DOC.split("\n\n")[0])
    p.add_argument("--data", default=common.DEFAULT_DATA, help="ImageFolder dataset")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = p.parse_args(argv)
    common.print_facts()
    data = args.data
    options = {"batch_size": args.batch_size, "image_size": 224, "augment": "train"}
    with stoker.Loader(data, workers=2, **options) as loader:
        stream = loader.stream()
        common.time_stream(stream, len(loader))  # warm-up

        def stoker_rate() -> float:
            steady, _ = common.time_stream(stream, len(loader))
            common.wait_idle()
            return steady.rate

        peers = [
            common.Peer("stoker", stoker_rate),
            common.Peer("solo x2", lambda: 2 * busy_cores_rate(data, options, 1, args.seconds)[0]),
            common.Peer("pair", lambda: sum(busy_cores_rate(data, options, 2, args.seconds))),
        ]
        result = common.interleave(peers, args.rounds, warmup=0, progress="{:,.0f}")
    med = [common.median(v) for v in result.values.values()]
    print(
        f"medians: stoker {med[0]:,.0f}, one core x 2 {med[1]:,.0f}, two busy cores "
        f"{med[2]:,.0f} img/s"
    )
    print(
        f"stoker / (one core x 2) = {med[0] / med[1]:.2f}; "
        f"stoker / (two busy cores) = {med[0] / med[2]:.2f}"
    )
    print(common.table(result.rows("solo x2"), result.header("solo x2")))
    common.write_json(args.json, result.to_json("solo x2"))


# ---------------------------------------------------------------------------- crop-decode

CROP_DECODE_DOC = """\
Single-core throughput of RandomResizedCrop decoding: full decode vs crop-window decode.

For each image (bytes preloaded into memory, so no I/O is timed) a torchvision-style
RandomResizedCrop box (scale 0.08-1, ratio 3/4-4/3, fixed seed) is decoded and resized
to 224x224 with ``cv2.resize`` (bilinear), one image at a time on one pinned core:

- ``simplejpeg full + crop``: ``simplejpeg.decode_jpeg`` of the whole image, then slice;
- ``jpegcrop window``: ``stoker.decode.jpegcrop.decode_region`` decodes only the box's window;
- ``... min_size=224``: the window at the largest DCT scale that keeps >= 224 px;

each with the accurate (islow IDCT, fancy upsampling) and fast (ifast IDCT, plain
upsampling) settings, plus decode-only rows without the resize. The pipelines of a setting
are the peers of `common.interleave` (``--repeat`` rounds after a warm-up pass); it prints
img/s by process CPU time (median, interval, range) and the speed-up over the simplejpeg
baseline of the same setting (median of the per-round ratios), and the wall-time img/s.

    python benchmarks/throughput.py crop-decode [--root /data/imagenet_like] [--n 500]
"""

SIZE = 224


def random_resized_crop_box(rng: np.random.Generator, height: int, width: int) -> Box:
    """torchvision's RandomResizedCrop.get_params: (top, left, height, width)."""
    area = height * width
    log_ratio = (math.log(3 / 4), math.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    side = min(height, width)  # fallback: centre crop
    return (height - side) // 2, (width - side) // 2, side, side


def resize(image: np.ndarray) -> np.ndarray:
    """Bilinear resize to SIZE x SIZE."""
    return cv2.resize(image, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR)


def simplejpeg_crop(data: bytes, box: Box, fast: bool) -> np.ndarray:
    """Full decode with simplejpeg, then slice the box (a view)."""
    top, left, h, w = box
    image = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast, fastupsample=fast)
    return image[top : top + h, left : left + w]


def window_crop(data: bytes, box: Box, fast: bool, size: tuple[int, int]) -> np.ndarray:
    """Decode only the box's window (image size from the preloaded header)."""
    return jpegcrop.decode_region(data, box, None, fast, image_size=size)


def window_crop_scaled(data: bytes, box: Box, fast: bool, size: tuple[int, int]) -> np.ndarray:
    """Decode the window at the largest DCT scale keeping >= SIZE px."""
    return jpegcrop.decode_region(data, box, (SIZE, SIZE), fast, image_size=size)


def load(root: pathlib.Path, n: int, seed: int) -> list[tuple[bytes, Box, tuple[int, int]]]:
    """n JPEGs spread over the whole set, each with a RandomResizedCrop box."""
    files = sorted(root.rglob("*.jpg"))
    if not files:
        raise SystemExit(f"no .jpg files under {root}")
    picked = files[:: max(1, len(files) // n)][:n]
    rng = np.random.default_rng(seed)
    samples = []
    for path in picked:
        data = path.read_bytes()
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        samples.append((data, random_resized_crop_box(rng, height, width), (height, width)))
    return samples


def _crop_decode_peer(name: str, fn: Callable[[], object], count: int, wall: dict) -> common.Peer:
    """``fn`` (one pass over the images) as a peer: its figure is img/s by this process's CPU
    time (one pinned thread: on a shared machine wall time also counts the time other
    processes held the core); the wall-time img/s of each pass goes to ``wall[name]``."""

    def measure() -> float:
        t_wall, t_cpu = time.perf_counter(), time.process_time()
        fn()
        cpu = time.process_time() - t_cpu
        wall.setdefault(name, []).append(count / (time.perf_counter() - t_wall))
        return count / cpu

    return common.Peer(name, measure)


def crop_decode_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=CROP_DECODE_DOC.splitlines()[0])
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path("/data/imagenet_like"))
    parser.add_argument("--n", type=int, default=500, help="images per pass")
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds (passes) per pipeline")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not jpegcrop.AVAILABLE:
        raise SystemExit("stoker.decode._jpeg is not built; reinstall with libjpeg-turbo headers")

    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # one core, honestly
    cv2.setNumThreads(1)
    samples = load(args.root, args.n, args.seed)
    count = len(samples)

    for data, box, size in samples[:20]:  # same pixels, or the comparison means nothing
        assert np.array_equal(
            simplejpeg_crop(data, box, False), window_crop(data, box, False, size)
        )

    scaled_share = np.mean([jpegcrop.pick_denom(b[2], b[3], SIZE, SIZE) > 1 for _, b, _ in samples])
    print(
        f"{count} images from {args.root}, 1 core (cpu {cpu}), {args.repeat} interleaved rounds "
        f"after a warm-up, {SIZE}x{SIZE} bilinear; DCT-scaled boxes: {scaled_share:.1%}"
    )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    wall: dict[str, list[float]] = {}
    for fast in (False, True):
        tag = "fast" if fast else "accurate"

        def base(fast: bool = fast) -> None:
            for data, box, _ in samples:
                resize(simplejpeg_crop(data, box, fast))

        def window(fast: bool = fast) -> None:
            for data, box, size in samples:
                resize(window_crop(data, box, fast, size))

        def scaled(fast: bool = fast) -> None:
            for data, box, size in samples:
                resize(window_crop_scaled(data, box, fast, size))

        def base_decode(fast: bool = fast) -> None:
            for data, box, _ in samples:
                simplejpeg_crop(data, box, fast)

        def window_decode(fast: bool = fast) -> None:
            for data, box, size in samples:
                window_crop(data, box, fast, size)

        ref, decode_ref = f"simplejpeg full + crop + resize ({tag})", f"simplejpeg full ({tag})"
        groups = [
            (
                ref,
                {
                    ref: base,
                    f"jpegcrop window + resize ({tag})": window,
                    f"jpegcrop window min_size=224 + resize ({tag})": scaled,
                },
            ),
            (decode_ref, {decode_ref: base_decode, f"jpegcrop window ({tag})": window_decode}),
        ]
        for baseline, fns in groups:
            peers = [_crop_decode_peer(name, fn, count, wall) for name, fn in fns.items()]
            result = common.interleave(peers, args.repeat, warmup=1)
            print(f"\n{'decode only, ' if baseline == decode_ref else ''}img/s by CPU time")
            common.report(result, baseline, None)
            print(
                "img/s by wall time (median): "
                + ", ".join(f"{name} {common.median(wall[name][1:]):,.0f}" for name in fns)
            )


# ---------------------------------------------------------------------------- gray

GRAY_DOC = """\
``color_mode="grayscale"`` on JPEGs: libjpeg's own grayscale output (``decode(channels=1)``:
the Y plane, chroma never decoded) against the route stoker took before (RGB decode, then BT.601
luma) and against a plain RGB decode, on the sample photos in ``benchmarks/photos``.

The variants take turns, photo by photo and round by round, so a busy machine slows them alike;
the figure is the median over rounds of each variant's total time for all photos.

    python benchmarks/throughput.py gray [--rounds 15] [--json out.json]
"""

PHOTOS = pathlib.Path(__file__).parent / "photos"


def _old_route(data: bytes, info: dec.ImageInfo) -> np.ndarray:
    """What ``color_mode="grayscale"`` did before: an RGB decode, then luma of it."""
    return cv2.cvtColor(np.ascontiguousarray(dec.decode(data, info)), cv2.COLOR_RGB2GRAY)


VARIANTS = {
    "rgb decode": lambda data, info: dec.decode(data, info),
    "gray: rgb decode + luma (before)": _old_route,
    "gray: libjpeg grayscale (channels=1)": lambda data, info: dec.decode(data, info, channels=1),
}


def gray_main(argv: list[str] | None = None) -> None:
    """Time the variants side by side and print ms per photo and the ratios."""
    parser = argparse.ArgumentParser(description=GRAY_DOC.splitlines()[0])
    common.add_round_options(parser, rounds=15)
    args = parser.parse_args(argv)
    facts = print_facts()
    photos = [p.read_bytes() for p in sorted(PHOTOS.glob("*.jpg"))]
    infos = [dec.probe(d) for d in photos]

    def peer(run: Callable[[bytes, dec.ImageInfo], object]) -> Callable[[], float]:
        def measure() -> float:  # photos/s over all photos once
            start = time.perf_counter()
            for data, info in zip(photos, infos, strict=True):
                run(data, info)
            return len(photos) / (time.perf_counter() - start)

        return measure

    peers = [common.Peer(name, peer(run)) for name, run in VARIANTS.items()]
    result = common.interleave(peers, args.rounds, args.warmup)
    per_photo = {name: 1e3 / median(v) for name, v in result.values.items()}
    rows = [[name, f"{ms:.3f}"] for name, ms in per_photo.items()]
    print(table(rows, ["variant", "ms/photo (median of rounds)"]))
    before = per_photo["gray: rgb decode + luma (before)"]
    gray = per_photo["gray: libjpeg grayscale (channels=1)"]
    print(
        f"gray before / gray now: {before / gray:.2f}x; "
        f"rgb / gray now: {per_photo['rgb decode'] / gray:.2f}x ({len(photos)} photos, "
        f"{args.rounds} rounds)"
    )
    baseline = "gray: rgb decode + luma (before)"
    print(table(result.rows(baseline, "photos/s"), result.header(baseline, "photos/s")))
    write_json(
        args.json,
        {
            "facts": facts,
            "ms_per_photo": per_photo,
            "photos": len(photos),
            **result.to_json(baseline),
        },
    )


# ---------------------------------------------------------------------------- paired

PAIRED_DOC = """\
Paired A/B of stoker's single-core rate: two variants run AT THE SAME TIME, one per core.

On a VM whose speed drifts by ~10% over tens of seconds, two variants timed one after the other
differ by the drift as much as by the change. Here, every round starts variant A pinned to one
core and variant B pinned to the other, together, and swaps the cores next round; the figure is
the median of the per-round ratios B / A. Each side is a fresh process running
`stoker.cli.bench.single_core_rate` of a `Loader(workers=0)` over the dataset (train augment, batch
256, 224 px).

A side is given as environment assignments plus Loader keyword arguments as JSON, e.g.:

    # the previous commit's code (a worktree with its extension built) vs this checkout
    git worktree add /tmp/base HEAD~1 && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/throughput.py paired --a-env PYTHONPATH=/tmp/base/src --rounds 8

    # an option
    python benchmarks/throughput.py paired --a-kwargs '{"fast_decode": false}' \\
        --b-kwargs '{"fast_decode": true}' --rounds 8
"""

ONE = (
    "import json, os, sys, stoker; from stoker.cli.bench import single_core_rate; "
    "os.sched_setaffinity(0, {int(sys.argv[1])}); "
    "L = stoker.Loader(sys.argv[2], batch_size=int(sys.argv[5]), image_size=224, workers=0, "
    "**json.loads(sys.argv[4])); single_core_rate(L, 1.0); "
    "print(single_core_rate(L, float(sys.argv[3]))); L.close()"
)


def _env(assignments: str) -> dict[str, str]:
    env = dict(os.environ)
    for item in assignments.split():
        key, _, value = item.partition("=")
        env[key] = value
    return env


def paired_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=PAIRED_DOC.split("\n\n")[0])
    ap.add_argument("--data", default="/data/imagenet_like")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per side")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    for side in ("a", "b"):
        ap.add_argument(f"--{side}-env", default="", help="KEY=VALUE ... for this side")
        ap.add_argument(f"--{side}-kwargs", default="{}", help="Loader kwargs as JSON")
    args = ap.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        sys.exit("throughput.py paired needs two usable cores")
    sides = [(_env(args.a_env), args.a_kwargs), (_env(args.b_env), args.b_kwargs)]
    rates = []
    for r in range(args.rounds):  # not `common.interleave`: the two sides run at once
        order = cores if r % 2 == 0 else cores[::-1]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    ONE,
                    str(core),
                    args.data,
                    str(args.seconds),
                    kwargs,
                    str(args.batch_size),
                ],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for core, (env, kwargs) in zip(order, sides, strict=True)
        ]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit(f"a side of round {r + 1} failed (its error is above)")
        a, b = (float(out.strip().splitlines()[-1]) for out in outs)
        rates.append((a, b))
        print(
            f"round {r + 1}: A {a:,.0f} img/s on CPU {order[0]}, B {b:,.0f} on CPU {order[1]}, "
            f"B/A {b / a:.3f}",
            flush=True,
        )
    result = common.Result({"A": [a for a, _ in rates], "B": [b for _, b in rates]}, args.rounds, 0)
    common.report(result, "A", args.json)
    print(
        f"A median {result.stats('A')['median']:,.0f} img/s, "
        f"B median {result.stats('B')['median']:,.0f} img/s; "
        f"B/A median of {args.rounds} paired rounds: {result.ratio('B', 'A')['median']:.3f}"
    )
    print(json.dumps({"a": [x for x, _ in rates], "b": [y for _, y in rates]}))


# ---------------------------------------------------------------------------- cases

CASES = common.cases(
    compare_main, scale_main, ceiling_main, crop_decode_main, gray_main, paired_main
)


if __name__ == "__main__":
    sys.exit(common.run_cases(__doc__, CASES))
