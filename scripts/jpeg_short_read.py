"""What a JPEG short read would save on the default RandomResizedCrop (issue 31, item 4).

For each JPEG of an image folder and one seeded RandomResizedCrop box (scale 0.08-1, ratio
3/4-4/3: the Loader's default ``augment="train"``), find by bisection the shortest prefix of the
file whose crop-window decode (at the DCT scale the loader picks for a 224 px output) equals
the decode of the whole file; a crop that reaches the bottom edge needs the whole file. Prints
the share of bytes such reads would skip. Makes an ImageNet-like folder first when ``folder``
does not exist (``stoker.datasets.make_image_folder``, 4 classes x ``per_class``)::

    python scripts/jpeg_short_read.py /tmp/short-read-folder 50
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

from stoker.crops import random_resized_crop_box
from stoker.datasets import make_image_folder
from stoker.decode import jpegcrop

MIN_SIZE = (224, 224)


def needed(data: bytes, box: tuple[int, int, int, int], resolution: int = 64) -> int:
    """The shortest prefix of ``data`` (within ``resolution`` bytes) that decodes ``box``
    exactly as the whole file does."""
    ref = jpegcrop.decode_region(data, box, min_size=MIN_SIZE)
    lo, hi = 0, len(data)
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        try:
            got = jpegcrop.decode_region(data[:mid], box, min_size=MIN_SIZE, notes=[])
            ok = got.shape == ref.shape and bool(np.array_equal(got, ref))
        except ValueError:
            ok = False
        lo, hi = (lo, mid) if ok else (mid, hi)
    return hi


def main(folder: pathlib.Path, per_class: int) -> None:
    """Measure the folder's JPEGs and print the figure."""
    if not folder.exists():
        make_image_folder(folder, classes=4, per_class=per_class, seed=0)
    files = sorted(folder.rglob("*.jpg"))
    rng = np.random.default_rng(0)
    total = need = above = 0
    for path in files:
        data = path.read_bytes()
        h, w = jpegcrop.header(data)[:2]
        box = random_resized_crop_box(h, w, rng.random(40), (0.08, 1.0), (3 / 4, 4 / 3))
        total += len(data)
        if box[0] + box[2] >= h:
            need += len(data)
            continue
        above += 1
        need += needed(data, box)
    print(
        f"{len(files)} JPEGs, {above} crops end above the bottom edge; a short read needs "
        f"{need / total:.3f} of the bytes ({1 - need / total:.1%} saved)"
    )


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 50)
