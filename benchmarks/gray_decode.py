"""``color_mode="grayscale"`` on JPEGs: libjpeg's own grayscale output (``decode(channels=1)``:
the Y plane, chroma never decoded) against the route stoker took before (RGB decode, then BT.601
luma) and against a plain RGB decode, on the sample photos in ``benchmarks/photos``.

The variants take turns, photo by photo and round by round, so a busy machine slows them alike;
the figure is the median over rounds of each variant's total time for all photos.

    python benchmarks/gray_decode.py [--rounds 15] [--json out.json]
"""

from __future__ import annotations

import argparse
import pathlib
import time

import cv2
import numpy as np
from common import median, print_facts, table, write_json

from stoker import decode as dec

PHOTOS = pathlib.Path(__file__).parent / "photos"


def _old_route(data: bytes, info: dec.ImageInfo) -> np.ndarray:
    """What ``color_mode="grayscale"`` did before: an RGB decode, then luma of it."""
    return cv2.cvtColor(np.ascontiguousarray(dec.decode(data, info)), cv2.COLOR_RGB2GRAY)


VARIANTS = {
    "rgb decode": lambda data, info: dec.decode(data, info),
    "gray: rgb decode + luma (before)": _old_route,
    "gray: libjpeg grayscale (channels=1)": lambda data, info: dec.decode(data, info, channels=1),
}


def main() -> None:
    """Time the variants side by side and print ms per photo and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    facts = print_facts()
    photos = [p.read_bytes() for p in sorted(PHOTOS.glob("*.jpg"))]
    infos = [dec.probe(d) for d in photos]
    totals: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, run in VARIANTS.items():
            start = time.perf_counter()
            for data, info in zip(photos, infos, strict=True):
                run(data, info)
            totals[name].append(time.perf_counter() - start)
    per_photo = {name: median(t) / len(photos) * 1e3 for name, t in totals.items()}
    rows = [[name, f"{ms:.3f}"] for name, ms in per_photo.items()]
    print(table(rows, ["variant", "ms/photo (median of rounds)"]))
    before = per_photo["gray: rgb decode + luma (before)"]
    gray = per_photo["gray: libjpeg grayscale (channels=1)"]
    print(
        f"gray before / gray now: {before / gray:.2f}x; "
        f"rgb / gray now: {per_photo['rgb decode'] / gray:.2f}x ({len(photos)} photos, "
        f"{args.rounds} rounds)"
    )
    write_json(args.json, {"facts": facts, "ms_per_photo": per_photo, "photos": len(photos)})


if __name__ == "__main__":
    main()
