"""torch-tensor augmentations through stoker's ``augment=`` against PyTorch's DataLoader doing
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
    python benchmarks/augment_threads.py --data /tmp/stoker-bench/jpeg2k
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import stoker  # noqa: E402
from stoker.transforms import random_resized_crop_box  # noqa: E402

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


def trivial_space(bins: int, h: int, w: int) -> dict[str, tuple[np.ndarray, bool]]:
    """TrivialAugmentWide's ops: (magnitudes per bin, signed)."""
    lin = np.linspace
    return {
        "Identity": (np.zeros(1), False),
        "ShearX": (lin(0, 0.99, bins), True),
        "ShearY": (lin(0, 0.99, bins), True),
        "TranslateX": (lin(0, 32, bins), True),
        "TranslateY": (lin(0, 32, bins), True),
        "Rotate": (lin(0, 135, bins), True),
        "Brightness": (lin(0, 0.99, bins), True),
        "Color": (lin(0, 0.99, bins), True),
        "Contrast": (lin(0, 0.99, bins), True),
        "Sharpness": (lin(0, 0.99, bins), True),
        "Posterize": (8 - np.round(np.arange(bins) / ((bins - 1) / 6)), False),
        "Solarize": (lin(255, 0, bins), False),
        "AutoContrast": (np.zeros(1), False),
        "Equalize": (np.zeros(1), False),
    }


def rand_space(bins: int, h: int, w: int) -> dict[str, tuple[np.ndarray, bool]]:
    """RandAugment's ops: (magnitudes per bin, signed)."""
    lin = np.linspace
    return {
        "Identity": (np.zeros(bins), False),
        "ShearX": (lin(0, 0.3, bins), True),
        "ShearY": (lin(0, 0.3, bins), True),
        "TranslateX": (lin(0, 150 / 331 * w, bins), True),
        "TranslateY": (lin(0, 150 / 331 * h, bins), True),
        "Rotate": (lin(0, 30, bins), True),
        "Brightness": (lin(0, 0.9, bins), True),
        "Color": (lin(0, 0.9, bins), True),
        "Contrast": (lin(0, 0.9, bins), True),
        "Sharpness": (lin(0, 0.9, bins), True),
        "Posterize": (8 - np.round(np.arange(bins) / ((bins - 1) / 4)), False),
        "Solarize": (lin(255, 0, bins), False),
        "AutoContrast": (np.zeros(bins), False),
        "Equalize": (np.zeros(bins), False),
    }


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
        if self.kind == "trivial":
            space = trivial_space(31, self.size, self.size)
            img = self._one(img, space, rng, None)
        else:
            space = rand_space(31, self.size, self.size)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/tmp/stoker-bench/jpeg2k")
    ap.add_argument("--policies", default="trivial,rand")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20, help="timed batches per run")
    ap.add_argument(
        "--alone-batches",
        type=int,
        default=4,
        help="timed batches per run with worker_threads=None (it is slow)",
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    common.print_facts()
    print(
        f"data {args.data}; batch {args.batch_size}; {args.size} px; 2 workers each; "
        f"{args.rounds} interleaved rounds; trainer torch threads {torch.get_num_threads()}"
    )
    for kind in args.policies.split(","):
        policy = Policy(kind, args.size)
        runs: dict[str, list[float]] = {"stoker": [], "DataLoader": [], "stoker, pools alone": []}
        for r in range(args.rounds):
            runs["stoker"].append(
                timed(
                    lambda p=policy: stoker_batches(args.data, p, args.batch_size, 1),
                    args.warmup,
                    args.batches,
                )
            )
            runs["DataLoader"].append(
                timed(
                    lambda p=policy: dataloader_batches(args.data, p, args.batch_size),
                    args.warmup,
                    args.batches,
                )
            )
            runs["stoker, pools alone"].append(
                timed(
                    lambda p=policy: stoker_batches(args.data, p, args.batch_size, None),
                    args.warmup,
                    args.alone_batches,
                )
            )
            print(
                f"  {kind} round {r + 1}: "
                + ", ".join(f"{name} {v[-1]:,.0f}" for name, v in runs.items())
                + " img/s",
                flush=True,
            )
        med = {name: statistics.median(v) for name, v in runs.items()}
        print(f"{kind}: " + "; ".join(f"{name} {v:,.0f} img/s" for name, v in med.items()))
        print(
            f"  stoker / DataLoader: {med['stoker'] / med['DataLoader']:.2f}x (goal >= 1.0x); "
            f"stoker / stoker with the pools alone: "
            f"{med['stoker'] / med['stoker, pools alone']:.1f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
