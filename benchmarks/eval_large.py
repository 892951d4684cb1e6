"""augment="eval" on large camera photos (2-12 MP): stoker's reduced-size decode vs full decode.

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
    python benchmarks/eval_large.py                          # 64 photos, 3 rounds of 3 s
    python benchmarks/eval_large.py --count 4 --rounds 1 --seconds 1   # smoke
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402

SIZE, FRACTION = 224, 0.875


def rate(fn: Callable[[str, np.ndarray], None], paths: list[str], seconds: float) -> float:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/large_photos")
    ap.add_argument("--count", type=int, default=64, help="photos to generate/use")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="per method per round")
    ap.add_argument("--batch-size", type=int, default=8, help="stoker batch size")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import stoker
    from stoker import jpegcrop
    from stoker.cli import bench
    from stoker.datasets import make_large_photos
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
    methods["full decode (same resize)"] = lambda: rate(full_decode(False), paths, args.seconds)
    methods["full decode (linear)"] = lambda: rate(full_decode(True), paths, args.seconds)
    methods["pillow draft"] = lambda: rate(pillow_draft, paths, args.seconds)
    rates: dict[str, list[float]] = {k: [] for k in methods}
    try:
        for r in range(args.rounds):
            for name, fn in methods.items():
                rates[name].append(fn())
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.1f}" for k, v in rates.items()),
                flush=True,
            )
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
    common.write_json(
        args.json,
        {
            "facts": facts,
            "photos": len(paths),
            "megapixels": mp,
            "dct_scales": dict(scales),
            "rates": rates,
            "ratios": ratios,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
