"""Where stoker and Pillow disagree on damaged JPEGs: a tally of outcomes over mutated copies.

    python scripts/compare_corrupt_jpeg.py [--copies 300] [--seed 1]

A 320x240 picture is encoded by Pillow as a baseline 4:2:0 and as a progressive JPEG; each
copy has one to three bytes of its scan data set to random values. Each copy is decoded whole
by Pillow (``Image.load()``) and by stoker (``stoker.decode.decode``, with its notes), and the
script prints how many copies of each kind fell in each (Pillow, stoker) outcome: ``ok``,
``refused``, and for stoker ``warned`` (decoded with libjpeg warnings: a bad file under
``strict_decode=True``). docs/decoding.md quotes its figures.
"""

from __future__ import annotations

import argparse
import collections
import io

import numpy as np
from PIL import Image

from stoker.decode import decode


def _picture() -> Image.Image:
    y, x = np.mgrid[0:240, 0:320]
    return Image.fromarray(np.stack([x, y, (x ^ y) & 255], -1).astype(np.uint8))


def _encoded(progressive: bool) -> bytes:
    buf = io.BytesIO()
    _picture().save(buf, "JPEG", quality=90, progressive=progressive)
    return buf.getvalue()


def _pillow(data: bytes) -> str:
    try:
        Image.open(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - any refusal counts
        return "refused"
    return "ok"


def _stoker(data: bytes) -> str:
    notes: list[str] = []
    try:
        decode(data, notes=notes)
    except Exception:  # noqa: BLE001 - any refusal counts
        return "refused"
    return "warned" if notes else "ok"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=300, help="mutated copies per kind")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    tally: collections.Counter = collections.Counter()
    for kind, progressive in (("baseline 4:2:0", False), ("progressive", True)):
        data = _encoded(progressive)
        scan = data.index(b"\xff\xda") + 14
        for _ in range(args.copies):
            copy = bytearray(data)
            for _ in range(int(rng.integers(1, 4))):
                copy[int(rng.integers(scan, len(data) - 2))] = int(rng.integers(0, 256))
            tally[(kind, _pillow(bytes(copy)), _stoker(bytes(copy)))] += 1
    print(f"{'kind':16s} {'Pillow':8s} {'stoker':8s} copies")
    for (kind, pil, sto), n in sorted(tally.items()):
        print(f"{kind:16s} {pil:8s} {sto:8s} {n}")


if __name__ == "__main__":
    main()
