"""Parquet shards in a bucket read out of fixed spans, fetched once per machine (``sources.spans``,
``sources.spancache``): GETs per image and bytes fetched per byte decoded with two workers,
batches identical to ``workers=0`` and to the local shards, and the workers' shared folder of
spans removed at close and after the trainer is killed.

The data is made here: 160 small JPEGs in one Parquet shard of four row groups, uploaded to a
fresh bucket of the session's real S3 server (moto), read through the fault proxy, which counts
the GETs.
"""

from __future__ import annotations

import glob
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs")

import stoker  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from stoker.cli.convert import convert  # noqa: E402
from stoker.shm.folder import segment_dirs  # noqa: E402
from stoker.sources.spans import fixed_spans  # noqa: E402

IMAGES = 160
GROUPS = 4
KW = {"batch_size": 16, "image_size": 32, "seed": 5}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """160 JPEGs as one Parquet shard of about four row groups."""
    from stoker.datasets import make_image_folder

    folder = make_image_folder(
        tmp_path_factory.mktemp("span_images"), classes=4, per_class=IMAGES // 4, seed=1
    )
    total = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    dst = tmp_path_factory.mktemp("span_shards")
    convert(folder, dst, row_group_bytes=total // GROUPS + 1, progress=False)
    return dst


def _epoch(loader: stoker.Loader) -> list[np.ndarray]:
    return [np.array(x) for x, _ in loader]


def _span_folders(pid: int) -> list[str]:
    return [p for d in segment_dirs() for p in glob.glob(f"{d}/stoker_{pid}_*_spans")]


def _row_groups(shards: pathlib.Path) -> int:
    return sum(pq.ParquetFile(p).metadata.num_row_groups for p in shards.glob("*.parquet"))


def test_fixed_spans_are_row_groups_cut_at_the_limit() -> None:
    offsets = np.array([10, 20, 30, -1, 100, 110, 150])
    lengths = np.array([10, 10, 10, 0, 10, 40, 10])
    span_of, spans = fixed_spans(offsets, lengths, np.array([0, 4, 7]), limit=45)
    assert span_of.tolist() == [0, 0, 0, -1, 1, 1, 2]  # group 2 cut at 45 bytes past 100
    assert spans.tolist() == [[10, 40], [100, 150], [150, 160]]


@pytest.mark.timeout(240)
def test_two_workers_fetch_each_row_group_once(
    proxied: tuple[FaultProxy, str], shards: pathlib.Path
) -> None:
    proxy, url = proxied
    groups = _row_groups(shards)
    assert 3 <= groups <= 6 and IMAGES / groups >= 20  # what the bounds below rely on
    with stoker.Loader(str(shards), workers=0, **KW) as local:
        expected = _epoch(local)
    with stoker.Loader(url, workers=0, **KW) as inline:
        assert all(np.array_equal(a, b) for a, b in zip(_epoch(inline), expected, strict=True))
    with stoker.Loader(url, workers=2, **KW) as loader:
        before = proxy.gets(".parquet")
        got = _epoch(loader)
        gets = proxy.gets(".parquet") - before
        folders = _span_folders(os.getpid())
        assert len(folders) == 1 and os.listdir(folders[0])  # the workers' shared spans
        assert os.stat(folders[0]).st_mode & 0o777 == 0o700
        requests = loader.stats().requests
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    assert gets == groups  # each row group once, though two processes read its images
    assert requests["gets"] == gets
    assert requests["gets_per_image"] == pytest.approx(groups / IMAGES)
    assert requests["gets_per_image"] <= 0.05
    assert 1.0 <= requests["fetched_per_decoded"] <= 1.05
    assert not _span_folders(os.getpid())  # removed at close


TRAINER = """
import glob, os, sys, time
import stoker
from stoker.shm.folder import segment_dirs
loader = stoker.Loader(sys.argv[1], batch_size=16, image_size=32, seed=5, workers=2)
next(iter(loader))
print(*(p for d in segment_dirs() for p in glob.glob(f"{d}/stoker_{os.getpid()}_*_spans")),
      flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(240)
def test_a_killed_trainer_leaves_no_span_folder(proxied: tuple[FaultProxy, str]) -> None:
    _, url = proxied
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, url], stdout=subprocess.PIPE, text=True
    )
    try:
        folders = trainer.stdout.readline().split()  # type: ignore[union-attr]
        assert len(folders) == 1 and os.listdir(folders[0]), folders
    finally:
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(30)
    deadline = time.monotonic() + 60  # the reaper sees the trainer gone, then removes it
    while os.path.exists(folders[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(folders[0])
