"""WebDataset tar shards (unsafe members refused, pickles never loaded) and HDF5 files."""

import io
import pickle
import tarfile

import h5py
import numpy as np
import pytest

import stoker
from stoker.sources import open_source
from stoker.sources.hdf5 import HDF5Source
from stoker.sources.tar import TarSource, split_key, unsafe_member_name


class _CreatesFile:
    """Unpickling this payload would call open(path, "w"): creating the file proves a load."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _jpegs(image_folder):
    files = sorted(image_folder.glob("*/*.jpg"))
    return [f.read_bytes() for f in files], [int(f.parent.name[-1]) for f in files]


@pytest.fixture
def tar_folder(image_folder, tmp_path):
    """Two WebDataset shards of the image folder, plus hostile members in the second."""
    images, labels = _jpegs(image_folder)
    folder = tmp_path / "wds"
    folder.mkdir()
    marker = tmp_path / "UNPICKLED"
    for part, rows in enumerate((range(0, 20), range(20, 36))):
        with tarfile.open(folder / f"shard-{part:04d}.tar", "w") as tar:
            for i in rows:
                _add(tar, f"s/{i:05d}.jpg", images[i])
                _add(tar, f"s/{i:05d}.cls", str(labels[i]).encode())
            if part == 1:
                _add(tar, "../evil.jpg", images[0])
                _add(tar, "../evil.cls", b"0")
                _add(tar, "/tmp/abs_evil.jpg", images[0])
                _add(tar, "s/00035.pyd", pickle.dumps(_CreatesFile(str(marker))))
                _add(tar, "s/99999.pickle", pickle.dumps(_CreatesFile(str(marker))))
    return folder, images, labels, marker


def test_member_name_rules():
    assert unsafe_member_name("../x.jpg") and unsafe_member_name("/etc/x.jpg")
    assert unsafe_member_name("a/../../x.jpg") and unsafe_member_name("C:/x.jpg")
    assert not unsafe_member_name("a/b..c.jpg") and not unsafe_member_name("a/b.jpg")
    assert split_key("n01/img_7.seg.PNG") == ("n01/img_7", "seg.png")


@pytest.mark.timeout(60)
def test_tar_shards_read_samples_and_refuse_unsafe_members(tar_folder):
    folder, images, labels, marker = tar_folder
    with pytest.warns(UserWarning, match="refused 3 tar member"):
        src = open_source(folder)
    assert isinstance(src, TarSource)
    assert len(src) == 36
    assert src.labels.tolist() == labels
    assert [src.read(i) for i in range(36)] == images
    refused = sorted(r.rsplit(":", 1)[1] for r in src.refused)
    assert refused == ["../evil.cls", "../evil.jpg", "/tmp/abs_evil.jpg"]
    assert src.name(35).endswith("shard-0001.tar:s/00035.jpg")
    assert not marker.exists()
    assert not (folder.parent / "evil.jpg").exists() and not (folder / "evil.jpg").exists()
    one = TarSource(folder / "shard-0000.tar")
    assert len(one) == 20 and one.read(19) == images[19]
    clone = pickle.loads(pickle.dumps(src))
    assert clone.read(5) == images[5]
    for s in (src, one, clone):
        s.close()


@pytest.mark.timeout(120)
def test_loader_over_tars_with_two_workers(tar_folder, image_folder):
    folder, _, _, marker = tar_folder
    kw = {"batch_size": 8, "image_size": 32, "augment": "eval", "shuffle": True, "seed": 1}
    with pytest.warns(UserWarning, match="refused"):
        tar_loader = stoker.Loader(folder, workers=2, **kw)
    with tar_loader as a, stoker.Loader(image_folder, workers=0, **kw) as b:
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_a_big_tars_scan_is_cached_and_rebuilt_when_the_tar_changes(
    tar_folder, tmp_path, monkeypatch
):
    """A tar's scan is kept under cache_dir (the tar folder is never written) and reused, with
    its labels and refused members; a changed tar (new mtime) or a damaged cache is scanned
    again; a cache folder that cannot be written only means no cache."""
    import os

    from stoker.sources import tar as tar_module

    folder, images, labels, _ = tar_folder
    monkeypatch.setattr(tar_module, "MIN_CACHED_BYTES", 0)
    cache, before = tmp_path / "cache", sorted(folder.iterdir())
    with pytest.warns(UserWarning, match="refused 3 tar member"):
        first = TarSource(folder, cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 2 and sorted(folder.iterdir()) == before

    def no_scan(path):
        raise AssertionError(f"{path} scanned again")

    monkeypatch.setattr(tar_module, "_scan", no_scan)
    with pytest.warns(UserWarning, match="refused 3 tar member"):
        again = TarSource(folder, cache_dir=cache)
    assert again.labels.tolist() == labels and [again.read(i) for i in range(36)] == images
    assert again.offsets.tolist() == first.offsets.tolist() and again.refused == first.refused
    monkeypatch.undo()
    monkeypatch.setattr(tar_module, "MIN_CACHED_BYTES", 0)
    shard = folder / "shard-0000.tar"
    with tarfile.open(shard, "a") as tar:  # one more sample: the cached scan is stale
        _add(tar, "s/00036.jpg", images[0])
    os.utime(shard, ns=(1, 1))
    damaged = tar_module._cache_file(cache, str(folder / "shard-0001.tar"))
    damaged.write_text('{"version": 1, "stamp": [')
    with pytest.warns(UserWarning, match="refused 3 tar member"):
        changed = TarSource(folder, cache_dir=cache)
    assert len(changed) == 37 and changed.read(20) == images[0]
    readonly = tmp_path / "readonly"
    readonly.write_text("a file, not a folder")  # nothing can be written under it
    assert len(TarSource(folder / "shard-0000.tar", cache_dir=readonly)) == 21
    for s in (first, again, changed):
        s.close()


def test_compressed_tar_is_refused_with_a_message(tmp_path, image_folder):
    images, _ = _jpegs(image_folder)
    with tarfile.open(tmp_path / "x.tar", "w:gz") as tar:  # gzip data behind a .tar name
        _add(tar, "a.jpg", images[0])
    with pytest.raises(stoker.SourceError, match="uncompressed tar"):
        TarSource(tmp_path / "x.tar")


@pytest.fixture
def h5_files(image_folder, tmp_path):
    images, labels = _jpegs(image_folder)
    encoded = tmp_path / "encoded.h5"
    with h5py.File(encoded, "w") as f:
        ds = f.create_dataset("images", (36,), dtype=h5py.vlen_dtype(np.uint8))
        for i, data in enumerate(images):
            ds[i] = np.frombuffer(data, np.uint8)
        f.create_dataset("labels", data=np.asarray(labels, np.int32))
        f["labels"].attrs["classes"] = ["a", "b", "c"]
    pixels = np.random.default_rng(0).integers(0, 255, (20, 24, 28, 3), dtype=np.uint8)
    decoded = tmp_path / "decoded.hdf5"
    with h5py.File(decoded, "w") as f:
        f.create_dataset("x", data=pixels, chunks=(1, 24, 28, 3))
        f.create_dataset("y", data=np.arange(20) % 4)
    return encoded, decoded, images, labels, pixels


@pytest.mark.timeout(120)
def test_hdf5_encoded_bytes_layout(h5_files, image_folder):
    encoded, _, images, labels, _ = h5_files
    src = open_source(encoded)
    assert isinstance(src, HDF5Source) and src.encoded
    assert src.labels.tolist() == labels and src.classes == ["a", "b", "c"]
    assert [src.read(i) for i in range(36)] == images
    assert pickle.loads(pickle.dumps(src)).read(3) == images[3]
    src.close()
    kw = {"batch_size": 8, "image_size": 32, "augment": "eval", "shuffle": True, "seed": 2}
    with (
        stoker.Loader(encoded, workers=2, **kw) as a,
        stoker.Loader(image_folder, workers=0, **kw) as b,
    ):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)


@pytest.mark.timeout(120)
def test_hdf5_decoded_array_layout(h5_files):
    _, decoded, _, _, pixels = h5_files
    src = HDF5Source(decoded, images_key="x", labels_key="y")
    assert not src.encoded and len(src) == 20
    assert np.array_equal(src.read(7), pixels[7])
    assert src.labels.tolist() == (np.arange(20) % 4).tolist()
    src.close()
    kw = {"batch_size": 5, "image_size": (24, 28), "augment": None, "shuffle": False}
    with (
        stoker.Loader(src, workers=2, **kw) as a,
        stoker.Loader(pixels, labels=np.arange(20) % 4, workers=0, **kw) as b,
    ):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    with pytest.raises(stoker.SourceError, match="no dataset 'images'"):
        HDF5Source(decoded)
