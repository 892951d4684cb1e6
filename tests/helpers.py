"""Transforms and sources that tests hand to worker processes (must be importable by name),
and the small builders several test files share."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # stoker is imported on use: conftest imports this before it sets sys.path
    import stoker

# The packages of the framework extras: the core suite (``nox -s core``, no framework
# installed) skips a test that needs one that is missing, naming it; where it is installed
# (the README's dev install) the test runs and any import error is a failure.
OPTIONAL = {
    "torch",
    "tensorflow",
    "keras",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "ray",
    "h5py",
    "fsspec",
    "aiohttp",
    "nbformat",
    "nbclient",
    "sklearn",
    "skimage",
    "ml_dtypes",
}

MARK = 200  # a pixel value set in the top-left corner of a poisoned image


def free_port() -> int:
    """A loopback TCP port nobody listens on now (for a server or a process group to take)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The source tree, for a script run in a fresh interpreter (``sys.path.insert(0, SRC)``).
SRC = str(Path(__file__).resolve().parents[1] / "src")


def global_steps(loaders, count=None) -> list[dict[int, tuple[int, float, str]]]:
    """Global steps of the ranks' loaders, taken in lockstep: per step, {global position:
    (source index, label, image bytes)}; global positions from the plan (``Plan.slots``)."""
    out, its = [], [iter(loader) for loader in loaders]
    while count is None or len(out) < count:
        step = {}
        for loader, it in zip(loaders, its, strict=True):
            epoch, k = loader._received()  # the batch about to be taken
            batch = next(it, None)
            if batch is None:
                return out
            images, labels, index = batch
            size = loader.batch_size
            start = k * size
            slots = loader.recipe.plan.slots(epoch)[start : start + len(index)]
            for p, img, lab, idx in zip(slots, images, labels, index, strict=True):
                step[int(p)] = (int(idx), float(lab), hashlib.sha1(img.tobytes()).hexdigest())
        out.append(step)
    return out


def run_ranks(tmp_path, script_text, *args, timeout=240):
    """Run ``script_text`` (``{src}`` filled in) as rank 0 and 1, each given ``*args``, its
    rank and a free port (the script starts its group); their RESULT dicts."""
    script = tmp_path / "rank.py"
    script.write_text(script_text.format(src=SRC))
    port = str(free_port())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args, str(r), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)  # two torch imports on a loaded machine
        assert p.returncode == 0, err[-2000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        outs.append(json.loads(line[len("RESULT ") :]))
    return outs


def script_result(script: Path, *args: str, timeout: float, **env: str) -> tuple[dict, str]:
    """Run ``script`` with ``args`` (the environment plus ``env``, in its folder); its last
    ``RESULT {json}`` line, read, and its stdout. A failure shows the end of both outputs."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=script.parent,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), proc.stdout


def is_marked(image: np.ndarray) -> bool:
    """True for an image whose top-left 4x4 block was set to MARK (see make_marked_array)."""
    return bool((image[:4, :4] == MARK).all())


def fail_on_mark(image, rng):
    """Raise ValueError for a marked image; pass others through."""
    if is_marked(image):
        raise ValueError("poisoned sample")
    return image


def kill_on_mark(image, rng):
    """SIGKILL this worker on a marked image."""
    if is_marked(image):
        os.kill(os.getpid(), signal.SIGKILL)
    return image


def exit_on_mark(image, rng):
    """os._exit(3) on a marked image."""
    if is_marked(image):
        os._exit(3)
    return image


def segfault_on_mark(image, rng):
    """Crash with a segmentation fault on a marked image."""
    if is_marked(image):
        ctypes.string_at(0)
    return image


def hang_on_mark(image, rng):
    """Never return for a marked image."""
    while is_marked(image):
        time.sleep(0.05)
    return image


def hang_in_batch_transform(batch, rng):
    """A batch_transform that never returns from the third batch of an unshuffled epoch on
    (the batch of zeros a Loader tries it on when made, index 0, passes)."""
    while batch["index"].min() >= 8:
        time.sleep(0.05)


def exit_in_batch_transform(batch, rng):
    """A batch_transform that ends its worker with os._exit(3) from the third batch on."""
    if batch["index"].min() >= 8:
        os._exit(3)


def invert(image, rng):
    """A deterministic user transform."""
    return 255 - image


def jitter(image, rng):
    """A random user transform: adds a per-sample random offset."""
    return np.clip(image.astype(np.int16) + int(rng.integers(-20, 20)), 0, 255).astype(np.uint8)


def bad_return(image, rng):
    """Returns something that is not an image."""
    return "not an image"


def make_marked_array(n: int = 40, marked: int = 17, size: int = 24) -> np.ndarray:
    """Random images with sample ``marked`` poisoned by MARK in its corner (none if < 0)."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 150, size=(n, size, size, 3), dtype=np.uint8)
    if marked >= 0:
        images[marked, :4, :4] = MARK
    return images


def slow(image, rng):
    """Pass the image through after 50 ms: a loader whose consumer always waits for data."""
    time.sleep(0.05)
    return image


def kill_self(*args):
    """SIGKILL this process (used as a worker's first step: a death during start-up)."""
    os.kill(os.getpid(), signal.SIGKILL)


class SlowSamples:
    """A per-sample dataset whose ``__getitem__`` takes ``delay`` seconds: ``(4,)`` float32
    filled with the index (a worker that is busy for a known time)."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(self.delay)
        return np.full(4, i, np.float32)


def tick_past(path, probe) -> None:
    """Wait (a handshake with the file system's clock, not a timed sleep) until a change made
    now gets a later ctime than the last change of any folder under ``path``, so the next
    change there is visible in the folders' times."""
    last = max(os.stat(d).st_ctime_ns for d, _, _ in os.walk(path))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(probe, "wb") as f:
            f.write(b"x")
        if os.stat(probe).st_ctime_ns > last:
            return
        time.sleep(0.001)
    raise AssertionError("the file system's clock did not advance")


def torchvision_style(image, rng):
    """A torchvision-style augment: torch's global RNG picks a flip and a crop (torch is
    imported here, inside the call, as a transform module would import it)."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(image))
    if torch.rand(1).item() < 0.5:
        t = t.flip(1)
    h, w = t.shape[:2]
    ch, cw = max(1, h * 3 // 4), max(1, w * 3 // 4)
    top = int(torch.randint(0, h - ch + 1, (1,)))
    left = int(torch.randint(0, w - cw + 1, (1,)))
    return t[top : top + ch, left : left + cw].contiguous().numpy()


def albumentations_style(image, rng):
    """An albumentations-style augment: Python's ``random`` flips, ``np.random`` scales."""
    import random

    if random.random() < 0.5:
        image = image[:, ::-1]
    gain = np.random.uniform(0.6, 1.4)
    return np.clip(image.astype(np.float32) * gain, 0, 255).astype(np.uint8)


def batch_noise(batch, rng):
    """A batch transform drawing from the global numpy RNG."""
    batch["image"][...] = np.clip(batch["image"] + np.random.randint(0, 9), 0, 255)


def files_loader(folder, files: dict[str, bytes], **options) -> stoker.Loader:
    """A plain, unshuffled Loader over ``files`` (name -> bytes) written into ``folder``: one
    batch of all of them, 16x16, no augment."""
    import stoker

    paths = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths.append(str(folder / name))
    return stoker.Loader(
        paths=paths,
        labels=[0] * len(paths),
        batch_size=len(paths),
        image_size=16,
        augment=None,
        shuffle=False,
        **options,
    )


# The loader settings a StatsReport carries that a test of the counting does not look at.
UNSET_CONFIG = dict(
    workers=0, workers_reason="", prefetch=0, prefetch_reason="", kept_batches=0, memory_folder=""
)


def report_of(stats, **config) -> stoker.StatsReport:
    """``stats.report()`` with UNSET_CONFIG for the settings ``config`` does not give."""
    return stats.report(**{**UNSET_CONFIG, **config})
