"""Small, realistic image datasets for demos, tests and benchmarks, made on the spot.

Every image is cut from a real photograph bundled inside the scikit-image and scikit-learn
wheels (nothing is downloaded), so files look like camera JPEGs rather than synthetic noise:
real edges and textures, ImageNet-like sizes, 4:2:0 JPEG at quality ~90.

Class ``k`` always crops from the same photo (``k mod n_photos``), with a class-specific
channel order once the photos run out, so a tiny CNN has something to learn. Output is a
pure function of the arguments (each image has its own RNG from
``numpy.random.SeedSequence([seed, class, index])``) and calls are idempotent: a complete
dataset made with the same arguments is recognised by its marker file and left alone.

Needs the ``demo`` extra: ``pip install 'stoker[demo]'``.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import importlib.util
import io
import itertools
import json
import math
import os
import pathlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from .errors import ConfigError

__all__ = ["MARKER", "make_image_folder", "make_large_photos"]

MARKER = ".stoker-dataset.json"
"""Name of the JSON file that records how a generated dataset was made."""

_VERSION = 1  # bump when the images a given set of arguments produces change
_PHOTOS = (  # (package, path inside it); distinct scenes, in a fixed order
    ("sklearn", "datasets/images/china.jpg"),
    ("sklearn", "datasets/images/flower.jpg"),
    ("skimage", "data/astronaut.png"),
    ("skimage", "data/chelsea.png"),
    ("skimage", "data/coffee.png"),
    ("skimage", "data/hubble_deep_field.jpg"),
    ("skimage", "data/ihc.png"),
    ("skimage", "data/motorcycle_left.png"),
    ("skimage", "data/retina.jpg"),
    ("skimage", "data/rocket.jpg"),
)
_CHANNEL_ORDERS = tuple(itertools.permutations(range(3)))  # identity first
_ASPECTS = (4 / 3, 3 / 2, 16 / 9, 1.0, 3 / 4, 2 / 3)  # camera frames for large photos
_FORMATS = {"jpeg": "jpg", "png": "png"}


@functools.lru_cache(maxsize=1)
def _photos() -> tuple[Image.Image, ...]:
    """The bundled source photographs as loaded RGB images (once per process)."""
    photos = []
    for package, rel in _PHOTOS:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ImportError(
                "stoker.datasets needs scikit-image and scikit-learn for their bundled "
                "photographs: pip install 'stoker[demo]'"
            )
        path = pathlib.Path(list(spec.submodule_search_locations)[0], rel)
        if not path.is_file():
            raise FileNotFoundError(f"bundled photo {path} is missing; reinstall {package}")
        with Image.open(path) as im:
            photos.append(im.convert("RGB"))
    return tuple(photos)


def _crop(
    photo: Image.Image, rng: np.random.Generator, size: tuple[int, int], area: tuple[float, float]
) -> Image.Image:
    """A random crop of ``photo`` with the aspect of ``size`` (w, h), resized to ``size``."""
    (pw, ph), (w, h) = photo.size, size
    cw_max = min(pw, ph * w / h)
    cw = cw_max * math.sqrt(rng.uniform(*area))
    ch = cw * h / w
    x0, y0 = rng.uniform(0, pw - cw), rng.uniform(0, ph - ch)
    return photo.resize(size, Image.Resampling.BICUBIC, box=(x0, y0, x0 + cw, y0 + ch))


def _jitter(im: Image.Image, rng: np.random.Generator, order: Sequence[int]) -> np.ndarray:
    """Mild saturation, contrast and brightness jitter; channels put in ``order``."""
    a = np.asarray(im, dtype=np.float32)
    gray = (a @ np.array([0.299, 0.587, 0.114], np.float32))[..., None]
    a = gray + rng.uniform(0.7, 1.3) * (a - gray)
    mean = float(gray.mean())
    a = (a - mean) * rng.uniform(0.8, 1.2) + mean * rng.uniform(0.8, 1.2)
    return np.clip(a[..., list(order)] + 0.5, 0, 255).astype(np.uint8)


def _add_grain(a: np.ndarray, rng: np.random.Generator, sigma: float) -> None:
    """Add sensor-like luma noise to a uint8 (H, W, 3) array in place, a band at a time."""
    for top in range(0, a.shape[0], 512):
        band = a[top : top + 512].astype(np.float32)
        band += rng.normal(0.0, sigma, (band.shape[0], band.shape[1], 1)).astype(np.float32)
        a[top : top + 512] = np.clip(band + 0.5, 0, 255).astype(np.uint8)


def _save(a: np.ndarray, path: pathlib.Path, fmt: str, quality: int) -> None:
    """Encode ``a`` and write it atomically (a reader never sees half a file)."""
    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(a).save(buf, "JPEG", quality=quality, subsampling="4:2:0")
    else:
        Image.fromarray(a).save(buf, "PNG", compress_level=6)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)


def _folder_image(job: tuple[Any, ...]) -> None:
    """Make and write image ``index`` of class ``cls`` (runs in a worker process)."""
    path, seed, cls, index, min_side, max_side, fmt, quality = job
    rng = np.random.default_rng(np.random.SeedSequence([seed, cls, index]))
    photos = _photos()
    short = int(rng.integers(min_side, max_side + 1))
    aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))  # w / h
    size = (round(short * aspect), short) if aspect >= 1 else (short, round(short / aspect))
    im = _crop(photos[cls % len(photos)], rng, size, (0.35, 1.0))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    order = _CHANNEL_ORDERS[(cls // len(photos)) % len(_CHANNEL_ORDERS)]
    a = _jitter(im, rng, order)
    _add_grain(a, rng, rng.uniform(2.0, 6.0))
    _save(a, path, fmt, quality)


def _large_photo(job: tuple[Any, ...]) -> None:
    """Make and write large photo ``index`` (runs in a worker process)."""
    path, seed, index, lo, hi = job
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1A26E, index]))
    photos = _photos()
    aspect = _ASPECTS[int(rng.integers(len(_ASPECTS)))]
    pixels = rng.uniform(lo, hi) * 1e6
    w = max(1, round(math.sqrt(pixels * aspect)))
    im = _crop(photos[index % len(photos)], rng, (w, max(1, round(w / aspect))), (0.6, 1.0))
    a = np.array(im)
    del im
    _add_grain(a, rng, rng.uniform(3.0, 6.0))
    _save(a, path, "jpeg", 90)


def _run(
    fn: Callable[[tuple[Any, ...]], None],
    jobs: list[tuple[Any, ...]],
    workers: int,
    progress: bool,
    desc: str,
) -> None:
    """Run ``fn`` over ``jobs`` here or in ``workers`` processes, with a progress bar."""
    with contextlib.ExitStack() as stack:
        results: Iterable[Any] = map(fn, jobs)
        if workers > 1 and len(jobs) > 1:
            from .workers.jobs import map_jobs  # stoker's own entry point: no script re-run

            results = map_jobs(fn, jobs, workers)
        bar = _progress_bar(len(jobs), desc) if progress else None
        if bar is not None:
            stack.callback(bar.close)
        for _ in results:
            if bar is not None:
                bar.update()


def _progress_bar(total: int, desc: str) -> Any:
    """A tqdm bar, or None where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="img")


def _prune(out: pathlib.Path, keep: set[str]) -> None:
    """Delete images of an earlier, different dataset in ``out`` (our file names only)."""
    for path in out.glob("class_[0-9][0-9][0-9]/img_[0-9][0-9][0-9][0-9][0-9].*"):
        rel = path.relative_to(out).as_posix()
        if path.suffix in (".jpg", ".png") and rel not in keep:
            path.unlink()
    for folder in out.glob("class_[0-9][0-9][0-9]"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def _is_complete(out: pathlib.Path, meta: dict[str, Any], files: list[pathlib.Path]) -> bool:
    """True if ``out`` holds a finished dataset described by ``meta``."""
    try:
        found = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return found == meta and all(f.is_file() for f in files)


def _begin(out: pathlib.Path, rows: list[tuple[str, int]]) -> None:
    """Prepare ``out`` for ``rows``; drop the old marker so a broken run never looks complete."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).unlink(missing_ok=True)
    _prune(out, {rel for rel, _ in rows})
    for folder in sorted({rel.split("/")[0] for rel, _ in rows}):
        (out / folder).mkdir(exist_ok=True)


def _finish(out: pathlib.Path, meta: dict[str, Any], rows: list[tuple[str, int]]) -> None:
    """Write ``labels.csv`` and then the marker, both atomically."""
    tmp = out / f".labels.csv.{os.getpid()}.tmp"
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["path", "label"])
        writer.writerows(rows)
    os.replace(tmp, out / "labels.csv")
    tmp = out / f".{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out / MARKER)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def make_image_folder(
    out: str | os.PathLike[str],
    *,
    classes: int = 4,
    per_class: int = 50,
    seed: int = 0,
    min_side: int = 300,
    max_side: int = 500,
    format: str = "jpeg",
    quality: int = 90,
    workers: int = 1,
    progress: bool = False,
) -> pathlib.Path:
    """Write an ImageFolder dataset of real-photo crops to ``out`` and return its path.

    Layout: ``out/class_000/img_00000.jpg`` ... plus ``out/labels.csv`` (``path,label``,
    paths relative to ``out``). Each image's shorter side is in ``[min_side, max_side]`` with
    aspect 3/4..4/3; ``format`` is ``"jpeg"`` (4:2:0 at ``quality``) or ``"png"``. ``workers``
    > 1 generates in that many spawned processes; the bytes do not depend on it. If ``out``
    already holds a complete dataset made with the same arguments, nothing is rewritten.
    Raises ``ConfigError`` for bad arguments and ``ImportError`` without the ``demo`` extra.
    """
    _check(classes >= 1 and per_class >= 1, "classes and per_class must be >= 1")
    _check(1 <= min_side <= max_side, "need 1 <= min_side <= max_side")
    _check(format in _FORMATS, f"format must be one of {sorted(_FORMATS)}, not {format!r}")
    _check(1 <= quality <= 100, "quality must be in 1..100")
    _check(workers >= 1, "workers must be >= 1")
    out = pathlib.Path(out)
    meta = {
        "kind": "image_folder",
        "version": _VERSION,
        "photos": [p for _, p in _PHOTOS],
        "params": {
            "classes": classes,
            "per_class": per_class,
            "seed": seed,
            "min_side": min_side,
            "max_side": max_side,
            "format": format,
            "quality": quality if format == "jpeg" else None,
        },
    }
    ext = _FORMATS[format]
    rows = [
        (f"class_{c:03d}/img_{i:05d}.{ext}", c) for c in range(classes) for i in range(per_class)
    ]
    if _is_complete(out, meta, [out / r for r, _ in rows] + [out / "labels.csv"]):
        return out
    _photos()  # fail early, before creating anything, if the extra is missing
    _begin(out, rows)
    jobs = [
        (out / rel, seed, c, i, min_side, max_side, format, quality)
        for (rel, c), i in zip(rows, itertools.cycle(range(per_class)))
    ]
    _run(_folder_image, jobs, workers, progress, f"writing {out}")
    _finish(out, meta, rows)
    return out


def make_large_photos(
    out: str | os.PathLike[str],
    *,
    count: int = 8,
    megapixels: tuple[float, float] = (2, 12),
    seed: int = 0,
) -> pathlib.Path:
    """Write ``count`` camera-sized JPEGs (``megapixels`` range, quality 90) and return ``out``.

    For eval and decode benchmarks, where reduced-size decoding matters: bundled photos are
    upscaled to 4:3, 3:2, 16:9, square or portrait frames and given sensor-like grain. Layout
    and idempotence as in `make_image_folder`: ``out/class_000/img_00000.jpg`` ... (one
    class, label 0) plus ``out/labels.csv``.
    """
    _check(count >= 1, "count must be >= 1")
    lo, hi = (float(m) for m in megapixels)
    _check(0 < lo <= hi <= 100, "megapixels must be a (low, high) range within (0, 100]")
    out = pathlib.Path(out)
    meta = {
        "kind": "large_photos",
        "version": _VERSION,
        "photos": [p for _, p in _PHOTOS],
        "params": {"count": count, "megapixels": [lo, hi], "seed": seed},
    }
    rows = [(f"class_000/img_{i:05d}.jpg", 0) for i in range(count)]
    if _is_complete(out, meta, [out / r for r, _ in rows] + [out / "labels.csv"]):
        return out
    _photos()
    _begin(out, rows)
    _run(_large_photo, [(out / r, seed, i, lo, hi) for i, (r, _) in enumerate(rows)], 1, False, "")
    _finish(out, meta, rows)
    return out
