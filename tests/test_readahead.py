"""Reads that run ahead of decoding (sources/readahead.py): the same batches as plain reads for
every local source, bytes held bounded, files deleted/truncated mid-epoch still counted as bad,
a file that never answers (a FIFO) costs only its own deadline, page-cache dropping."""

from __future__ import annotations

import ctypes
import io
import mmap
import os
import re
import tarfile
import threading
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import stoker
from helpers import report_of
from stoker.cli.convert import convert
from stoker.sources import filereads, open_source
from stoker.sources.readahead import MIN_WINDOW, ReadAhead, ReadSettings
from stoker.sources.table import PathSource

IN_ORDER = dict(image_size=16, shuffle=False, workers=0)  # small images, in order, inline


@pytest.fixture(params=["native", "python"])
def backend(request, monkeypatch):
    """The window's reads on native threads (sources.filereads) or on Python threads."""
    if request.param == "native" and not filereads.AVAILABLE:
        pytest.fail("stoker.sources._readfiles is not built: python setup.py build_ext --inplace")
    monkeypatch.setattr(filereads, "AVAILABLE", request.param == "native")
    return request.param


def _files(folder):
    return sorted(folder.glob("*/*.jpg"))


def _batches(spec, read_ahead, workers=0, **kw):
    kw = {"batch_size": 5, "image_size": 24, "seed": 3, "augment": "train", **kw}
    with stoker.Loader(spec, workers=workers, read_ahead=read_ahead, **kw) as loader:
        out = [(x.copy(), y.copy()) for x, y in loader]
        return out, loader.stats()


def _same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


@pytest.fixture(scope="module")
def sources(image_folder, tmp_path_factory):
    """The image folder stored every local way: a path list, npy, HDF5, a tar, Parquet shards."""
    root = tmp_path_factory.mktemp("kinds")
    files = _files(image_folder)
    labels = [int(f.parent.name[-1]) for f in files]
    pixels = np.stack([np.full((20, 20, 3), k * 7 % 255, np.uint8) for k in range(len(files))])
    np.save(root / "images.npy", pixels)
    with h5py.File(root / "images.h5", "w") as f:
        dt = h5py.vlen_dtype(np.uint8)
        ds = f.create_dataset("images", (len(files),), dtype=dt)
        for k, path in enumerate(files):
            ds[k] = np.frombuffer(path.read_bytes(), np.uint8)
        f["labels"] = np.array(labels)
    with tarfile.open(root / "shard.tar", "w") as tar:
        for k, path in enumerate(files):
            members = ((f"{k:05d}.jpg", path.read_bytes()), (f"{k:05d}.cls", b"%d" % labels[k]))
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    convert(
        image_folder, root / "shards", shard_bytes=60_000, row_group_bytes=12_000, progress=False
    )
    return {
        "folder": (str(image_folder), {}),
        "list": (None, {"paths": [str(f) for f in files], "labels": labels}),
        "npy": (str(root / "images.npy"), {"labels": np.array(labels)}),
        "hdf5": (str(root / "images.h5"), {}),
        "tar": (str(root / "shard.tar"), {}),
        "parquet": (str(root / "shards"), {}),
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["folder", "list", "npy", "hdf5", "tar", "parquet"])
def test_read_ahead_gives_the_plain_batches(sources, kind):
    spec, kw = sources[kind]
    plain, _ = _batches(spec, 0, **kw)
    ahead, stats = _batches(spec, 6, **kw)
    _same(plain, ahead)
    assert stats.skipped == 0
    assert open_source(spec, **kw).parallel_reads  # the window really was used for this kind


@pytest.mark.timeout(240)
def test_read_ahead_in_workers_and_on_resume(image_folder):
    plain, _ = _batches(str(image_folder), 0)
    ahead, _ = _batches(str(image_folder), "auto", workers=2)
    _same(plain, ahead)
    with stoker.Loader(
        str(image_folder), batch_size=5, image_size=24, seed=3, workers=0, read_ahead=0
    ) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
    with stoker.Loader(str(image_folder), batch_size=5, image_size=24, seed=3, workers=2) as again:
        again.load_state_dict(state)
        rest = [(x.copy(), y.copy()) for x, y in again]
    _same(plain[2:], rest)


@pytest.mark.timeout(60)
def test_bytes_held_ahead_stay_under_the_cap(image_folder, backend):
    source = open_source(str(image_folder))
    sizes = [len(source.read(i)) for i in range(len(source))]
    cap = 3 * max(sizes)
    reads = ReadAhead(source, ReadSettings(window=16, max_bytes=cap))
    order = np.arange(len(source))[::-1]
    reads.start(order)
    for index in order:
        data, mask = reads.take(int(index))
        assert data == source.read(int(index)) and mask is None
        assert reads.held <= cap + max(sizes)
    assert 0 < reads.peak_held <= cap + max(sizes)
    assert reads.counters.reads == len(source) and reads.counters.nbytes == sum(sizes)
    assert reads.held == 0
    if backend == "native":
        reader = reads._native._reader
        live, stuck, _ = reader.threads()
        assert 0 < live <= 16 and stuck == 0
        tasks = len(os.listdir("/proc/self/task"))
        reads.close()
        assert reader.pending() == 0
        del reader  # close() let go of it: its threads end
        for _ in range(100):
            if len(os.listdir("/proc/self/task")) <= tasks - live:
                break
            time.sleep(0.05)
        assert len(os.listdir("/proc/self/task")) <= tasks - live
        return
    threads = list(reads._threads)
    assert 0 < len(threads) <= 17  # window + 1
    reads.close()
    for thread in threads:  # close() ends every reading thread
        thread.join(30)
        assert not thread.is_alive()


@pytest.mark.timeout(120)
def test_files_deleted_or_truncated_mid_epoch_are_bad_samples(image_folder, tmp_path):
    files = _files(image_folder)[:20]
    paths = []
    for k, f in enumerate(files):
        paths.append(tmp_path / f"{k:02d}.jpg")
        paths[-1].write_bytes(f.read_bytes())
    with stoker.Loader(
        paths=[str(p) for p in paths],
        labels=list(range(20)),
        batch_size=5,
        **IN_ORDER,
        read_ahead=8,
        max_errors=5,
    ) as loader:
        it = iter(loader)
        next(it)
        paths[7].unlink()  # batch 1: deleted after the epoch started
        with open(paths[13], "r+b") as f:  # batch 2: cut to a few bytes
            f.truncate(10)
        with pytest.warns(stoker.StokerWarning):
            rest = [y.copy() for _, y in it]
        stats = loader.stats()
    assert stats.skipped == 2
    bad = dict(stats.bad_files)
    assert str(paths[7]) in bad and str(paths[13]) in bad
    seen = np.concatenate(rest)
    assert 7 not in seen and 13 not in seen and len(seen) == 15


class _Hung(PathSource):
    """Real files, but reading sample ``stuck`` hangs until ``release`` is set: a file on a
    mount that stopped answering (a throttled reader)."""

    def __init__(self, paths, stuck):
        super().__init__(paths, labels=list(range(len(paths))))
        self.stuck, self.release = stuck, threading.Event()

    def read(self, index):
        if index == self.stuck:
            self.release.wait(60)
        return super().read(index)


@pytest.mark.timeout(120)
def test_a_read_that_never_answers_blocks_only_itself(image_folder, tmp_path):
    files = _files(image_folder)[:8]
    source = _Hung([str(f) for f in files], stuck=2)
    try:
        reads = ReadAhead(source, ReadSettings(window=4, timeout=3.0))
        reads.start(np.arange(len(files)))
        # samples behind the stuck one arrive while its read is still blocked
        for index in (3, 4, 5):
            assert reads.take(index)[0] == files[index].read_bytes()
        with pytest.raises(OSError, match="no bytes after"):
            reads.take(2)
        assert reads.lost == 1
        assert reads.take(7)[0] == files[7].read_bytes()  # a fresh thread took its place
        source.release.set()  # the read was slow, not dead: its thread comes back
        for _ in range(300):
            if reads.lost == 0:
                break
            threading.Event().wait(0.1)
        assert reads.lost == 0
        reads.close()
        source.release.clear()
        with (
            stoker.Loader(
                source,
                batch_size=3,
                **IN_ORDER,
                timeout=8.0,
                max_errors=2,
            ) as loader,
            pytest.warns(stoker.StokerWarning),
        ):
            labels = np.concatenate([y for _, y in loader])
            stats = loader.stats()
        assert stats.skipped == 1 and "no bytes after" in dict(stats.bad_files)[str(files[2])]
        assert labels.tolist() == [0, 1, 3, 3, 4, 5, 6, 7]  # the next good sample took its place
    finally:
        source.release.set()


@pytest.mark.timeout(60)
def test_a_fifo_in_the_window_is_a_bad_sample(image_folder, tmp_path):
    files = _files(image_folder)[:4]
    fifo = tmp_path / "stuck.jpg"
    os.mkfifo(fifo)
    paths = [str(files[0]), str(fifo), *map(str, files[1:])]
    source = open_source(None, paths=paths, labels=list(range(len(paths))))
    reads = ReadAhead(source, ReadSettings(window=4, timeout=30.0))
    reads.start(np.arange(len(paths)))
    assert reads.take(0)[0] == files[0].read_bytes()
    with pytest.raises(OSError, match="not a regular file"):
        reads.take(1)
    assert [reads.take(k)[0] for k in (2, 3, 4)] == [f.read_bytes() for f in files[1:]]
    assert reads.lost == 0
    reads.close()


def _resident(path) -> int:
    """Pages of ``path`` in the page cache (mincore on a private mapping of it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        view = ctypes.c_char.from_buffer(mm)
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), ctypes.c_size_t(size), vec)
        del view
        mm.close()
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(v & 1 for v in vec)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_page_cache_policy(image_folder, tmp_path, policy):
    files = []
    for k, f in enumerate(_files(image_folder)[:6]):
        files.append(tmp_path / f"{k}.jpg")
        files[-1].write_bytes(f.read_bytes() * 20)  # a few pages each
    os.sync()  # clean pages: only those can leave the cache
    source = open_source(None, paths=[str(p) for p in files], labels=list(range(6)))
    reads = ReadAhead(source, ReadSettings(window=3, page_cache=policy))
    reads.start(np.arange(6))
    for k in range(6):
        reads.take(k)
    reads.close()
    resident = sum(_resident(p) for p in files)
    if policy == "drop":
        assert resident == 0
    else:
        assert resident > 0


def test_read_settings_are_validated():
    for bad in (-1, 1.5, True, "lots"):
        with pytest.raises(stoker.ConfigError, match="read_ahead"):
            stoker.Loader(np.zeros((4, 8, 8, 3), np.uint8), read_ahead=bad)
    with pytest.raises(stoker.ConfigError, match="page_cache"):
        stoker.Loader(np.zeros((4, 8, 8, 3), np.uint8), page_cache="sometimes")


@pytest.mark.timeout(120)
def test_stats_count_bytes_read_and_tell_reading_from_decoding(image_folder):
    files = _files(image_folder)
    with stoker.Loader(
        str(image_folder), batch_size=6, image_size=16, shuffle=False, drop_last=False, workers=2
    ) as loader:
        list(loader)
        report = loader.stats()
    assert report.read_bytes == sum(f.stat().st_size for f in files)
    assert report.read_mb_s > 0 and 0 <= report.read_share < 1
    assert "reading: " in str(report) and "MB/s" in str(report)


def test_stats_hint_when_the_disk_is_the_bottleneck():
    from stoker.assemble import Report
    from stoker.stats import Stats

    def run(read_s, from_storage=True):
        stats = Stats()
        for _ in range(3):
            t0 = stats.begin_wait()
            stats.add(Report(count=4, read_s=read_s, decode_s=0.01, read_bytes=4_000_000))
            stats.wait_s += 0.5  # the consumer waited half of each step
            stats.end_wait(t0 - 1.0, 4)
        return report_of(
            stats, workers=2, prefetch=2, memory_folder="/dev/shm", from_storage=from_storage
        )

    slow_disk, slow_decode = run(0.2), run(0.001)
    assert slow_disk.bottleneck == slow_decode.bottleneck == "input"
    assert slow_disk.disk_bound and "reading from disk limits you at" in str(slow_disk)
    assert not slow_decode.disk_bound and "hint: reading" not in str(slow_decode)
    assert slow_disk.read_bytes == 12_000_000
    in_memory = run(0.2, from_storage=False)  # arrays in memory, a user's __getitem__
    assert not in_memory.disk_bound and "hint: reading" not in str(in_memory)


def test_only_sources_that_read_storage_can_blame_the_disk(tmp_path):
    images = np.zeros((8, 16, 16, 3), np.uint8)
    np.save(tmp_path / "x.npy", images)
    assert stoker.Loader(images, batch_size=4).recipe.source.from_storage is False
    sub = stoker.Loader(images, batch_size=2, validation_split=0.5, subset="validation")
    assert sub.recipe.source.from_storage is False
    assert stoker.Loader(str(tmp_path / "x.npy"), batch_size=4).recipe.source.from_storage is True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fits", [True, False])
def test_auto_page_cache_drops_only_what_cannot_fit(tmp_path, fits):
    from stoker.sources.readahead import SIZE_AFTER, memory_bytes

    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).bytes(8 << 20))
    os.sync()
    # the same 8 MiB file listed many times: a dataset of ~1/8 of RAM, or of 1.5 x RAM
    count = SIZE_AFTER + 8 if fits else int(1.5 * memory_bytes() / (8 << 20)) + 1
    if fits:
        assert count * (8 << 20) < memory_bytes()
    source = open_source(None, paths=[str(big)] * count, labels=np.zeros(count, np.int64))
    reads = ReadAhead(source, ReadSettings(window=2))
    reads.start(np.arange(SIZE_AFTER + 8))
    for k in range(SIZE_AFTER + 8):
        reads.take(k)
    reads.close()
    assert (reads.counters.dropped > 0) == (not fits)
    assert (_resident(big) == 0) == (not fits)


def _npy_rows(tmp_path, rows=12):
    """A .npy of ``rows`` images of 64 KiB each (16 pages), written and synced (clean pages),
    then dropped from the page cache; and its source."""
    path = tmp_path / "rows.npy"
    pixels = np.random.default_rng(0).integers(0, 255, (rows, 128, 128, 4), dtype=np.uint8)
    np.save(path, pixels)
    os.sync()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    return path, pixels, open_source(str(path), labels=np.zeros(rows, np.int64))


@pytest.mark.timeout(60)
def test_npy_read_asks_for_the_rows_pages_at_once(tmp_path):
    path, pixels, source = _npy_rows(tmp_path)
    before = _resident(path)
    view = source.read(5)  # a view: nothing touched it yet
    for _ in range(300):  # MADV_WILLNEED started the row's reads; wait for them to land
        if _resident(path) >= before + 16:
            break
        threading.Event().wait(0.1)
    assert _resident(path) >= before + 16
    np.testing.assert_array_equal(view, pixels[5])
    source.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("window", [4, 0])
def test_npy_pages_are_dropped_although_the_file_is_mapped(tmp_path, window):
    path, pixels, source = _npy_rows(tmp_path)
    reads = ReadAhead(source, ReadSettings(window=window, page_cache="drop"))
    reads.start(np.arange(12))
    for k in range(12):
        np.testing.assert_array_equal(reads.take(k)[0], pixels[k])
    reads.close()
    assert reads.counters.dropped == 12
    # all but the page-cache folios that straddle two rows (a row's drop keeps those whole)
    assert _resident(path) < os.path.getsize(path) // mmap.PAGESIZE // 2
    source.close()


@pytest.mark.timeout(60)
def test_reads_around_the_page_cache_give_the_same_bytes_and_cache_nothing(tmp_path):
    from stoker.sources.base import DIRECT_KEEP, drop_pages, read_file, read_file_direct

    rng = np.random.default_rng(3)
    for size in (0, 1, 4095, 4096, 4097, 100_003, DIRECT_KEEP + 4099):
        path = tmp_path / f"{size}.bin"
        path.write_bytes(rng.bytes(size))
        os.sync()
        drop_pages(str(path))
        data = read_file_direct(str(path))
        assert data is not None, "this file system refuses O_DIRECT"
        assert data == read_file(str(path)) if size else data == b""
        drop_pages(str(path))
        assert read_file_direct(str(path)) == path.read_bytes()[:size]
    path = tmp_path / "cold.bin"
    path.write_bytes(rng.bytes(1 << 20))
    os.sync()
    drop_pages(str(path))
    assert _resident(path) == 0
    assert len(read_file_direct(str(path)) or b"") == 1 << 20
    assert _resident(path) == 0  # read, and not one page cached


@pytest.mark.timeout(60)
def test_a_source_reading_around_the_cache_keeps_every_refusal(image_folder, tmp_path):
    fifo, gone = tmp_path / "pipe.jpg", tmp_path / "gone.jpg"
    os.mkfifo(fifo)
    good = _files(image_folder)[0]
    gone.write_bytes(good.read_bytes())
    source = open_source(None, paths=[str(good), str(fifo), str(gone)], labels=[0, 1, 2])
    assert source.bypass_page_cache()
    assert source.read(0) == good.read_bytes() and source.forget(0)
    with pytest.raises(OSError, match="not a regular file"):
        source.read(1)  # refused at once, never blocks
    gone.unlink()
    with pytest.raises(FileNotFoundError):
        source.read(2)


@pytest.mark.timeout(60)
def test_a_file_system_that_refuses_direct_reads_falls_back(image_folder, tmp_path, monkeypatch):
    import stoker.sources.base as base

    monkeypatch.setattr(filereads, "AVAILABLE", False)  # the Python reads' fallback
    files = [tmp_path / f"{k}.jpg" for k in range(3)]
    for f, src in zip(files, _files(image_folder), strict=False):
        f.write_bytes(src.read_bytes() * 10)
    os.sync()
    expected = [f.read_bytes() for f in files]  # (caches their pages)
    monkeypatch.setattr(base, "read_file_direct", lambda path: None)  # as on a refusing FS
    source = open_source(None, paths=[str(f) for f in files], labels=[0, 1, 2])
    reads = ReadAhead(source, ReadSettings(window=2, page_cache="drop"))
    reads.start(np.arange(3))
    assert [reads.take(k)[0] for k in range(3)] == expected
    reads.close()
    assert source._direct is False and reads.counters.dropped == 3
    assert sum(_resident(f) for f in files) == 0  # cached reads, then dropped


@pytest.mark.timeout(120)
def test_window_given_up_on_stuck_reads_comes_back_when_they_answer(image_folder, monkeypatch):
    from stoker.sources import readahead

    monkeypatch.setattr(readahead, "MAX_LOST_THREADS", 1)
    files = _files(image_folder)[:6]
    source = _Hung([str(f) for f in files], stuck=2)
    try:
        reads = ReadAhead(source, ReadSettings(window=4, timeout=2.0))
        for lost in (1, 2):  # the same stalled file twice: two threads stuck at once
            reads.start(np.arange(6))
            with pytest.raises(OSError, match="no bytes after"):
                reads.take(2)
            assert reads.lost == lost
        assert not reads.enabled  # past the limit: plain reads
        assert reads.take(3)[0] == files[3].read_bytes()
        source.release.set()  # the storage answers again: both threads come back
        for _ in range(300):
            if reads.enabled:
                break
            threading.Event().wait(0.1)
        assert reads.enabled and reads.lost == 0
        reads.start(np.arange(6))
        assert [reads.take(k)[0] for k in range(6)] == [f.read_bytes() for f in files]
        reads.close()
    finally:
        source.release.set()


@pytest.mark.timeout(120)
def test_auto_reads_plainly_while_reads_are_cheap_and_opens_the_window_when_they_slow(
    image_folder,
):
    files = _files(image_folder)[:8]
    count = 64
    source = open_source(
        None, paths=[str(files[k % 8]) for k in range(count)], labels=np.zeros(count, np.int64)
    )
    plain_read = source.read
    where: dict[int, str] = {}

    def read(index):  # warm files, then a slow disk from sample 32 on
        where[index] = threading.current_thread().name
        if index >= 32:
            time.sleep(0.05)
        return plain_read(index)

    source.read = read
    reads = ReadAhead(source, ReadSettings(window="auto"))
    reads.start(np.arange(count))
    windows = []
    for k in range(count):
        assert reads.take(k)[0] == files[k % 8].read_bytes()
        windows.append(reads.window)
        time.sleep(0.02)  # the caller's decode: 20 ms a sample
    reads.close()
    cheap = [where[k] for k in range(16, 32)]
    assert cheap.count("MainThread") == len(cheap), cheap  # plain reads, no thread hand-off
    assert 0 in windows[8:32]
    slow = [where[k] for k in range(48, 64)]
    assert slow.count("stoker-read") >= 12, slow  # the window opened for the slow reads
    assert max(windows[40:]) >= MIN_WINDOW


# ---------------------------------------------------------------------------- native reads


def _direct_allowed(folder) -> bool:
    probe = folder / "direct-probe"
    probe.write_bytes(b"x" * 4096)
    try:
        os.close(os.open(probe, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["keep", "drop"])
def test_native_reads_give_every_file_byte_for_byte(tmp_path, policy):
    """Sizes around the O_DIRECT block (0, 1, 4095-4097, 1 MiB + 1) and image + mask pairs,
    read in a shuffled order through the native window: the bytes are the files' own."""
    sizes = [0, 1, 4095, 4096, 4097, 65_537, (1 << 20) + 1, 12_345]
    rng = np.random.default_rng(5)
    images, masks = [], []
    for k, size in enumerate(sizes):
        images.append(tmp_path / f"i{k}.jpg")
        images[-1].write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
        masks.append(tmp_path / f"m{k}.png")
        masks[-1].write_bytes(bytes([k]) * (size // 3 + 1))
    expected = [(p.read_bytes(), m.read_bytes()) for p, m in zip(images, masks, strict=True)]
    os.sync()
    for path in images + masks:  # clean pages, dropped: the reads go to the disk
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    source = open_source(None, paths=[str(p) for p in images], labels=list(range(len(sizes))))
    source.mask_index = open_source(
        None, paths=[str(p) for p in masks], labels=list(range(len(sizes)))
    ).index
    reads = ReadAhead(source, ReadSettings(window=4, page_cache=policy))
    assert reads._native is not None
    order = rng.permutation(len(sizes))
    reads.start(order)
    assert [reads.take(int(k)) for k in order] == [expected[k] for k in order]
    refused = reads._native._reader.threads()[2]
    reads.close()
    assert reads.counters.reads == len(sizes)
    resident = sum(_resident(p) for p in images + masks if p.stat().st_size)
    if policy == "drop":  # O_DIRECT: nothing cached, each counted as dropped
        assert resident == 0 and reads.counters.dropped == len(sizes)
        if _direct_allowed(tmp_path):  # and never a cached read in its place
            assert refused == 0
    else:
        assert resident > 0 and reads.counters.dropped == 0


@pytest.mark.timeout(120)
def test_a_native_read_past_its_deadline_blocks_only_itself(image_folder, tmp_path):
    """A 256 MB file (a throttled reader: it cannot be read in 10 ms) in the window: its
    sample fails with "no bytes after" while the samples behind it arrive, its thread is
    replaced, and once its read ends the stuck thread is counted back."""
    files = _files(image_folder)[:6]
    slow = tmp_path / "slow.jpg"
    with open(slow, "wb") as f:
        f.truncate(256 << 20)  # sparse: reading it still copies 256 MB
    paths = [str(files[0]), str(slow), *map(str, files[1:])]
    source = open_source(None, paths=paths, labels=list(range(len(paths))))
    reads = ReadAhead(source, ReadSettings(window=4, timeout=0.01, page_cache="keep"))
    reads.start(np.arange(len(paths)))
    reads.settings = ReadSettings(window=4, timeout=60.0, page_cache="keep")
    assert reads.take(0)[0] == files[0].read_bytes()
    reads.settings = ReadSettings(window=4, timeout=0.01, page_cache="keep")
    with pytest.raises(OSError, match="no bytes after"):
        reads.take(1)
    reads.settings = ReadSettings(window=4, timeout=60.0, page_cache="keep")
    assert [reads.take(k)[0] for k in range(2, len(paths))] == [f.read_bytes() for f in files[1:]]
    for _ in range(600):  # the big read ends: its buffer is freed, its thread serves again
        if reads._native._reader.threads()[1] == 0:
            break
        time.sleep(0.1)
    assert reads._native._reader.threads()[1] == 0
    reads.close()


def test_a_source_that_reads_its_own_way_is_never_bypassed(image_folder):
    """A subclass (or an instance) with its own ``read`` keeps it: the native reader, which
    reads whole files itself, is used only for the stock file read."""
    files = [str(f) for f in _files(image_folder)[:3]]
    plain = open_source(None, paths=files, labels=[0, 1, 2])
    assert ReadAhead(plain, ReadSettings(window=2))._native is not None
    hung = _Hung(files, stuck=-1)
    assert hung.native_reads() is None and ReadAhead(hung, ReadSettings(window=2))._native is None
    patched = open_source(None, paths=files, labels=[0, 1, 2])
    patched.read = lambda index: b"mine"
    assert patched.native_reads() is None
    reads = ReadAhead(patched, ReadSettings(window=2))
    reads.start(np.arange(3))
    assert [reads.take(k)[0] for k in range(3)] == [b"mine"] * 3
    reads.close()


@pytest.mark.timeout(120)
def test_auto_opens_the_native_window_once_a_read_costs_a_tenth_of_a_decode(image_folder):
    """Native reads: plain while a read is a small share of the caller's decode (a warm file
    against 30 ms of decoding), the window as soon as reads cost more than a tenth of it (the
    same reads, with almost no decoding between takes)."""
    files = _files(image_folder)[:8]
    count = 160  # the smoothed decode time falls from 30 ms to near 0 within ~60 samples
    source = open_source(
        None, paths=[str(files[k % 8]) for k in range(count)], labels=np.zeros(count, np.int64)
    )
    reads = ReadAhead(source, ReadSettings(window="auto"))
    assert reads._native is not None
    reads.start(np.arange(count))
    windows = []
    for k in range(count):
        assert reads.take(k)[0] == files[k % 8].read_bytes()
        windows.append(reads.window)
        if k < 40:
            time.sleep(0.03)  # slow decoding: reads are cheap next to it
    reads.close()
    assert windows[16:40].count(0) >= 20, windows  # plain reads
    assert max(windows[120:]) >= MIN_WINDOW, windows  # the window opened


@pytest.mark.timeout(60)
def test_native_reads_after_fork_use_the_childs_own_threads(image_folder):
    """A window made before a fork (its reader's threads live in the parent only) reads in
    the child on threads of its own."""
    files = _files(image_folder)[:6]
    source = open_source(None, paths=[str(f) for f in files], labels=list(range(6)))
    reads = ReadAhead(source, ReadSettings(window=3))
    reads.start(np.arange(3))
    assert [reads.take(k)[0] for k in range(3)] == [f.read_bytes() for f in files[:3]]
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if every read is right
        ok = False
        try:
            reads.start(np.arange(6))
            ok = [reads.take(k)[0] for k in range(6)] == [f.read_bytes() for f in files]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    reads.start(np.arange(6))  # the parent's reader still works
    assert [reads.take(k)[0] for k in range(6)] == [f.read_bytes() for f in files]
    reads.close()


def _range_source(kind: str, path):
    """The Parquet shards' or the tar's source (each image one byte range of its file)."""
    from stoker.sources.shards import ShardSource
    from stoker.sources.tar import TarSource

    return ShardSource(path) if kind == "parquet" else TarSource(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["parquet", "tar"])
@pytest.mark.parametrize("policy", ["keep", "drop"])
def test_native_reads_give_every_shard_image_byte_for_byte(sources, kind, policy):
    """Parquet shards and tars read natively (one byte range each, unaligned: O_DIRECT reads
    the blocks around it) give exactly the source's own read's bytes, in a shuffled order."""
    path = sources[kind][0]
    fds = len(os.listdir("/proc/self/fd"))
    source = _range_source(kind, path)
    expected = [source.read(i) for i in range(len(source))]
    reads = ReadAhead(source, ReadSettings(window=6, page_cache=policy))
    assert reads._native is not None and reads._native_kind == "ranges"
    order = np.random.default_rng(2).permutation(len(source))
    reads.start(order)
    reads.take(int(order[0]))
    reads.start(order)  # the window in flight discarded: its descriptors closed all the same
    assert [reads.take(int(k))[0] for k in order] == [expected[k] for k in order]
    refused = reads._native._reader.threads()[2]
    reads.close()
    source.close()
    assert reads.counters.dropped == (len(source) + 1 if policy == "drop" else 0)
    if policy == "drop" and _direct_allowed(Path(path).parent):  # unaligned: whole blocks
        assert refused == 0
    for _ in range(100):  # reads abandoned while running close theirs when they end
        if len(os.listdir("/proc/self/fd")) == fds:
            break
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_range_sources_that_read_their_own_way_are_not_read_natively(sources):
    """A memory-mapped shard source, or a tar subclass with its own read, keeps its own reads."""
    from stoker.sources.shards import ShardSource
    from stoker.sources.tar import TarSource

    class Marked(TarSource):
        def read(self, index):
            return b"own " + super().read(index)

    assert ShardSource(sources["parquet"][0], access="mmap").native_reads() is None
    assert Marked(sources["tar"][0]).native_reads() is None
    reads = ReadAhead(Marked(sources["tar"][0]), ReadSettings(window=4))
    reads.start(np.arange(4))
    assert all(reads.take(k)[0].startswith(b"own ") for k in range(4))
    reads.close()


def _place(source, index: int) -> tuple[str, int]:
    """(file, offset) of a range source's sample ``index`` (the descriptor handed over closed)."""
    path, offset, _, fd = source.file_range(index)
    os.close(fd)
    return path, offset


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["parquet", "tar"])
def test_a_shard_cut_short_mid_epoch_gives_bad_samples_not_wrong_bytes(sources, kind, tmp_path):
    """A shard (or tar) truncated after the epoch started: the image cut in two is a short read
    (an OSError naming the file and sample, which the loader counts as a bad sample), never
    wrong bytes."""
    import shutil

    original = Path(sources[kind][0])
    copy = tmp_path / original.name
    (shutil.copytree if original.is_dir() else shutil.copy)(original, copy)
    source = _range_source(kind, copy)
    first = _place(source, 0)[0]
    rows = [i for i in range(len(source)) if _place(source, i)[0] == first]
    reads = ReadAhead(source, ReadSettings(window=4))
    assert reads._native_kind == "ranges"
    reads.start(np.array(rows))
    assert reads.take(rows[0])[0] == source.read(rows[0])
    last = max(rows, key=lambda i: _place(source, i)[1])
    with open(first, "r+b") as f:
        f.truncate(_place(source, last)[1] + 3)  # the file's last image keeps 3 of its bytes
    reads.start(np.array(rows))
    with pytest.raises(OSError, match=re.escape(source.name(last)) + r": short read \(3 of"):
        for k in rows:
            reads.take(k)
    reads.close()
    source.close()


def test_auto_window_opens_and_closes_with_hysteresis_and_covers_the_read_latency():
    from stoker.sources.readahead import (
        COVER,
        ENTER,
        LEAVE,
        MIN_WINDOW,
        NATIVE_ENTER,
        NATIVE_LEAVE,
        auto_window,
    )

    between = (ENTER + LEAVE) / 2  # cheap enough to stay closed, dear enough to stay open
    assert auto_window(0, between, False, 32) == 0
    assert auto_window(8, between, False, 32) == MIN_WINDOW
    assert auto_window(8, LEAVE * 0.9, False, 32) == 0
    assert auto_window(0, ENTER, False, 32) == MIN_WINDOW
    # native reads of whole files open far sooner, and close later
    assert auto_window(0, NATIVE_ENTER, True, 32) == MIN_WINDOW
    assert auto_window(0, NATIVE_ENTER, False, 32) == 0
    assert auto_window(8, (NATIVE_ENTER + NATIVE_LEAVE) / 2, True, 32) == MIN_WINDOW
    assert auto_window(8, NATIVE_LEAVE * 0.9, True, 32) == 0
    assert auto_window(0, 5.0, False, 32) == int(np.ceil(COVER * 5.0)) + 1
    assert auto_window(0, 100.0, False, 32) == 32 and auto_window(0, 100.0, False, 64) == 64


def test_page_cache_auto_drops_pages_only_for_a_dataset_larger_than_ram():
    from stoker.sources.readahead import larger_than_ram

    gib = 1 << 30
    assert larger_than_ram(64 * 100_000, 64, 400_000, 16 * gib) is True  # 40 GB on 16 GiB
    assert larger_than_ram(64 * 100_000, 64, 400_000, 64 * gib) is False  # 40 GB on 64 GiB
    assert larger_than_ram(64 * 100_000, 64, 6_000, 16 * gib) is False  # 0.6 GB fits
    assert larger_than_ram(64 * 200_000, 64, 400_000, 0) is False  # memory unknown: keep pages
    assert larger_than_ram(0, 0, 400_000, 16 * gib) is False


def test_an_epochs_last_batches_plan_the_next_epochs_first_samples(image_folder, monkeypatch):
    """The order of every epoch is known in advance, so the reads planned with an epoch's last
    batches run on into the next epoch's first samples (a bucket's spans for them are fetched
    before that epoch starts, not at its first batch); within an epoch, the next batches'."""
    from stoker.assemble import Assembler
    from stoker.order import Plan
    from stoker.sources.readahead import PLAN_AHEAD
    from stoker.transforms import PipelineSpec

    source = open_source(str(image_folder))
    plan = Plan(len(source), 4, seed=3, shuffle=True, drop_last=True)
    assembler = Assembler(source, PipelineSpec(size=(16, 16), channels=3), plan)
    planned = []
    monkeypatch.setattr(source, "plan_reads", lambda now, ahead=None: planned.append(ahead))
    arrays = {"image": np.zeros((4, 16, 16, 3), np.uint8), "index": np.zeros(4, np.int64)}
    arrays["label"] = np.zeros(4, source.labels.dtype)
    batches, want = plan.epoch_batches(0), PLAN_AHEAD * 4
    for b in range(batches):
        assembler.fill(0, b, arrays)
    first, last = plan.order(0), plan.order(1)
    assert len(first) == batches * 4 > 2 * want
    np.testing.assert_array_equal(planned[0], first[4 : 4 + want])
    for b in range(batches):  # the epoch's rest, then as many of epoch 1's first as it lacks
        rest = first[(b + 1) * 4 : (b + 1) * 4 + want]
        expected = np.concatenate([rest, last[: want - len(rest)]])
        np.testing.assert_array_equal(planned[b], expected)
    assert not np.array_equal(first[:want], last[:want])  # another epoch's order
    assembler.fill(1, 0, arrays)  # epoch 1 itself is still filled in its own order
    np.testing.assert_array_equal(arrays["index"], source.source_indices(last[:4]))
