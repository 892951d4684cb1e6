"""The user's scenario: does loading overlap with training? Epoch time with a fake train step.

The "train step" takes as long as the loader needs to produce a batch, the hardest case for
overlap (input and compute exactly balanced): T = stoker's load-only epoch time / batches,
measured first. The step is ``time.sleep(T)``: a real accelerator step leaves the CPU free, and
on this 2-core machine a busy-waiting main thread would take a whole core from the 2 workers
(pass --busy to see that case). Every pipeline trains on the same number of batches of 256.

    stoker         Loader(workers=2); `for x, y in loader: step()`; epochs back to back, as in
                   training (its prefetch runs across epoch boundaries)
    naive          what the user did before: load a chunk of --chunk images (default 8,000, or
                   the whole epoch if smaller) synchronously in the main process with Pillow
                   (keras load_img-style open + the same RandomResizedCrop + flip), then
                   "train" on it batch by batch, then load the next chunk...
    torch-pillow   PyTorch DataLoader(num_workers=2, persistent_workers=True) + Pillow (peers.py)

For each: L = load-only epoch time, C = compute = batches x T, E = epoch time with the step.
overlap ratio = E / max(C, L): 1.0 is perfect overlap, 2.0 is no overlap at all. Goal: stoker
<= 1.05. The load-only and the training epochs ALTERNATE (round r: L_r, then E_r) and the ratio
is the median of E_r / max(C, L_r): this VM's speed drifts by ~10% over tens of seconds, and
with compute and loading balanced exactly, a load-only figure taken a minute earlier decides
the ratio more than the overlap does. stoker's load-only epoch is its steady stream with the
batches made ahead while idle drained first (common.time_stream); its training epoch is
likewise the steady span of continuous training: from the arrival of a batch, len(loader)
times "step, then take the next batch" (an isolated epoch would add a pipeline fill and a last
step that continuous training overlaps with the next epoch: +1/len(loader), ~4% here).

Usage
    python benchmarks/overlap.py                          # full dataset, 3 epochs each
    python benchmarks/overlap.py --max-images 1024 --epochs 1   # smoke
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402
import peers  # noqa: E402


def make_step(seconds: float, busy: bool) -> Callable[[Any], None]:
    """The fake train step: sleep (accelerator-like) or busy-wait (CPU-bound) ``seconds``."""
    if busy:

        def step(_: Any) -> None:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                pass
    else:

        def step(_: Any) -> None:
            time.sleep(seconds)

    return step


def steady_training(stream: Any, batches: int, step: Callable[[Any], None]) -> float:
    """Seconds for ``batches`` cycles of (step, next batch), from a batch's arrival."""
    batch = next(stream)
    t0 = time.perf_counter()
    for _ in range(batches):
        step(batch)
        batch = next(stream)
    return time.perf_counter() - t0


def naive_epoch(
    items: list[tuple[str, int]],
    batches: int,
    batch_size: int,
    chunk: int,
    step: Callable[[Any], None] | None,
    rng: random.Random,
) -> tuple[float, float]:
    """Load-a-chunk-then-train epoch; returns (epoch seconds, seconds spent loading)."""
    order = list(range(len(items)))
    rng.shuffle(order)
    order = order[: batches * batch_size]
    t0, loading = time.perf_counter(), 0.0
    for start in range(0, len(order), chunk):
        ids = order[start : start + chunk]
        t1 = time.perf_counter()
        x = np.empty((len(ids), 224, 224, 3), np.uint8)
        y = np.empty(len(ids), np.int64)
        for j, i in enumerate(ids):
            x[j] = peers.pil_sample(items[i][0], 224, rng)
            y[j] = items[i][1]
        loading += time.perf_counter() - t1
        if step is not None:
            for b in range(0, len(ids), batch_size):
                step((x[b : b + batch_size], y[b : b + batch_size]))
    return time.perf_counter() - t0, loading


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=common.DEFAULT_DATA)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-images", type=int, default=0, help="random subset (smoke runs)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=8000, help="naive: images loaded per chunk")
    ap.add_argument("--busy", action="store_true", help="busy-wait instead of sleep")
    ap.add_argument("--only", default="stoker,naive,torch-pillow")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))

    facts = common.print_facts()
    all_items = common.list_items(args.data)
    items = common.subset(all_items, args.max_images)
    common.warm_page_cache(p for p, _ in items)
    data = args.data if len(items) == len(all_items) else None
    results: dict[str, dict[str, Any]] = {}

    # stoker first: it defines T
    stoker_pipe = peers.make(
        "stoker", items, data=data, batch_size=args.batch_size, workers=args.workers
    )
    loader = stoker_pipe.obj
    n = len(loader)
    with stoker_pipe:
        stream = loader.stream()
        common.time_stream(stream, n)  # warm-up: worker start
        t_step = common.time_stream(stream, n)[0].seconds / n
        step = make_step(t_step, args.busy)
        print(
            f"stoker load-only epoch {t_step * n:.2f} s for {n} batches -> "
            f"train step T = {t_step * 1000:.1f} ms ({'busy-wait' if args.busy else 'sleep'})"
        )
        loads, epochs, wait = [], [], 0.0
        for _ in range(args.epochs):
            loads.append(common.time_stream(stream, n)[0].seconds)
            s0 = loader.stats()
            epochs.append(steady_training(stream, n, step))
            s1 = loader.stats()
            wait += (s1.wait_s - s0.wait_s) / max(1e-9, s1.elapsed_s - s0.elapsed_s)
        share = wait / args.epochs
        results["stoker"] = {"load": loads, "epochs": epochs, "wait_share": share}
        print(
            f"  stoker load-only {[round(e, 2) for e in loads]}, with training "
            f"{[round(e, 2) for e in epochs]}; waited for data {share:.1%} of the time "
            "(stoker's stats, training epochs only)"
        )
    compute = n * t_step

    if "torch-pillow" in only:
        with peers.make(
            "torch-pillow", items, batch_size=args.batch_size, workers=args.workers
        ) as dl:
            common.time_epoch(dl.epoch())  # warm-up: worker start
            loads, epochs = [], []
            for _ in range(args.epochs):
                loads.append(common.time_epoch(dl.epoch()).seconds)
                epochs.append(common.time_epoch(dl.epoch(), step).seconds)
        results["torch-pillow"] = {"load": loads, "epochs": epochs}
        print(
            f"  torch-pillow load-only {[round(e, 2) for e in loads]}, with training "
            f"{[round(e, 2) for e in epochs]}"
        )

    if "naive" in only:
        rng = random.Random(0)
        runs = [
            naive_epoch(items, n, args.batch_size, args.chunk, step, rng)
            for _ in range(args.epochs)
        ]
        results["naive"] = {"load": [r[1] for r in runs], "epochs": [r[0] for r in runs]}
        print(
            f"  naive epochs {[round(r[0], 2) for r in runs]} (of which loading "
            f"{[round(r[1], 2) for r in runs]})"
        )

    rows = []
    for name, r in results.items():
        load, epoch = common.median(r["load"]), common.median(r["epochs"])
        ratio = common.median(
            [e / max(compute, x) for e, x in zip(r["epochs"], r["load"], strict=True)]
        )
        goal = "<= 1.05" if name == "stoker" else ""
        verdict = ("PASS" if ratio <= 1.05 else "MISS") if goal else ""
        r.update(load_s=load, epoch_s=epoch, compute_s=compute, ratio=ratio)
        rows.append(
            [name, f"{load:.2f}", f"{compute:.2f}", f"{epoch:.2f}", f"{ratio:.2f}", goal, verdict]
        )
    print(
        f"\n{n} batches of {args.batch_size} per epoch; train step {t_step * 1000:.1f} ms "
        f"({'busy-wait' if args.busy else 'sleep: leaves the CPU to the workers'}); "
        f"medians of {args.epochs} rounds (ratio: median of the per-round ratios)"
    )
    print(
        common.table(
            rows,
            [
                "pipeline",
                "load-only s",
                "compute s",
                "epoch s",
                "epoch/max(C,L)",
                "goal",
                "verdict",
            ],
        )
    )
    if "naive" in results and "stoker" in results:
        print(
            f"stoker epoch is {results['naive']['epoch_s'] / results['stoker']['epoch_s']:.2f}x"
            " faster than load-then-train"
        )
    common.write_json(
        args.json, {"facts": facts, "images": len(items), "step_s": t_step, "results": results}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
