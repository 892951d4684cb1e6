"""Augmentation: stock ops, and threads inside workers.

Cases (one per former script; `python benchmarks/augment.py CASE --help` for each one's options):

    ops          (was augment_ops.py) The torchvision-style stock ops
                 (stoker.ops.TrivialAugmentWide, RandAugment, RandomErasing, ColorJitter) against
                 the JPEG decode they follow, in the same run.
    threads      (was augment_threads.py) torch-tensor augmentations through stoker's ``augment=``
                 against PyTorch's DataLoader doing the same, and against stoker with its workers'
                 thread pools left alone (the cost of a torch that keeps one intra-op thread per
                 core in every worker).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse
import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import common
import cv2
import numpy as np
import torch
import torch.nn.functional as F

import stoker
from stoker import imageops as im
from stoker import transforms
from stoker.cli.bench import tree_cpu
from stoker.ops import ColorJitter, RandAugment, RandomErasing, TrivialAugmentWide
from stoker.transforms import random_resized_crop_box

# ---------------------------------------------------------------------------- ops

OPS_DOC = """\
The torchvision-style stock ops (stoker.ops.TrivialAugmentWide, RandAugment, RandomErasing,
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
    PYTHONPATH=src python benchmarks/augment.py ops /tmp/aug_data --workers 2 --rounds 3
"""

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


def ops_main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=OPS_DOC.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs per round and setting")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=300, help="calls per op in part 1")
    p.add_argument("--json", default=None, metavar="PATH", help="write part 2's rounds here")
    args = p.parse_args(argv)
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
    cpus: dict[str, list[float]] = {k: [] for k in settings}

    def measure(key: str) -> float:
        rate, cpu = loader_rate(args.folder, settings[key], args.workers, args.batch, args.epochs)
        cpus[key].append(cpu)
        return rate

    peers = [common.Peer(key, lambda key=key: measure(key)) for key in settings]
    result = common.interleave(peers, args.rounds, warmup=0)
    print(
        f"\n2. Loader, workers={args.workers}, batch {args.batch}, {SIZE}x{SIZE}: "
        f'{args.rounds} interleaved rounds: img/s and its ratio to "train"'
    )
    common.report(result, '"train"', args.json)
    base_cpu = statistics.median(cpus['"train"'])
    print('CPU ms per image (process tree, median) and its ratio to "train":')
    for key, values in cpus.items():
        cpu = statistics.median(values)
        # CPU times tick in 10 ms steps: a short run's base can read 0, which has no ratio
        ratio = f"{cpu / base_cpu:5.2f}x" if base_cpu > 0 else "  n/a (base below the clock tick)"
        print(f"  augment={key:56s} {cpu:5.2f} ms  {ratio}")
    print(f"load average at the start {load_start:.1f}, at the end {os.getloadavg()[0]:.1f}")


# ---------------------------------------------------------------------------- threads

THREADS_DOC = """\
torch-tensor augmentations through stoker's ``augment=`` against PyTorch's DataLoader doing
the same, and against stoker with its workers' thread pools left alone (the cost of a torch
that keeps one intra-op thread per core in every worker).

The policies follow torchvision's ``TrivialAugmentWide`` (one op of 14, a magnitude bin drawn
from 31) and ``RandAugment(num_ops=2, magnitude=9)``: identity, shear x/y, translate x/y,
rotate (nearest, fill 0), brightness, colour (saturation), contrast, sharpness, posterize,
solarize, autocontrast, equalize, written here with plain torch ops on uint8 ``(3, H, W)``
tensors (torchvision cannot be installed beside this torch). Every sample is the same work in
every pipeline: decode the JPEG (stoker: its libjpeg-turbo extension; DataLoader: OpenCV's
libjpeg-turbo), a random resized crop to ``--size`` (cv2, linear), the policy on the tensor,
back to an ``(H, W, 3)`` uint8 array; the batch is collated in the consumer.

Pipelines, 2 workers each, rebuilt each round, rounds interleaved:

    stoker                 Loader(augment=fn), worker_threads=1 (the default)
    DataLoader             num_workers=2, persistent workers (torch sets 1 thread per worker)
    stoker, pools alone    Loader(augment=fn, worker_threads=None): each library's default

Each run times ``--batches`` batches after ``--warmup`` batches (start-up excluded);
img/s is the median over rounds, with the ratio of the medians.

Usage
    python /work/shared/make_dataset.py --out /tmp/stoker-bench/jpeg2k --classes 10 --per-class 200
    python benchmarks/augment.py threads --data /tmp/stoker-bench/jpeg2k
"""

# ---------------------------------------------------------------------------- tensor ops


def _blend(img: torch.Tensor, other: torch.Tensor, factor: float) -> torch.Tensor:
    return (factor * img.float() + (1.0 - factor) * other).clamp(0, 255).to(torch.uint8)


def _gray(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img.float().unbind(0)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(0)


def _affine(
    img: torch.Tensor,
    angle: float = 0.0,
    tx: float = 0.0,
    ty: float = 0.0,
    shear_x: float = 0.0,
    shear_y: float = 0.0,
) -> torch.Tensor:
    """Rotate (degrees), translate (pixels) and shear (degrees) about the centre; nearest
    neighbour, fill 0, as torchvision's tensor ``affine``."""
    _, h, w = img.shape
    a, sx, sy = math.radians(angle), math.radians(shear_x), math.radians(shear_y)
    rot = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    shear = torch.tensor([[1.0, -math.tan(sx)], [-math.tan(sy), 1.0]])
    forward = rot @ shear
    inverse = torch.linalg.inv(forward)
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=torch.float32) - (h - 1) / 2 - ty,
        torch.arange(w, dtype=torch.float32) - (w - 1) / 2 - tx,
        indexing="ij",
    )
    src = torch.stack([xs, ys], -1) @ inverse.T  # output pixel -> input pixel, both centred
    grid = 2 * src / torch.tensor([w, h], dtype=torch.float32)  # align_corners=False units
    out = F.grid_sample(
        img.float()[None], grid[None], mode="nearest", padding_mode="zeros", align_corners=False
    )
    return out[0].round().to(torch.uint8)


def _sharpness(img: torch.Tensor, factor: float) -> torch.Tensor:
    kernel = torch.ones(3, 1, 3, 3)
    kernel[:, :, 1, 1] = 5.0
    smooth = F.conv2d(img.float()[None], kernel / 13.0, groups=3)[0]
    degenerate = img.float().clone()
    degenerate[:, 1:-1, 1:-1] = smooth.round()
    return _blend(img, degenerate, factor)


def _autocontrast(img: torch.Tensor) -> torch.Tensor:
    x = img.float()
    lo = x.amin(dim=(1, 2), keepdim=True)
    hi = x.amax(dim=(1, 2), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, torch.ones_like(hi), 255.0 / (hi - lo))
    lo = torch.where(flat, torch.zeros_like(lo), lo)
    return ((x - lo) * scale).clamp(0, 255).to(torch.uint8)


def _equalize(img: torch.Tensor) -> torch.Tensor:
    out = []
    for channel in img:
        hist = torch.bincount(channel.flatten().long(), minlength=256)
        nonzero = hist[hist != 0]
        step = torch.div(hist.sum() - nonzero[-1], 255, rounding_mode="floor")
        if step == 0:
            out.append(channel)
            continue
        lut = torch.div(
            torch.cumsum(hist, 0) + torch.div(step, 2, rounding_mode="floor"),
            step,
            rounding_mode="floor",
        )
        lut = F.pad(lut, [1, 0])[:-1].clamp(0, 255)
        out.append(lut[channel.long()].to(torch.uint8))
    return torch.stack(out)


def apply_op(img: torch.Tensor, name: str, mag: float) -> torch.Tensor:
    """torchvision's ``_apply_op`` for one op name and a signed magnitude."""
    if name == "ShearX":
        return _affine(img, shear_x=math.degrees(math.atan(mag)))
    if name == "ShearY":
        return _affine(img, shear_y=math.degrees(math.atan(mag)))
    if name == "TranslateX":
        return _affine(img, tx=int(mag))
    if name == "TranslateY":
        return _affine(img, ty=int(mag))
    if name == "Rotate":
        return _affine(img, angle=mag)
    if name == "Brightness":
        return _blend(img, torch.zeros(1), 1.0 + mag)
    if name == "Color":
        return _blend(img, _gray(img), 1.0 + mag)
    if name == "Contrast":
        return _blend(img, _gray(img).mean(), 1.0 + mag)
    if name == "Sharpness":
        return _sharpness(img, 1.0 + mag)
    if name == "Posterize":
        return img & (-(1 << (8 - int(mag))) & 0xFF)
    if name == "Solarize":
        return torch.where(img >= mag, 255 - img, img)
    if name == "AutoContrast":
        return _autocontrast(img)
    if name == "Equalize":
        return _equalize(img)
    return img  # Identity


def op_space(kind: str, bins: int, h: int, w: int) -> dict[str, tuple[np.ndarray, bool]]:
    """TrivialAugmentWide's (``kind="trivial"``) or RandAugment's (``"rand"``) ops, as
    torchvision tables them: ``{op: (magnitudes per bin, signed)}``."""
    wide = kind == "trivial"
    shear, tone = (0.99, 0.99) if wide else (0.3, 0.9)
    tx, ty, rotate = (32, 32, 135) if wide else (150 / 331 * w, 150 / 331 * h, 30)
    flat = np.zeros(1 if wide else bins)  # ops without a magnitude
    space = {"Identity": (flat, False)}
    tops = {"ShearX": shear, "ShearY": shear, "TranslateX": tx, "TranslateY": ty, "Rotate": rotate}
    tops.update(dict.fromkeys(("Brightness", "Color", "Contrast", "Sharpness"), tone))
    for name, top in tops.items():  # the signed ops
        space[name] = (np.linspace(0, top, bins), True)
    space["Posterize"] = (8 - np.round(np.arange(bins) / ((bins - 1) / (6 if wide else 4))), False)
    space["Solarize"] = (np.linspace(255, 0, bins), False)
    space["AutoContrast"] = space["Equalize"] = (flat, False)
    return space


class Policy:
    """``(image HWC uint8, rng) -> image``: random resized crop to ``size``, then the policy on
    a torch tensor (``"trivial"``: one op, a random bin; ``"rand"``: 2 ops at bin 9 of 31)."""

    def __init__(self, kind: str, size: int) -> None:
        self.kind, self.size = kind, size

    def __call__(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        t, left, h, w = random_resized_crop_box(
            image.shape[0], image.shape[1], rng.random(40), (0.08, 1.0), (3 / 4, 4 / 3)
        )
        crop = cv2.resize(
            image[t : t + h, left : left + w],
            (self.size, self.size),
            interpolation=cv2.INTER_LINEAR,
        )
        img = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)
        space = op_space(self.kind, 31, self.size, self.size)
        if self.kind == "trivial":
            img = self._one(img, space, rng, None)
        else:
            for _ in range(2):
                img = self._one(img, space, rng, 9)
        return img.permute(1, 2, 0).contiguous().numpy()

    @staticmethod
    def _one(
        img: torch.Tensor, space: dict, rng: np.random.Generator, bin_: int | None
    ) -> torch.Tensor:
        names = list(space)
        name = names[int(rng.integers(len(names)))]
        mags, signed = space[name]
        mag = float(
            mags[int(rng.integers(len(mags))) if bin_ is None else min(bin_, len(mags) - 1)]
        )
        if signed and rng.random() < 0.5:
            mag = -mag
        return apply_op(img, name, mag)


# ---------------------------------------------------------------------------- pipelines


class JpegDataset:
    """DataLoader's map-style dataset: decode, the policy, a tensor (rng from the index)."""

    def __init__(self, paths: list[str], labels: list[int], policy: Policy, seed: int) -> None:
        self.paths, self.labels, self.policy, self.seed = paths, labels, policy, seed

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        data = np.fromfile(self.paths[i], np.uint8)
        image = cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        out = self.policy(image, np.random.default_rng([self.seed, i]))
        return torch.from_numpy(out), self.labels[i]


def stoker_batches(
    data: str, policy: Policy, batch_size: int, threads: int | None
) -> tuple[Iterator[Any], Callable[[], None]]:
    loader = stoker.Loader(
        data,
        batch_size=batch_size,
        image_size=policy.size,
        augment=policy,
        workers=2,
        worker_threads=threads,
        seed=0,
    )
    return iter(loader.stream()), loader.close


def dataloader_batches(
    data: str, policy: Policy, batch_size: int
) -> tuple[Iterator[Any], Callable[[], None]]:
    from torch.utils.data import DataLoader

    items = common.list_items(data)
    dataset = JpegDataset([p for p, _ in items], [y for _, y in items], policy, 0)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(0),
    )

    def stream() -> Iterator[Any]:
        while True:
            yield from loader

    def close() -> None:
        it = getattr(loader, "_iterator", None)
        if it is not None:
            it._shutdown_workers()

    return stream(), close


def timed(
    make: Callable[[], tuple[Iterator[Any], Callable[[], None]]], warmup: int, batches: int
) -> float:
    """img/s over ``batches`` batches after ``warmup`` (the start-up is not counted)."""
    stream, close = make()
    try:
        for _ in range(warmup):
            next(stream)
        t0, images = time.perf_counter(), 0
        for _ in range(batches):
            images += len(next(stream)[0])
        return images / (time.perf_counter() - t0)
    finally:
        close()


def threads_peers(args: argparse.Namespace, policy: Policy) -> list[common.Peer]:
    """stoker, the DataLoader and stoker with its workers' thread pools alone, as peers."""
    data, size = args.data, args.batch_size
    runs = {
        "stoker": (lambda: stoker_batches(data, policy, size, 1), args.batches),
        "DataLoader": (lambda: dataloader_batches(data, policy, size), args.batches),
        "stoker, pools alone": (
            lambda: stoker_batches(data, policy, size, None),
            args.alone_batches,
        ),
    }
    return [
        common.Peer(name, lambda make=make, n=n: timed(make, args.warmup, n))
        for name, (make, n) in runs.items()
    ]


def threads_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=THREADS_DOC.split("\n")[0])
    ap.add_argument("--data", default="/tmp/stoker-bench/jpeg2k")
    ap.add_argument("--policies", default="trivial,rand")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20, help="timed batches per run")
    ap.add_argument("--alone-batches", type=int, default=4, help="with worker_threads=None")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches per run first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None, metavar="PATH", help="write PATH.POLICY.json")
    args = ap.parse_args(argv)
    common.print_facts()
    print(
        f"data {args.data}; batch {args.batch_size}; {args.size} px; 2 workers each; "
        f"{args.rounds} interleaved rounds; trainer torch threads {torch.get_num_threads()}"
    )
    for kind in args.policies.split(","):
        print(f"{kind}:", flush=True)
        peers = threads_peers(args, Policy(kind, args.size))
        result = common.interleave(peers, args.rounds, warmup=0, progress="{:,.0f}")
        common.report(result, "DataLoader", args.json and f"{args.json}.{kind}.json")
        alone = result.ratio("stoker", "stoker, pools alone")["median"]
        print(
            f"  stoker / DataLoader: {result.ratio('stoker', 'DataLoader')['median']:.2f}x "
            f"(goal >= 1.0x); stoker / stoker with the pools alone: {alone:.1f}x",
            flush=True,
        )


# ---------------------------------------------------------------------------- cases

CASES = common.cases(ops_main, threads_main)


if __name__ == "__main__":
    sys.exit(common.run_cases(__doc__, CASES))
