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


def _one_shard(factory: pytest.TempPathFactory, groups: int, seed: int) -> pathlib.Path:
    """160 JPEGs as one Parquet shard of about ``groups`` row groups."""
    from stoker.datasets import make_image_folder

    folder = make_image_folder(
        factory.mktemp("span_images"), classes=4, per_class=IMAGES // 4, seed=seed
    )
    total = sum(p.stat().st_size for p in folder.rglob("*.jpg"))
    dst = factory.mktemp("span_shards")
    convert(folder, dst, row_group_bytes=total // groups + 1, progress=False)
    return dst


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """160 JPEGs as one Parquet shard of about four row groups."""
    return _one_shard(tmp_path_factory, GROUPS, seed=1)


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


# ------------------------------------------------------------- a cache smaller than the data


def _spans_in(folder: str) -> set[str]:
    return {name for name in os.listdir(folder) if "." not in name}


@pytest.mark.parametrize("shared", [True, False], ids=["folder", "memory"])
def test_a_full_cache_drops_the_span_the_plan_needs_last(tmp_path, shared: bool) -> None:
    from stoker.sources.spancache import LocalSpans, SharedSpans, SpanKey

    keys = [SpanKey("s3://b/x.parquet", 100 * k, 100 * k + 100) for k in range(4)]
    ahead = {keys[0]: 5.0, keys[1]: 900.0, keys[2]: 1.0, keys[3]: 2.0}  # samples until needed
    folder = tmp_path / "spans"
    folder.mkdir(mode=0o700)
    cache = SharedSpans(str(folder), limit=300) if shared else LocalSpans(limit=300)
    cache.next_use = {k.file_name(): v for k, v in ahead.items()}.__getitem__
    for key in keys:  # key 0 is the least recently used when key 3 comes
        assert cache.get(key, lambda k: bytes(k.end - k.start)) == bytes(100)
    if shared:
        assert _spans_in(str(folder)) == {keys[k].file_name() for k in (0, 2, 3)}
    else:
        assert list(cache._kept) == [keys[0], keys[2], keys[3]]  # type: ignore[attr-defined]
    cache.next_use = None  # nothing tells: the least recently used goes
    cache.get(SpanKey("s3://b/x.parquet", 400, 500), lambda k: bytes(100))
    kept = (
        _spans_in(str(folder)) if shared else {k.file_name() for k in cache._kept}  # type: ignore[attr-defined]
    )
    assert keys[0].file_name() not in kept and keys[3].file_name() in kept


def test_next_uses_count_samples_to_a_span_in_this_epoch_then_the_next() -> None:
    from stoker.sources.spans import NextUses

    order = np.array([7, 3, 5, 1, 0, 2])  # samples in this epoch's order
    ids = np.array([10, 11, 10, 12, 11, 10])  # their spans
    following = np.array([12, 12, 10, 11, 11, 10])  # the next epoch's samples' spans
    uses = NextUses(order, ids, following, {"a": 10, "b": 11, "c": 12, "gone": 13})
    assert [uses(n) for n in ("a", "b", "c", "gone", "unknown")] == [0, 1, 3, np.inf, np.inf]
    uses.at(np.array([1, 0]))  # the batch starting at position 3
    assert [uses(n) for n in ("a", "b", "c")] == [2, 1, 0]
    uses.at(np.array([2]))  # position 5: span 12 (c) comes next epoch, first
    assert [uses(n) for n in ("a", "b", "c")] == [0, 1 + 3, 1 + 0]


@pytest.fixture(scope="module")
def many_groups(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """160 JPEGs as one Parquet shard of about 40 row groups (five windows of the order)."""
    return _one_shard(tmp_path_factory, 40, seed=2)


@pytest.mark.timeout(300)
def test_epochs_over_a_cache_smaller_than_the_data_fetch_only_what_does_not_fit(
    s3_env, many_groups: pathlib.Path, monkeypatch, tmp_path
) -> None:
    """The plan knows every epoch's order, so a full cache drops the spans needed last: the
    later epochs fetch about the bytes that do not fit (the least recently used drops spans
    the epoch still needs, and fetches them again: about twice as much here)."""
    from buckets import proxied_upload

    epochs = 7
    with proxied_upload(s3_env, many_groups, monkeypatch, tmp_path / "home") as (_, url):  # type: ignore[arg-type]
        with stoker.Loader(str(many_groups), workers=0, **KW) as local:
            expected = [_epoch(local) for _ in range(epochs)]
        with stoker.Loader(url, workers=2, **KW) as loader:
            source = loader.recipe.source
            spans = source.sample_chunks(np.arange(IMAGES), only_spans=True)
            sizes = [key.end - key.start for _, key, _, _ in spans]
            assert len(sizes) >= 30  # what the bound below relies on: many windows
            source.span_bytes = sum(sizes) - 4 * max(sizes)  # 4 spans or more do not fit
            got = [_epoch(loader)]
            first = loader.stats().requests["bytes"]
            got += [_epoch(loader) for _ in range(epochs - 1)]
            later = loader.stats().requests["bytes"] - first
    for epoch, want in zip(got, expected, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(epoch, want, strict=True))
    assert first <= sum(sizes) + max(sizes)
    missing = sum(sizes) - source.span_bytes  # what does not fit: fetched again each epoch
    assert later <= 1.45 * (epochs - 1) * missing, (later / (epochs - 1), missing)
