"""Write the committed JPEG part of stoker's conformance corpus (tests/corpus/jpeg/) with
libjpeg-turbo's ``cjpeg`` (``apt-get install libjpeg-turbo-progs``), which CI lacks:

    python scripts/make_corpus.py [--cjpeg /usr/bin/cjpeg]

One small picture (45x61: partial MCUs on both edges) in every sampling layout cjpeg writes,
with restart intervals, arithmetic coding, progressive scans, grayscale and RGB. The rest of
the corpus (warning cases, trailing data, CMYK/YCCK, APNG, EXIF-oriented WebP/PNG, BMP
variants, TIFF alpha kinds) is made by the tests themselves from these files and Pillow.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess

import numpy as np
from PIL import Image

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "corpus", "jpeg")

# name -> cjpeg switches. Sampling "HxV" is the luma factors (chroma 1x1) unless listed.
VARIANTS: dict[str, list[str]] = {
    "s444": ["-sample", "1x1"],
    "s422": ["-sample", "2x1"],
    "s440": ["-sample", "1x2"],
    "s420": ["-sample", "2x2"],
    "s411": ["-sample", "4x1"],
    "s441": ["-sample", "1x4"],
    "s410": ["-sample", "4x2"],
    "s2x4": ["-sample", "2x4"],
    "s3x1": ["-sample", "3x1"],
    "s1x3": ["-sample", "1x3"],
    "s2x1_1x2_1x1": ["-sample", "2x1,1x2,1x1"],
    "s2x2_1x1_2x1": ["-sample", "2x2,1x1,2x1"],
    "restart_1row": ["-sample", "2x2", "-restart", "1"],
    "restart_3blocks": ["-sample", "2x1", "-restart", "3B"],
    "arithmetic": ["-sample", "2x2", "-arithmetic"],
    "arithmetic_441": ["-sample", "1x4", "-arithmetic"],
    "progressive": ["-sample", "2x2", "-progressive"],
    "progressive_410": ["-sample", "4x2", "-progressive"],
    "progressive_arithmetic": ["-progressive", "-arithmetic"],
    "progressive_restart": ["-progressive", "-restart", "2"],
    "optimized": ["-optimize"],
    "grayscale": ["-grayscale"],
    "grayscale_progressive": ["-grayscale", "-progressive"],
    "rgb": ["-rgb"],
    "rgb_progressive": ["-rgb", "-progressive"],
    "quality100": ["-quality", "100", "-sample", "1x1"],
}


def picture(height: int = 45, width: int = 61) -> np.ndarray:
    """A deterministic picture with smooth gradients, edges and saturated colours."""
    y, x = np.mgrid[0:height, 0:width]
    checks = ((x // 8 + y // 8) % 2) * 110
    rgb = np.stack([x * 255 // (width - 1), y * 255 // (height - 1), checks + 70], axis=-1)
    rgb[: height // 3, : width // 3] = (230, 20, 30)
    return rgb.astype(np.uint8)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cjpeg", default="/usr/bin/cjpeg")
    args = p.parse_args()
    os.makedirs(OUT, exist_ok=True)
    ppm = io.BytesIO()
    Image.fromarray(picture()).save(ppm, "PPM")
    for name, switches in VARIANTS.items():
        data = subprocess.run(
            [args.cjpeg, "-quality", "90", *switches],
            input=ppm.getvalue(),
            capture_output=True,
            check=True,
        ).stdout
        with open(os.path.join(OUT, f"{name}.jpg"), "wb") as f:
            f.write(data)
    print(f"wrote {len(VARIANTS)} files to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
