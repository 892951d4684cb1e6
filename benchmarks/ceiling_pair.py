"""Is stoker at the 2-core ceiling? The ceiling measured with BOTH cores busy, beside stoker.

compare.py's ceiling is one pinned core's rate x 2, measured while the other core idles; on a
machine whose clock boosts when only one core works, that overstates what two busy cores can
do. This script interleaves, for --rounds rounds: a stoker epoch (workers=2), one pinned
single-core run alone, and two pinned single-core runs at the same time (one per core), and
reports stoker / (solo x 2) and stoker / (sum of the concurrent pair).

stoker is timed like compare.py times it (`common.time_stream`, steady row): its workers fill
the prefetch ring while the pinned runs go on, so the batches made ahead are drained untimed
first. (An earlier version timed `len(loader)` batches straight away and so counted those
ready-made batches: its stoker figure, and the 1.11 ratio quoted from it, were ~15% high.)

    python benchmarks/ceiling_pair.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

import stoker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

DATA = "/data/imagenet_like"
ONE = (
    "import os, sys, stoker; from stoker.bench import single_core_rate; "
    "os.sched_setaffinity(0, {int(sys.argv[1])}); "
    f"L = stoker.Loader({DATA!r}, batch_size=256, image_size=224, workers=0); "
    "print(single_core_rate(L, seconds=float(sys.argv[2]))); L.close()"
)


def pinned(cores: list[int], seconds: float) -> list[float]:
    """Single-core rates of one pinned process per core, all started together."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ONE, str(c), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for c in cores
    ]
    return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=6.0)
    args = p.parse_args()
    rows = []
    with stoker.Loader(DATA, batch_size=256, image_size=224, workers=2) as loader:
        stream = loader.stream()
        common.time_stream(stream, len(loader))  # warm-up
        for r in range(args.rounds):
            steady, _ = common.time_stream(stream, len(loader))
            common.wait_idle()
            solo = pinned([0], args.seconds)[0]
            pair = sum(pinned([0, 1], args.seconds))
            rows.append((steady.rate, 2 * solo, pair))
            print(
                f"round {r + 1}: stoker {steady.rate:,.0f}, solo x2 {2 * solo:,.0f}, "
                f"pair {pair:,.0f} img/s",
                flush=True,
            )
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(
        f"medians: stoker {med[0]:,.0f}, one core x 2 {med[1]:,.0f}, two busy cores "
        f"{med[2]:,.0f} img/s"
    )
    print(
        f"stoker / (one core x 2) = {med[0] / med[1]:.2f}; "
        f"stoker / (two busy cores) = {med[0] / med[2]:.2f}"
    )


if __name__ == "__main__":
    main()
