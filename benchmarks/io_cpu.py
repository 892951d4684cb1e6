"""What reading cold files costs the CPU: the ceiling a cold epoch's rate has on this machine.

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
    python benchmarks/io_cpu.py --data /work/data-cold/big --seconds 30 --rounds 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cold  # noqa: E402


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
    before, requests = cold.cpu_ticks(), disk_reads()
    start.set()
    rates = [out.get(timeout=args.seconds + 120) for _ in range(2)]
    after, requests = cold.cpu_ticks(), disk_reads() - requests
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
        "cpu": cold.cpu_shares(before, after),
    }


def disk_reads() -> int:
    """Read requests completed so far by the machine's disks (``/sys/block/*/stat``)."""
    total = 0
    for name in os.listdir("/sys/block"):
        if not name.startswith(("loop", "ram", "zram")):
            with open(f"/sys/block/{name}/stat") as f:
                total += int(f.read().split()[0])
    return total


def main(argv: list[str] | None = None) -> int:
    """Alternate decode-alone and decode-beside-reads runs; print each and the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path("/work/data-cold/big"))
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--rate",
        type=float,
        action="append",
        help="files/s to read beside the decoders (repeatable; default 1000)",
    )
    ap.add_argument("--cached", action="store_true", help="read through the page cache")
    ap.add_argument(
        "--prefix-kb",
        type=int,
        default=0,
        help="read only each file's first N KiB (0: whole files): is a read's cost "
        "per request or per byte?",
    )
    args = ap.parse_args(argv)
    files = cold.data_files(args.data)
    random.Random(0).shuffle(files)
    sample = files[:200]
    for rnd in range(args.rounds):
        cold.drop_cache(args.data)
        alone = one_run(sample, [], args, 0)
        print(
            f"round {rnd + 1}: decode alone {alone['decodes_s']:,.0f}/s  "
            f"{cold.cpu_line(alone['cpu'])}",
            flush=True,
        )
        for rate in args.rate or [1000.0]:
            rest = files[200 + rnd * 200_000 :]
            beside = one_run(sample, rest, args, rate)
            print(
                f"round {rnd + 1}: decode beside {beside['files_s']:,.0f} files/s "
                f"({beside['mb_s']:,.0f} MB/s{', cached' if args.cached else ', O_DIRECT'})"
                f"{f' first {args.prefix_kb} KiB' if args.prefix_kb else ''}"
                f" {beside['decodes_s']:,.0f}/s = {beside['decodes_s'] / alone['decodes_s']:.3f}"
                f" of alone; the reader's own CPU: user {beside['reader_user']:.1%} sys "
                f"{beside['reader_sys']:.1%} of a core; "
                f"{beside['requests_s'] / max(beside['files_s'], 1):.2f} disk requests a file"
                f"  {cold.cpu_line(beside['cpu'])}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
