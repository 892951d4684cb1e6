"""stoker vs tf.data, PyTorch DataLoader and Keras PyDataset on the same data and work.

Work per image (every peer): read the file, decode the JPEG, RandomResizedCrop (scale 0.08-1,
ratio 3/4-4/3) to 224x224, random horizontal flip; uint8 batches of 256; 2 workers; warm page
cache (every file is read once before the run). See peers.py for each peer's exact code.

How it is measured
- Every peer lives in its own *runner* process (spawned), so each one's memory (PSS) and CPU
  are its own process tree, TensorFlow/PyTorch thread pools are fresh, and no fork happens
  from a process that has another framework's threads running.
- Runs are INTERLEAVED: one warm-up epoch of each peer (worker start-up, tracing, page cache),
  then round 1 = one epoch of each peer, round 2 = one epoch of each, ... The order rotates
  every round. Machine noise therefore hits every peer alike. Only the controller asks for an
  epoch at a time; idle runners sleep.
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
  faster than either of two busy ones (benchmarks/ceiling_pair.py measures that).
  --no-ceiling / --no-raw-ceiling leave out the first / the other two.

Usage
    python benchmarks/compare.py                          # full run, all peers, 3 rounds
    python benchmarks/compare.py --epochs 5 --json compare.json
    python benchmarks/compare.py --max-images 1024 --epochs 1 --only stoker,tf-fused   # smoke
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import asdict
from multiprocessing import get_context
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import peers  # noqa: E402

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


def measure(r: Runner, pss_interval: float, warmup: bool) -> None:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", default=common.DEFAULT_DATA, help="ImageFolder dataset")
    ap.add_argument("--epochs", type=int, default=3, help="measured rounds after the warm-up")
    ap.add_argument(
        "--max-images",
        type=int,
        default=0,
        help="use a fixed random subset of this many images (smoke runs)",
    )
    ap.add_argument("--only", default="", help=f"comma-separated peers ({','.join(peers.PEERS)})")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--ceiling-seconds",
        type=float,
        default=0,
        help="seconds per ceiling sample (default: about one stoker epoch)",
    )
    ap.add_argument("--no-ceiling", action="store_true", help="skip the 2-core ceiling")
    ap.add_argument(
        "--no-raw-ceiling", action="store_true", help="skip the crop-window decoder ceiling"
    )
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
        print("warm-up round (not counted):")
        for r in runners:
            measure(r, args.pss_interval, warmup=True)
        for rnd in range(args.epochs):
            shift = rnd % len(runners)
            print(f"round {rnd + 1}/{args.epochs}:")
            for r in runners[shift:] + runners[:shift]:
                measure(r, args.pss_interval, warmup=False)
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
        },
    )
    return 1 if any(r.failed for r in runners) else 0


if __name__ == "__main__":
    sys.exit(main())
