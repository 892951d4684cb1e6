"""Parquet shard source: byte-offset index, stale indexes, foreign HF datasets, block shuffle."""

import json
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stoker
from stoker.cli.convert import convert
from stoker.order import Plan, block_order, epoch_order, shuffle_quality
from stoker.sources import open_source, shardindex
from stoker.sources.base import block_sizes
from stoker.sources.shards import ShardSource


@pytest.fixture(scope="module")
def shard_folder(image_folder, tmp_path_factory):
    dst = tmp_path_factory.mktemp("shard_src") / "shards"
    convert(image_folder, dst, shard_bytes=60_000, row_group_bytes=12_000, progress=False)
    return dst


def _jpegs(image_folder):
    files = sorted(image_folder.glob("*/*.jpg"))
    return [f.read_bytes() for f in files], [int(f.parent.name[-1]) for f in files]


def _pyarrow_values(folder):
    out = []
    for path in sorted(folder.glob("*.parquet")):
        column = pq.read_table(path, columns=["image"]).column("image").combine_chunks()
        out.extend(column.field("bytes").to_pylist())
    return out


def _write_plain(path, images, labels):
    """A foreign-style shard with a struct image column, uncompressed, no dictionary."""
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images)], kind
            ),
            "label": pa.array(labels, pa.int64()),
        }
    )
    pq.write_table(table, path, compression="NONE", use_dictionary=False)


@pytest.mark.timeout(60)
def test_offset_index_gives_the_bytes_pyarrow_reads(shard_folder):
    src = open_source(shard_folder)
    assert isinstance(src, ShardSource)
    assert set(src.modes) == {0}  # every shard read as mmap slices
    values = _pyarrow_values(shard_folder)
    assert len(src) == len(values) == 36
    assert [src.read(i) for i in range(len(src))] == values
    for path in shard_folder.glob("shard-*.parquet"):
        assert os.path.exists(f"{path}.idx.npy")
    assert sum(src.block_sizes) == 36 and len(src.block_sizes) > 3
    assert block_sizes(src) == src.block_sizes  # the Blocks ability the plan reads
    assert src.classes == ["class_000", "class_001", "class_002"]
    clone = pickle.loads(pickle.dumps(src))  # what a worker gets: no handles, reopened lazily
    assert clone.read(35) == values[35]
    assert len(pickle.dumps(src)) < 20_000
    mapped = ShardSource(shard_folder, access="mmap")
    assert [mapped.read(i) for i in range(len(src))] == values
    for s in (src, clone, mapped):
        s.close()


@pytest.mark.timeout(60)
def test_truncated_shard_is_a_bad_sample_not_a_crash(image_folder, tmp_path):
    images, labels = _jpegs(image_folder)
    path = tmp_path / "t.parquet"
    _write_plain(path, images[:8], labels[:8])
    src = ShardSource(path)
    src.read(0)  # opens the file
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(OSError, match="short read"):
        src.read(7)
    src.close()


@pytest.mark.timeout(60)
def test_stale_index_is_rebuilt_when_the_shard_is_rewritten(image_folder, tmp_path):
    images, labels = _jpegs(image_folder)
    path = tmp_path / "data.parquet"
    _write_plain(path, images[:10], labels[:10])
    first = ShardSource(tmp_path)
    assert first.modes == [0] and first.read(3) == images[3]
    first.close()
    _write_plain(path, images[10:25], labels[10:25])
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse-clock filesystems
    second = ShardSource(tmp_path)
    assert len(second) == 15
    assert [second.read(i) for i in range(15)] == images[10:25]
    assert tuple(np.load(f"{path}.idx.npy")[1]) == (path.stat().st_size, 1)
    second.close()


@pytest.mark.timeout(60)
def test_read_only_folder_keeps_its_index_in_the_cache(shard_folder, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "ro"
    shutil.copytree(shard_folder, folder, ignore=shutil.ignore_patterns("*.idx.npy"))
    monkeypatch.setattr(shardindex, "_writable", lambda folder: False)
    src = ShardSource(folder, cache_dir=tmp_path / "cache")
    assert all(f.startswith(str(tmp_path / "cache")) for f in src.index_files)
    assert not list(folder.glob("*.idx.npy"))
    assert src.read(0) == _pyarrow_values(folder)[0]
    src.close()


@pytest.mark.timeout(60)
def test_changed_shard_against_the_manifest_is_refused(shard_folder, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(shard_folder, copy)
    manifest = json.loads((copy / "stoker-manifest.json").read_text())
    manifest["shards"][0]["bytes"] += 1
    (copy / "stoker-manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(stoker.SourceError, match="changed since conversion"):
        ShardSource(copy)
    (copy / "shard-00001.parquet").unlink()
    with pytest.raises(stoker.SourceError, match="missing"):
        ShardSource(copy)


@pytest.mark.timeout(90)
def test_foreign_hf_parquet_with_snappy_images_reads_by_row_groups(image_folder, tmp_path):
    images, labels = _jpegs(image_folder)
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table(
        {
            "image": pa.array([{"bytes": b, "path": None} for b in images], kind),
            "label": pa.array(labels, pa.int64()),
        }
    )
    features = {
        "image": {"_type": "Image"},
        "label": {"_type": "ClassLabel", "names": ["a", "b", "c"]},
    }
    table = table.replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}
    )
    folder = tmp_path / "hf"
    folder.mkdir()
    pq.write_table(
        table.slice(0, 20),
        folder / "train-00000-of-00002.parquet",
        row_group_size=8,
        compression="snappy",
    )
    pq.write_table(
        table.slice(20),
        folder / "train-00001-of-00002.parquet",
        row_group_size=8,
        compression="snappy",
    )
    src = open_source(folder)
    assert isinstance(src, ShardSource) and src.modes == [1, 1]
    assert src.classes == ["a", "b", "c"]
    assert src.labels.tolist() == labels
    assert src.block_sizes == (8, 8, 4, 8, 8)
    assert [src.read(i) for i in range(36)] == images
    assert not list(folder.glob("*.idx.npy"))
    kw = {"batch_size": 6, "image_size": 24, "augment": "eval", "shuffle": False}
    with (
        stoker.Loader(folder, workers=0, **kw) as a,
        stoker.Loader(image_folder, workers=0, **kw) as b,
    ):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)


def test_binary_image_column_and_text_labels(image_folder, tmp_path):
    images, _ = _jpegs(image_folder)
    table = pa.table(
        {
            "image": pa.array(images[:6], pa.binary()),
            "label": ["dog", "cat", "dog", "cat", "cat", "dog"],
        }
    )
    pq.write_table(table, tmp_path / "x.parquet", compression="NONE", use_dictionary=False)
    src = open_source(tmp_path / "x.parquet")
    assert src.modes == [0] and src.classes == ["cat", "dog"]
    assert src.labels.tolist() == [1, 0, 1, 0, 0, 1]
    assert [src.read(i) for i in range(6)] == images[:6]
    src.close()
    pq.write_table(pa.table({"pixels": [b"x"]}), tmp_path / "bad.parquet")
    with pytest.raises(stoker.SourceError, match="no 'image' column"):
        ShardSource(tmp_path / "bad.parquet")


def test_block_order_is_a_deterministic_permutation():
    sizes = [40, 37, 0, 64, 12, 50, 50, 3, 64, 64, 20]
    n = sum(sizes)
    a = block_order(sizes, seed=1, epoch=0)
    assert a.dtype == np.int64 and sorted(a.tolist()) == list(range(n))
    assert np.array_equal(a, block_order(sizes, seed=1, epoch=0))
    assert not np.array_equal(a, block_order(sizes, seed=1, epoch=1))
    assert not np.array_equal(a, block_order(sizes, seed=2, epoch=0))
    # window=1: each block is read whole before the next one
    one = block_order(sizes, seed=1, epoch=0, window=1)
    bounds = np.cumsum(sizes)
    blocks = np.searchsorted(bounds, one, side="right")
    assert (np.diff(blocks) != 0).sum() == sum(1 for s in sizes if s) - 1
    # any window: a run of `window` blocks in the output covers exactly those blocks' samples
    assert sorted(block_order([5] * 8, seed=0, epoch=0, window=8).tolist()) == list(range(40))
    with pytest.raises(ValueError):
        block_order(sizes, seed=0, epoch=0, window=0)


def test_shuffle_quality_numbers_are_sane():
    sizes = [64] * 100
    n = sum(sizes)
    stored = shuffle_quality(np.arange(n), sizes)
    assert (
        stored["displacement"] == 0 and stored["adjacent"] == 1 and stored["blocks_per_batch"] == 1
    )
    uniform = shuffle_quality(epoch_order(n, seed=0, epoch=0, shuffle=True), sizes)
    assert 0.9 < uniform["displacement_ratio"] < 1.1 and uniform["adjacent"] < 0.01
    blocky = shuffle_quality(block_order(sizes, seed=0, epoch=0, window=8), sizes)
    assert 0.8 < blocky["displacement_ratio"] < 1.2  # blocks themselves go anywhere
    assert blocky["adjacent"] < 0.05
    assert 6 < blocky["blocks_per_batch"] <= 8  # a batch mixes samples of ~window blocks
    labels = np.repeat(np.arange(10), n // 10)
    mixed = shuffle_quality(block_order(sizes, seed=0, epoch=0), sizes, labels=labels)
    assert mixed["classes_per_batch"] <= mixed["classes_per_batch_uniform"]


def test_plan_uses_block_order_and_keeps_rank_sharding():
    sizes = (10, 7, 9, 10, 5)
    n = sum(sizes)
    plan = Plan(n, 4, seed=3, shuffle=True, drop_last=False, block_sizes=sizes)
    assert np.array_equal(plan.order(2), block_order(sizes, seed=3, epoch=2))
    parts = [
        Plan(n, 4, 3, True, True, rank=r, world_size=3, block_sizes=sizes, split="drop").order(0)
        for r in range(3)
    ]
    assert len({len(p) for p in parts}) == 1
    joined = np.concatenate(parts)
    assert len(set(joined.tolist())) == len(joined) == (n // 3) * 3
    unshuffled = Plan(n, 4, 3, False, False, block_sizes=sizes)
    assert np.array_equal(unshuffled.order(0), np.arange(n))
    with pytest.raises(stoker.SourceError, match="block sizes"):
        Plan(n + 1, 4, 3, True, False, block_sizes=sizes).order(0)


@pytest.mark.timeout(120)
def test_two_workers_over_shards_match_inline(shard_folder):
    kw = {"batch_size": 8, "image_size": 32, "augment": "train", "shuffle": True, "seed": 5}
    with (
        stoker.Loader(shard_folder, workers=0, **kw) as a,
        stoker.Loader(shard_folder, workers=2, **kw) as b,
    ):
        for _ in range(2):
            for (xa, ya), (xb, yb) in zip(a, b, strict=True):
                assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
        assert b.stats().skipped == 0


@pytest.mark.timeout(60)
def test_stats_report_the_block_shuffle_quality_once_per_epoch(shard_folder):
    with stoker.Loader(shard_folder, batch_size=8, image_size=16, workers=0, seed=2) as loader:
        first = loader.stats().notes
        assert len(first) == 1 and first[0].startswith("block shuffle: displacement")
        assert loader.stats().notes is first  # cached for the epoch, not rebuilt per call
        list(loader)
        next(iter(loader))  # now in epoch 1
        assert loader.stats().notes is not first
