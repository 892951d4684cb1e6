"""The source photographs of ``stoker.datasets``, carried in benchmarks/photos/ (scikit-learn's and
scikit-image's sample images, re-encoded as JPEG), for machines without those packages.

- ``make_folder(out, classes, per_class, workers)``: the ImageNet-like ImageFolder that
  ``stoker.datasets.make_image_folder`` writes, with the same recipe, from the carried photos.
- As a pytest plugin (``pytest -p photo_source``, with benchmarks/ on ``sys.path``), the
  suite's ``image_folder`` fixture uses the carried photos too.
"""

from __future__ import annotations

import functools
import itertools
import pathlib
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from PIL import Image

from stoker import datasets

PHOTOS = pathlib.Path(__file__).resolve().parent / "photos"


@functools.lru_cache(maxsize=1)
def carried_photos() -> tuple[Image.Image, ...]:
    """The carried photos, loaded as RGB (in ``stoker.datasets``' order)."""
    names = [pathlib.Path(rel).stem for _, rel in datasets._PHOTOS]
    out = []
    for name in names:
        with Image.open(PHOTOS / f"{name}.jpg") as im:
            out.append(im.convert("RGB"))
    return tuple(out)


def use_carried_photos() -> None:
    """Make ``stoker.datasets`` draw from the carried photos in this process."""
    datasets._photos = carried_photos  # type: ignore[assignment]


def make_folder(
    out: pathlib.Path,
    classes: int,
    per_class: int,
    workers: int,
    min_side: int = 300,
    max_side: int = 500,
) -> pathlib.Path:
    """An ImageFolder of ``classes`` x ``per_class`` JPEGs (q90) in ``out``, like
    ``make_image_folder``; kept if it is already complete."""
    rows = [(f"class_{c:03d}/img_{i:05d}.jpg", c) for c in range(classes) for i in range(per_class)]
    done = out / "labels.csv"
    if done.is_file() and all((out / rel).is_file() for rel, _ in rows):
        return out
    for c in range(classes):
        (out / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    jobs = [
        (out / rel, 0, c, i, min_side, max_side, "jpeg", 90)
        for (rel, c), i in zip(rows, itertools.cycle(range(per_class)), strict=False)
    ]
    use_carried_photos()
    if workers > 1:
        with ProcessPoolExecutor(
            workers, mp_context=get_context("spawn"), initializer=use_carried_photos
        ) as pool:
            list(pool.map(datasets._folder_image, jobs, chunksize=16))
    else:
        for job in jobs:
            datasets._folder_image(job)
    done.write_text("path,label\n" + "".join(f"{rel},{c}\n" for rel, c in rows))
    return out


def pytest_configure(config) -> None:  # noqa: ARG001 - the pytest hook's signature
    """Plugin hook: the suite's fixtures draw from the carried photos."""
    use_carried_photos()
