"""The torchvision-style stock ops (stoker.ops.TrivialAugmentWide, RandAugment, RandomErasing,
ColorJitter) against the JPEG decode they follow, in the same run.

Two parts:

1. per-op cost: each pixel operation and each stock op on 224x224 uint8 crops of the folder's
   photos (median microseconds over many calls, one OpenCV thread as in a worker), next to the
   fused ``"train"`` pipeline's own read + crop decode + resize + flip of one sample;
2. the loader: ``augment="train"`` against ``["train", op]`` (the same fused decode, the op on
   its 224x224 output) for each op, ``workers`` processes, rounds interleaved so that a busy
   machine's drift hits every configuration alike; img/s and the ratio to plain ``"train"``
   (1.0 = the op is free; the decode is the limit).

    python /work/shared/make_dataset.py --out /tmp/aug_data --classes 4 --per-class 150
    PYTHONPATH=src python benchmarks/augment_ops.py /tmp/aug_data --workers 2 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import stoker
from stoker import imageops as im
from stoker import transforms
from stoker.cli.bench import tree_cpu
from stoker.ops import ColorJitter, RandAugment, RandomErasing, TrivialAugmentWide

SIZE = 224


def crops(folder: Path, count: int) -> tuple[list[np.ndarray], list[bytes]]:
    """224x224 train-pipeline crops of the first ``count`` photos, and their files' bytes."""
    files = sorted(folder.rglob("*.jpg"))[:count]
    datas = [f.read_bytes() for f in files]
    pipe = transforms.make_pipeline("train", (SIZE, SIZE), True, 1 << 28)
    out = []
    for k, data in enumerate(datas):
        u = np.random.default_rng(k).random(pipe.uniforms)
        slot = np.empty((SIZE, SIZE, 3), np.uint8)
        pipe.write(pipe.load(data, u), u, None, slot)
        out.append(slot)
    return out, datas


def median_us(fn: Callable[[int], Any], calls: int) -> float:
    """Median CPU time of this thread per ``fn(k)`` in microseconds (batches of 10 calls):
    CPU time, not wall time, so that other programs on a shared machine count less."""
    fn(0)
    times = []
    for start in range(0, calls, 10):
        t0 = time.thread_time()
        for k in range(start, start + 10):
            fn(k)
        times.append((time.thread_time() - t0) / 10 * 1e6)
    return statistics.median(times)


def op_costs(images: list[np.ndarray], datas: list[bytes], calls: int) -> list[tuple[str, float]]:
    """(name, median µs) for the pipeline's own decode and every op."""
    n = len(images)
    pipe = transforms.make_pipeline("train", (SIZE, SIZE), True, 1 << 28)
    slot = np.empty((SIZE, SIZE, 3), np.uint8)

    def decode(k: int) -> None:
        u = np.random.default_rng(k).random(pipe.uniforms)
        pipe.write(pipe.load(datas[k % len(datas)], u), u, None, slot)

    rows = [("train pipeline: crop decode + resize + flip (the peer)", median_us(decode, calls))]
    prims: list[tuple[str, Callable[[np.ndarray], Any]]] = [
        ("brightness 1.5", lambda a: im.brightness(a, 1.5)),
        ("contrast 0.5", lambda a: im.contrast(a, 0.5)),
        ("saturation 0.5 (Color)", lambda a: im.saturation(a, 0.5)),
        ("hue +0.1", lambda a: im.hue(a, 0.1)),
        ("sharpness 1.5", lambda a: im.sharpness(a, 1.5)),
        ("posterize 4", lambda a: im.posterize(a, 4)),
        ("solarize 128", lambda a: im.solarize(a, 128)),
        ("autocontrast", im.autocontrast),
        ("equalize", im.equalize),
        ("shear_x 0.3", lambda a: im.shear_x(a, 0.3)),
        ("translate 32", lambda a: im.translate(a, 32, 0)),
        ("rotate 30", lambda a: im.rotate(a, 30.0)),
    ]
    for name, fn in prims:
        rows.append((name, median_us(lambda k, fn=fn: fn(images[k % n]), calls)))
    for name, op in stock_ops().items():
        rows.append(
            (
                f"stoker.ops.{name}",
                median_us(lambda k, op=op: op(images[k % n], np.random.default_rng(k)), calls),
            )
        )
    return rows


def stock_ops() -> dict[str, Any]:
    """The ops measured, as torchvision's classification recipe uses them."""
    return {
        "TrivialAugmentWide()": TrivialAugmentWide(),
        "RandAugment()": RandAugment(),
        "RandomErasing(p=0.25)": RandomErasing(p=0.25),
        "RandomErasing(p=1)": RandomErasing(p=1.0),
        "ColorJitter(0.4, 0.4, 0.4, 0.1)": ColorJitter(0.4, 0.4, 0.4, 0.1),
    }


def loader_rate(
    folder: Path, augment: Any, workers: int, batch: int, epochs: int
) -> tuple[float, float]:
    """img/s of ``epochs`` full epochs after one warm-up epoch, and the CPU milliseconds per
    image of the whole process tree (workers included)."""
    with stoker.Loader(
        folder, batch_size=batch, image_size=SIZE, augment=augment, workers=workers, seed=0
    ) as loader:
        for _ in loader:  # warm-up: workers started, page cache warm
            pass
        t0, cpu0, images = time.perf_counter(), tree_cpu(), 0
        for _ in range(epochs):
            for x, _ in loader:
                images += len(x)
        wall, cpu = time.perf_counter() - t0, tree_cpu() - cpu0
        return images / wall, cpu / images * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per round and setting")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=300, help="calls per op in part 1")
    args = p.parse_args()
    cv2.setNumThreads(1)  # as in a worker
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (shared machine)")
    load_start = os.getloadavg()[0]

    images, datas = crops(args.folder, 40)
    print("\n1. per-op cost on a 224x224 uint8 crop (median CPU µs of the thread, one thread)")
    rows = op_costs(images, datas, args.calls)
    peer = rows[0][1]
    for name, us in rows:
        print(f"  {name:58s} {us:8.0f} µs  {us / peer:5.2f}x the decode")

    settings: dict[str, Any] = {'"train"': "train"}
    for name, op in stock_ops().items():
        settings[f'["train", {name}]'] = ["train", op]
    settings['["train", TrivialAugmentWide(), RandomErasing(p=0.25)]'] = [
        "train",
        TrivialAugmentWide(),
        RandomErasing(p=0.25),
    ]
    rates: dict[str, list[float]] = {k: [] for k in settings}
    cpus: dict[str, list[float]] = {k: [] for k in settings}
    for _ in range(args.rounds):
        for key, augment in settings.items():
            rate, cpu = loader_rate(args.folder, augment, args.workers, args.batch, args.epochs)
            rates[key].append(rate)
            cpus[key].append(cpu)
    base = statistics.median(rates['"train"'])
    base_cpu = statistics.median(cpus['"train"'])
    print(
        f"\n2. Loader, workers={args.workers}, batch {args.batch}, {SIZE}x{SIZE}: median of "
        f'{args.rounds} interleaved rounds: img/s (range), its ratio to "train", CPU ms per '
        "image (process tree) and its ratio"
    )
    for key, values in rates.items():
        med, cpu = statistics.median(values), statistics.median(cpus[key])
        print(
            f"  augment={key:56s} {med:7.0f} img/s ({min(values):.0f}-{max(values):.0f})"
            f"  {med / base:5.2f}x   {cpu:5.2f} ms  {cpu / base_cpu:5.2f}x"
        )
    print(f"load average at the start {load_start:.1f}, at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
