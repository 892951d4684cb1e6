"""Fuzz stoker's decoders with mutated real files: only stoker's own errors may come out.

    python scripts/fuzz.py --seconds 600 [--seed 0] [--data DIR] [--no-extension]

Each iteration takes a real image (the JPEGs of DIR, by default stoker's conformance corpus
tests/corpus/jpeg, plus PNG, APNG, EXIF-oriented WebP, BMP, GIF and TIFF made from them),
mutates it (bit flips, byte runs, truncation, splices, header field edits), then runs probe(),
decode() with a random crop box and output size, as the loader does, and decode_mask(). Any
exception that is not a :class:`stoker.errors.StokerError` is a finding and is saved under
fuzz-findings/. It is its own supervisor: the fuzzing runs in a child process, and a child
that crashes (a segfault in a decoder library) is a finding too: its input is saved and a new
child goes on with the next seed.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import random
import shutil
import subprocess
import sys
import time

import numpy as np
from PIL import Image

if "--no-extension" in sys.argv:  # decode as where the C extension is not built
    sys.modules["stoker.decode._jpeg"] = None  # type: ignore[assignment]

from stoker import decode as dec  # noqa: E402
from stoker.errors import StokerError  # noqa: E402

CORPUS = os.path.join(os.path.dirname(__file__), "..", "tests", "corpus", "jpeg")


def seeds(data: str) -> list[bytes]:
    files = sorted(glob.glob(os.path.join(data, "**", "*.jp*g"), recursive=True))[:40]
    out = []
    for name in files:
        with open(name, "rb") as f:
            out.append(f.read())
    exif = Image.Exif()
    exif[0x0112] = 6
    for f in files[:4]:
        im = Image.open(f).convert("RGB")
        im.thumbnail((160, 160))
        other = Image.new("RGB", im.size, (0, 200, 0))
        for mode, fmt, kw in (
            ("RGB", "PNG", {"exif": exif}),
            ("RGB", "PNG", {"save_all": True, "append_images": [other], "default_image": True}),
            ("RGB", "WEBP", {"exif": exif}),
            ("RGB", "BMP", {}),
            ("P", "BMP", {}),
            ("RGB", "GIF", {}),
            ("RGBA", "TIFF", {"compression": "tiff_lzw"}),
            ("LAB", "TIFF", {}),
            ("CMYK", "JPEG", {}),
            ("RGB", "JPEG", {"progressive": True, "exif": exif}),
        ):
            buf = io.BytesIO()
            im.convert(mode).save(buf, fmt, **kw)
            out.append(buf.getvalue())
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        if op == 0 and b:  # bit flips
            for _ in range(rng.randint(1, 16)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # truncate
            del b[rng.randrange(len(b)) :]
        elif op == 2 and b:  # overwrite a run with one value (0, 0xff, random)
            i = rng.randrange(len(b))
            b[i : i + rng.randint(1, 64)] = bytes(
                [rng.choice((0, 255, rng.randrange(256)))]
            ) * rng.randint(1, 64)
        elif op == 3 and len(b) > 8:  # header edits: favour the first 1 KiB
            i = rng.randrange(min(len(b), 1024))
            b[i] = rng.randrange(256)
        elif op == 4 and b:  # splice a copy of another part
            i, j = rng.randrange(len(b)), rng.randrange(len(b))
            b[i:i] = b[j : j + rng.randint(1, 256)]
    return bytes(b)


def one(data: bytes, rng: random.Random) -> None:
    try:
        dec.decode_mask(data, max_pixels=50_000_000)
    except StokerError:
        pass
    try:
        info = dec.probe(data, max_pixels=50_000_000)
    except StokerError:
        return
    h, w = info.height, info.width
    ch, cw = rng.randint(1, h), rng.randint(1, w)
    box = (rng.randint(0, h - ch), rng.randint(0, w - cw), ch, cw)
    size = rng.choice([None, (16, 16), (224, 224)])
    channels = rng.choice([3, 3, 1, 4])  # gray: libjpeg's grayscale output; RGBA: cv2 unchanged
    try:
        out = dec.decode(
            data,
            info,
            box=box,
            min_size=size,
            fast=rng.random() < 0.5,
            max_pixels=50_000_000,
            notes=[],
            channels=channels,
        )
    except StokerError:
        return
    shape_ok = out.ndim == 2 if channels == 1 else out.ndim == 3 and out.shape[2] == channels
    assert out.dtype == np.uint8 and shape_ok, (channels, out.shape)


def run(args: argparse.Namespace, prefix: str) -> tuple[int, int]:
    """Fuzz for ``args.seconds``; returns (iterations, findings). Exceptions are findings,
    saved as ``fuzz-findings/<prefix>NNNN-<type>.bin``; the input being decoded is always in
    fuzz-findings/last.bin, so a crash of the process leaves it behind."""
    import cv2

    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    rng = random.Random(args.seed)
    pool = seeds(args.data)
    print(f"JPEG decoder: {dec.decoder_name()}; {len(pool)} seed files", flush=True)
    t0, n, findings = time.monotonic(), 0, 0
    while time.monotonic() - t0 < args.seconds:
        data = mutate(rng.choice(pool), rng)
        with open("fuzz-findings/last.bin", "wb") as f:
            f.write(data)
        try:
            one(data, rng)
        except Exception as exc:  # noqa: BLE001 - every other exception is a finding
            findings += 1
            with open(f"fuzz-findings/{prefix}{findings:04d}-{type(exc).__name__}.bin", "wb") as f:
                f.write(data)
            print(f"finding {findings}: {type(exc).__name__}: {exc}", flush=True)
        n += 1
        if n % 20000 == 0:
            print(f"{n} iterations, {time.monotonic() - t0:.0f} s, {findings} findings", flush=True)
    print(f"{n} iterations in {time.monotonic() - t0:.0f} s, {findings} findings", flush=True)
    return n, findings


def supervise(args: argparse.Namespace) -> None:
    """Run the fuzzing in child processes, so that a crash (a segfault in a decoder library)
    is a finding too: the child's last input is saved and a new child goes on with the next
    seed until the time is up."""
    t0, seed, total, findings, crashes = time.monotonic(), args.seed, 0, 0, 0
    while (left := args.seconds - (time.monotonic() - t0)) > 1:
        command = [sys.executable, __file__, "--child", "--seconds", f"{left:.0f}"]
        command += ["--seed", str(seed), "--data", args.data, "--prefix", f"s{seed}-"]
        command += ["--no-extension"] if args.no_extension else []
        out = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        print(out.stdout, end="", flush=True)
        done = [line.split() for line in out.stdout.splitlines() if " iterations in " in line]
        if done:
            total += int(done[-1][0])
            findings += int(done[-1][-2])
        if out.returncode != 0:
            crashes += 1
            name = f"fuzz-findings/s{seed}-crash-{out.returncode}.bin"
            shutil.copy("fuzz-findings/last.bin", name)
            print(
                f"finding: the process died ({out.returncode}); input saved in {name}", flush=True
            )
        seed += 1000
    print(
        f"total: {total} completed iterations in {time.monotonic() - t0:.0f} s, "
        f"{findings} exception findings, {crashes} crashes",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=CORPUS)
    p.add_argument(
        "--no-extension", action="store_true", help="fuzz the path without the C extension"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    os.makedirs("fuzz-findings", exist_ok=True)
    if args.child:
        run(args, args.prefix)
    else:
        supervise(args)


if __name__ == "__main__":
    main()
