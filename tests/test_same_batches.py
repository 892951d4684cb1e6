"""The batches of every source kind, byte for byte, as recorded before the resolve-once
refactor (issue #32): a change of the code's shape may not change one byte a user receives.

Each case builds a Loader through the public API only and hashes what iteration gives: every
field's dtype, shape and bytes (``path`` left out: it names this run's temporary folder) for
batches 0 and 1 of epoch 0 and batch 0 of epoch 1. A recorded value changes only with a change
that means to change batches (say so in its commit); run this file as a script to print the
values of the code as it is:

    python tests/test_same_batches.py
"""

from __future__ import annotations

import hashlib
import io
import pathlib
import sys
import tarfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import stoker

#: What the code gave before the refactor (printed by running this file as a script).
RECORDED: dict[str, str] = {
    "folder-train": "8458bfde372c478bcda47c3c96270a9f9abd75727784887482207edd30bf72ed",
    "folder-train-2-workers": "8458bfde372c478bcda47c3c96270a9f9abd75727784887482207edd30bf72ed",
    "folder-eval": "05ea04b26807f4d2e5486bbc564b8e94940a9c673fa0519d611f73c9d268bccc",
    "folder-crop": "9cdf099c2d3f1d450a6c0629388e7e8973ead51ce07d178bec4a3f1facddf91b",
    "folder-pad-gray": "947065f699b658f09bc51eaa1ae4db2b6002e530c8f5700743b619e012fd667d",
    "folder-validation": "4cd119445f4d0d088b85216d1c03d4dc972f5de82d37ef97d8faf5e29ea7f06d",
    "folder-rank-1-of-2": "38d06749fc04dbda37a34a1e8b8f758b549768406c38d699c414a29bdb6fd79e",
    "csv": "8458bfde372c478bcda47c3c96270a9f9abd75727784887482207edd30bf72ed",
    "paths": "1f7a7883f960b1078355ea11045766f5f125083aa3035f57aaa13415a2b69a0c",
    "array-own-size": "9b5b6ce51e782b0c1af29bd24790f37e51bb4c0167464d1869a2b5f273f3b3d9",
    "array-train": "0905a7ec27643c628bda7fc85aa061350766d9751d59b4152ee3d6a7c4e1bc79",
    "npy": "f52943e3ba3a0a0d6c80d643a486bed988f41d0a9d7b29289cc39d092ce13a01",
    "array-masks": "7743082a3f7ab3a19eef43d414e9faf93fad146806fee911b4d8f8c5924852a2",
    "dataset": "1f0e949b2b0cd7739602987dc397af376565901f60dec09b83eb1b62b37cc5db",
    "batch-transform": "1e98cc8eebb6a93c2a85a3d6579317d402ef80ed4162593b5887a3fa736e8f49",
    "bad-file": "dbe9c3bab73a29e344dc883bf2f9f0de1379562998d3811b845d8e9d87aedcaa",
    "tar": "8458bfde372c478bcda47c3c96270a9f9abd75727784887482207edd30bf72ed",
    "hdf5": "6b0830ae22b8336c34a28ad346a56df03db5d965f86ed11cd2652b450b8afa72",
    "shards": "ae5a12fa59289f28d37fe5c1b5441c8f1ce73d3d90446dabc23d576698f583ac",
}

SMALL = dict(image_size=32, batch_size=4, seed=7, batch="dict")


def digest(loader: Any) -> str:
    """The hash of batches (0, 0), (0, 1) and (1, 0) of ``loader`` as iteration gives them."""
    h = hashlib.sha256()
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        for k, batch in enumerate(loader):
            for name in sorted(batch):
                if name == "path":
                    continue
                arr = np.ascontiguousarray(batch[name])
                h.update(f"{epoch}/{k}/{name}/{arr.dtype.str}/{arr.shape}".encode())
                h.update(arr.tobytes())
            if k == (1 if epoch == 0 else 0):
                break
    return h.hexdigest()


def _images(folder: pathlib.Path) -> tuple[list[bytes], list[int]]:
    files = sorted(folder.glob("*/*.jpg"))
    return [f.read_bytes() for f in files], [int(f.parent.name[-1]) for f in files]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _tar(folder: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    images, labels = _images(folder)
    out.mkdir()
    with tarfile.open(out / "shard-0000.tar", "w") as tar:
        for i, (data, label) in enumerate(zip(images, labels, strict=True)):
            _add(tar, f"s/{i:05d}.jpg", data)
            _add(tar, f"s/{i:05d}.cls", str(label).encode())
    return out


def _h5(folder: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    import h5py

    images, labels = _images(folder)
    with h5py.File(out, "w") as f:
        ds = f.create_dataset("images", (len(images),), dtype=h5py.vlen_dtype(np.uint8))
        for i, data in enumerate(images):
            ds[i] = np.frombuffer(data, np.uint8)
        f.create_dataset("labels", data=np.asarray(labels, np.int32))
    return out


def _pixels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (24, 40, 36, 3), dtype=np.uint8)


class Samples:
    """A per-sample dataset (``__len__``/``__getitem__``) of arrays and class ids."""

    def __init__(self) -> None:
        self.images = _pixels()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.images[i], i % 3


def mix(batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A mixup-like batch transform: draws from its generator, soft labels out."""
    lam = rng.uniform(0.2, 0.8)
    order = rng.permutation(len(batch["image"]))
    img = batch["image"].astype(np.float32)
    batch["image"][:] = (lam * img + (1 - lam) * img[order]).astype(np.uint8)
    soft = np.zeros((len(order), 3), np.float32)
    soft[np.arange(len(order)), batch["label"] % 3] = lam
    soft[np.arange(len(order)), batch["label"][order] % 3] += 1 - lam
    return {"label": soft}


def _bad_folder(folder: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    for f in sorted(folder.glob("*/*.jpg")):
        (out / f.parent.name).mkdir(parents=True, exist_ok=True)
        (out / f.parent.name / f.name).write_bytes(f.read_bytes())
    for bad in sorted(out.glob("*/*.jpg"))[::4]:  # truncated JPEGs: good samples take their place
        bad.write_bytes(bad.read_bytes()[:40])
    return out


def _cases(folder: pathlib.Path, tmp: pathlib.Path) -> dict[str, Callable[[], Any]]:
    """Each case's Loader, made on demand (cases needing an optional package import it)."""
    pixels = _pixels()
    masks = (pixels[..., 0] // 64).astype(np.uint8)
    files = sorted(str(p) for p in folder.glob("*/*.jpg"))
    L = stoker.Loader
    return {
        "folder-train": lambda: L(folder, augment="train", workers=0, **SMALL),
        "folder-train-2-workers": lambda: L(folder, augment="train", workers=2, **SMALL),
        "folder-eval": lambda: L(folder, augment="eval", shuffle=False, workers=0, **SMALL),
        "folder-crop": lambda: L(folder, augment=None, crop_to_aspect_ratio=True, **SMALL),
        "folder-pad-gray": lambda: L(
            folder, augment=None, pad_to_aspect_ratio=True, color_mode="grayscale", **SMALL
        ),
        "folder-validation": lambda: L(
            folder, validation_split=0.25, subset="validation", augment=None, **SMALL
        ),
        "folder-rank-1-of-2": lambda: L(folder, rank=1, world_size=2, augment="train", **SMALL),
        "csv": lambda: L(folder / "labels.csv", augment="train", **SMALL),
        "paths": lambda: L(paths=files, labels=[i % 3 for i in range(len(files))], **SMALL),
        "array-own-size": lambda: L(pixels, augment=None, **{**SMALL, "image_size": (40, 36)}),
        "array-train": lambda: L(pixels, labels=np.arange(24) % 3, augment="train", **SMALL),
        "npy": lambda: L(_npy(pixels, tmp / "x.npy"), augment=None, **SMALL),
        "array-masks": lambda: L(pixels, masks=masks, augment="train", **SMALL),
        "dataset": lambda: L(Samples(), augment="train", **SMALL),
        "batch-transform": lambda: L(folder, batch_transform=mix, augment="train", **SMALL),
        "bad-file": lambda: L(_bad_folder(folder, tmp / "bad"), max_errors=12, **SMALL),
        "tar": lambda: L(_tar(folder, tmp / "wds"), augment="train", **SMALL),
        "hdf5": lambda: L(_h5(folder, tmp / "x.h5"), augment="train", **SMALL),
        "shards": lambda: L(_shards(folder, tmp / "shards"), augment="train", **SMALL),
    }


def _npy(pixels: np.ndarray, out: pathlib.Path) -> pathlib.Path:
    np.save(out, pixels)
    return out


def _shards(folder: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    from stoker.cli.convert import convert

    convert(folder, out, progress=False, row_group_bytes=64 << 10)
    return out


CASES = list(_cases(pathlib.Path("."), pathlib.Path(".")))


def measure(folder: pathlib.Path, tmp: pathlib.Path, case: str) -> str:
    """The digest of one case."""
    with pytest.warns() if case == "bad-file" else _quiet():
        with _cases(folder, tmp)[case]() as loader:
            return digest(loader)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CASES)
def test_batches_are_the_recorded_bytes(case, image_folder, tmp_path):
    if case == "hdf5":
        pytest.importorskip("h5py")
    assert case in RECORDED, f"{case}: no recorded value; record it from the code before a change"
    assert measure(image_folder, tmp_path, case) == RECORDED[case]


@pytest.mark.timeout(240)
def test_a_bucket_gives_the_bytes_of_the_same_folder(image_folder, s3_env, tmp_path):
    url = s3_env.bucket()  # type: ignore[attr-defined]
    s3_env.upload(image_folder, f"s3://{url}/imgs")  # type: ignore[attr-defined]
    with stoker.Loader(f"s3://{url}/imgs", augment="train", **SMALL) as loader:
        remote = digest(loader)
    assert remote == RECORDED["folder-train"]


if __name__ == "__main__":  # print the values of the code as it is
    import tempfile

    from stoker.datasets import make_image_folder

    with tempfile.TemporaryDirectory() as d:
        base = pathlib.Path(d)
        images = make_image_folder(
            base / "f", classes=3, per_class=12, min_side=64, max_side=120, seed=0
        )
        for name in CASES:
            (base / name).mkdir()
            print(f'    "{name}": "{measure(images, base / name, name)}",', file=sys.stdout)
