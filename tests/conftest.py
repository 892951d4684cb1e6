"""Fixtures shared by the whole suite: a tiny dataset, a leak check, and a set of awkward files."""

from __future__ import annotations

import importlib.util
import io
import os
import pathlib
import re
import sys
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
from PIL import Image

from helpers import OPTIONAL

if importlib.util.find_spec("stoker") is None:  # running from a checkout without `pip install -e`
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))

SHM = pathlib.Path("/dev/shm")
LEAK_GRACE_S = 5.0
# Persistent helpers the standard library starts once per process and keeps until exit
# (observed: spawn/forkserver pools start them). Allowed only as *direct* children of this
# process: workers forked by the forkserver inherit its command line but are its children.
# stoker's own reaper (shm/reaper.py) is the same kind of helper: one per process, started
# before its first segment, ending when the process does.
STDLIB_HELPERS = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
    "stoker/shm/reaper.py",
)
_OTHER_PID = re.compile(r"stoker_(\d+)_")  # segments that name their creating process


# --------------------------------------------------------------------------- datasets


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny ImageFolder dataset (3 classes x 12 JPEGs, shorter side 64-120 px) + labels.csv."""
    from stoker.datasets import make_image_folder

    root = tmp_path_factory.mktemp("image_folder")
    return make_image_folder(root, classes=3, per_class=12, min_side=64, max_side=120, seed=0)


# --------------------------------------------------------------------------- optional packages


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``@pytest.mark.needs("keras")``: a test whose child process imports an optional package
    skips, naming it, where that package is not installed."""
    for mark in item.iter_markers("needs"):
        for name in mark.args:
            if importlib.util.find_spec(name) is None:
                pytest.skip(f"needs {name}, which is not installed here (a core-suite run)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    try:
        return (yield)
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".")[0]
        if name in OPTIONAL and importlib.util.find_spec(name) is None:
            pytest.skip(f"needs {name}, which is not installed here (a core-suite run)")
        raise


# --------------------------------------------------------------------------- leak check


def _segments() -> set[str]:
    return {p.name for p in SHM.glob("stoker_*")} if SHM.is_dir() else set()


def _children() -> dict[tuple[int, float], psutil.Process]:
    """Live descendants of this process, keyed by (pid, create time) to survive pid reuse."""
    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found[(child.pid, child.create_time())] = child
        except psutil.NoSuchProcess:
            pass
    return found


def _is_stdlib_helper(child: psutil.Process) -> bool:
    try:
        cmdline = " ".join(child.cmdline())
        return child.ppid() == os.getpid() and any(h in cmdline for h in STDLIB_HELPERS)
    except psutil.Error:
        return False


def _ours(segment: str, tree: set[int]) -> bool:
    """False only for a segment whose name says another live process (not ours) made it."""
    m = _OTHER_PID.match(segment)
    if m is None:
        return True
    pid = int(m.group(1))
    return pid in tree or not psutil.pid_exists(pid)


def _describe(child: psutil.Process) -> str:
    try:
        return (
            f"pid {child.pid} (parent {child.ppid()}, {child.status()}): "
            f"{' '.join(child.cmdline())}"
        )
    except psutil.Error:
        return f"pid {child.pid} (gone)"


def _leaks(seg_before: set[str], kids_before: set[tuple[int, float]]) -> list[str]:
    """What the test left behind that was not there before it, described for a human."""
    everyone = _children()
    tree = {os.getpid(), *(pid for pid, _ in everyone)}
    kids = {k: c for k, c in everyone.items() if k not in kids_before and not _is_stdlib_helper(c)}
    segs = sorted(s for s in _segments() - seg_before if _ours(s, tree))
    return [f"shared-memory segment /dev/shm/{s}" for s in segs] + [
        f"child process {_describe(c)}" for c in kids.values()
    ]


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Fail a test that leaves a /dev/shm/stoker_* segment or a live child process behind.

    Children get up to LEAK_GRACE_S seconds to exit. The standard library's resource tracker
    and forkserver (persistent per-process helpers) are not counted as leaks.
    """
    seg_before = _segments()
    kids_before = set(_children())
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    leaks = _leaks(seg_before, kids_before)
    while leaks and time.monotonic() < deadline:
        time.sleep(0.05)
        leaks = _leaks(seg_before, kids_before)
    if leaks:
        pytest.fail("test leaked:\n  " + "\n  ".join(leaks), pytrace=False)


# --------------------------------------------------------------------------- awkward files


def _photo(size: tuple[int, int] = (96, 64)) -> Image.Image:
    """A deterministic RGB image with edges and gradients (a few KB as JPEG)."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    checks = (x // 8 + y // 8) % 2 * 200
    a = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), checks], axis=-1)
    return Image.fromarray(a.astype(np.uint8), "RGB")


def _encoded(im: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _awkward_files() -> dict[str, tuple[str, bytes]]:
    """key -> (file name, bytes): ``bad_*`` are corrupt, ``odd_*`` valid but unusual."""
    im = _photo()
    jpeg = _encoded(im, "JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to display
    palette = im.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    gray16 = Image.fromarray(np.arange(64 * 96, dtype=np.uint16).reshape(64, 96) * 10)
    return {
        "bad_truncated": ("bad_truncated.jpg", jpeg[: len(jpeg) * 6 // 10]),
        "bad_zero_bytes": ("bad_zero_bytes.jpg", b""),
        "bad_text": ("bad_text.jpg", b"this is not an image, just text with a .jpg name\n" * 4),
        "bad_header_only": ("bad_header_only.jpg", jpeg[:200]),
        "odd_grayscale": ("odd_grayscale.jpg", _encoded(im.convert("L"), "JPEG", quality=90)),
        "odd_cmyk": ("odd_cmyk.jpg", _encoded(im.convert("CMYK"), "JPEG", quality=90)),
        "odd_png_named_jpg": ("odd_png_named_jpg.jpg", _encoded(im, "PNG")),
        "odd_png16": ("odd_png16.png", _encoded(gray16, "PNG")),
        "odd_palette_transparent": (
            "odd_palette_transparent.png",
            _encoded(palette, "PNG", transparency=0),
        ),
        "odd_exif_rotated": (
            "odd_exif_rotated.jpg",
            _encoded(im, "JPEG", quality=90, exif=exif.tobytes()),
        ),
    }


@pytest.fixture
def corrupt_files(tmp_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """key -> path of awkward image files, written fresh into the test's tmp_path.

    ``bad_*`` no decoder should accept as a whole image: ``bad_truncated`` (first 60 % of a
    JPEG; libjpeg may decode it with a warning and grey rows), ``bad_zero_bytes``,
    ``bad_text`` (text named .jpg), ``bad_header_only`` (first 200 bytes of a JPEG).
    ``odd_*`` are valid and must decode to RGB: ``odd_grayscale``, ``odd_cmyk`` (JPEGs),
    ``odd_png_named_jpg`` (PNG data, .jpg name), ``odd_png16`` (16-bit grayscale PNG),
    ``odd_palette_transparent`` (palette PNG with tRNS) and ``odd_exif_rotated`` (96x64
    pixels stored, EXIF orientation 6, so 64x96 upright).
    All valid images come from one 96x64 RGB picture.
    """
    paths = {}
    for key, (name, data) in _awkward_files().items():
        paths[key] = tmp_path / name
        paths[key].write_bytes(data)
    return paths


@pytest.fixture
def needs_namespace() -> None:
    """Skip, saying why, where this process cannot make a private mount namespace."""
    import chaos_env  # it imports stoker, which the path set-up above must come first for

    why = chaos_env.namespace_reason()
    if why is not None:
        pytest.skip(f"needs a private mount namespace: {why}")


# --------------------------------------------------------------------------- object storage


@pytest.fixture(scope="session")
def s3_server() -> Iterator[object]:
    """One real S3 API server (moto's ``ThreadedMotoServer``) on loopback for the session."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the dev extra installs it)")
    from buckets import S3Server

    with S3Server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The S3 server, with ``AWS_ENDPOINT_URL`` and dummy credentials set for this test only."""
    for name, value in s3_server.env().items():  # type: ignore[attr-defined]
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env: object) -> str:
    """A fresh, empty bucket on the test S3 server (its name); the environment points at it."""
    return s3_env.bucket()  # type: ignore[attr-defined,no-any-return]


@pytest.fixture
def proxied(
    s3_env: object, shards: pathlib.Path, monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> Iterator[tuple[object, str]]:
    """(a fault proxy in front of the S3 server, the URL of the test module's ``shards``
    fixture uploaded to a fresh bucket); the environment points at the proxy."""
    from buckets import proxied_upload

    with proxied_upload(s3_env, shards, monkeypatch, tmp_path / "home") as pair:  # type: ignore[arg-type]
        yield pair
