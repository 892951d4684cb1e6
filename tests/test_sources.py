"""Sources: folder, CSV/TSV, path lists, arrays and .npy files, and their error messages."""

import numpy as np
import pytest

from helpers import tick_past
from stoker.errors import SourceError
from stoker.sources import ArraySource, FolderSource, NpySource, TableSource, open_source
from stoker.sources.base import (
    Indexed,
    ListedSizes,
    LoadsFields,
    StoredReads,
    Takes,
    block_sizes,
    older_fingerprints,
)


def test_folder_labels_follow_sorted_class_names(image_folder):
    src = open_source(image_folder)
    assert isinstance(src, FolderSource)
    assert src.classes == ["class_000", "class_001", "class_002"]
    assert len(src) == 36
    assert np.array_equal(np.bincount(src.labels), [12, 12, 12])
    assert src.name(0).endswith(".jpg") and src.read(0)[:2] == b"\xff\xd8"


def test_folder_index_is_compact(image_folder):
    src = FolderSource(image_folder)
    per_sample = (src.index.blob.nbytes + src.index.offsets.nbytes + src.labels.nbytes) / len(src)
    assert per_sample < 100


def test_csv_paths_are_relative_to_the_file(image_folder):
    src = open_source(image_folder / "labels.csv")
    assert isinstance(src, TableSource)
    assert len(src) == 36
    assert src.read(5) == open(src.name(5), "rb").read()


def test_tsv_with_text_labels(tmp_path, image_folder):
    files = sorted(image_folder.glob("class_00*/*.jpg"))[:4]
    table = tmp_path / "list.tsv"
    table.write_text("".join(f"{f}\t{'cat' if i % 2 else 'dog'}\n" for i, f in enumerate(files)))
    src = open_source(table)
    assert src.classes == ["cat", "dog"]
    assert src.labels.tolist() == [1, 0, 1, 0]


def test_path_lists(image_folder):
    files = sorted(image_folder.glob("class_00*/*.jpg"))[:3]
    src = open_source(paths=files, labels=[2, 0, 1])
    assert src.labels.tolist() == [2, 0, 1]
    unlabeled = open_source(paths=[str(f) for f in files])
    assert unlabeled.labels.tolist() == [-1, -1, -1]
    with pytest.raises(SourceError, match="one label per path"):
        open_source(paths=files, labels=[1])


def test_arrays_and_npy(tmp_path):
    images = np.zeros((5, 8, 9, 3), np.uint8)
    src = open_source(images, labels=np.arange(5))
    assert isinstance(src, ArraySource) and src.read(4).shape == (8, 9, 3)
    np.save(tmp_path / "x.npy", images)
    npy = open_source(tmp_path / "x.npy", labels=np.arange(5))
    assert isinstance(npy, NpySource) and npy.read(2).shape == (8, 9, 3)
    with pytest.raises(SourceError, match="uint8"):
        open_source(images.astype(np.float32))
    with pytest.raises(SourceError, match="5 images but 4 labels"):
        open_source(images, labels=np.arange(4))


def test_a_source_states_its_optional_abilities_by_protocol(image_folder, tmp_path):
    arrays = open_source(np.zeros((4, 8, 8, 3), np.uint8), labels=np.arange(4))
    folder = open_source(image_folder)
    assert isinstance(arrays, Takes) and not isinstance(folder, Takes)
    assert isinstance(folder, Indexed) and not isinstance(arrays, Indexed)
    assert not isinstance(folder, ListedSizes) and block_sizes(folder) is None
    assert older_fingerprints(folder) == [] and older_fingerprints(arrays) == []
    out = np.ones((2, 8, 8, 3), np.uint8)
    assert arrays.take(np.array([0, 3]), out) and not out.any()
    assert isinstance(folder, StoredReads) and not isinstance(arrays, StoredReads)


class _Squares:
    """A per-sample dataset: sample i is {"x": i * i}."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> dict:
        return {"x": np.float32(i * i)}


def test_a_per_sample_dataset_loads_its_own_fields():
    source = open_source(_Squares())
    assert isinstance(source, LoadsFields) and not isinstance(source, StoredReads)
    out = {"x": np.zeros((), np.float32)}
    source.load(2, np.random.default_rng(0), out)
    assert out["x"] == 4.0


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda p: p / "missing", "no such file or folder"),
        (lambda p: p, "no class subfolders"),
        (lambda p: (p / "a").mkdir() or p, "no image files"),
        (lambda p: (p / "x.parquetz").write_text("x") and p / "x.parquetz", "cannot tell"),
        (lambda p: (p / "e.csv").write_text("\n") and p / "e.csv", "empty file"),
    ],
)
def test_bad_sources_say_what_is_wrong(tmp_path, make, match):
    with pytest.raises(SourceError, match=match):
        open_source(make(tmp_path))


def test_unsupported_type():
    with pytest.raises(SourceError, match="unsupported source"):
        open_source(42)


def test_big_folder_scan_is_cached_and_refreshed_when_the_folder_changes(
    tmp_path, image_folder, monkeypatch
):
    from stoker.sources import folder as folder_module

    monkeypatch.setattr(folder_module, "RACY_S", 0.0)  # cache a scan of a folder made just now
    jpeg = next(image_folder.glob("class_000/*.jpg")).read_bytes()
    root = tmp_path / "big"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(1000):
            (root / f"c{c}" / f"{i:05d}.jpg").write_bytes(jpeg)
    cache = tmp_path / "cache"
    first = FolderSource(root, cache_dir=cache)
    assert len(first) == 2000 and list(cache.glob("*.npz"))

    class NoScan(FolderSource):
        def _scan(self):
            raise AssertionError("scanned although the cache is valid")

    again = NoScan(root, cache_dir=cache)
    assert again.fingerprint() == first.fingerprint() and again.name(1999) == first.name(1999)
    tick_past(root, tmp_path / "probe")
    (root / "c1" / "new.jpg").write_bytes(jpeg)
    with pytest.raises(AssertionError, match="scanned"):
        NoScan(root, cache_dir=cache)
    assert len(FolderSource(root, cache_dir=cache)) == 2001


def _csv(tmp_path, image_folder, text: str):
    files = sorted(image_folder.glob("class_*/*.jpg"))[:3]
    path = tmp_path / "t.csv"
    path.write_text(text.format(*files))
    return path


@pytest.mark.parametrize(
    "text,error",
    [  # a header naming no path column is never read by position
        (
            "label\n0\n1\n2\n",
            r"t\.csv: the header \(label\) names no image path column; name "
            r"it one of path, image, filename, file.*labels alone",
        ),
        ("img,label\n{0},0\n{1},1\n", r"header \(img, label\) names no image path column"),
        ("label,mask\n{0},{1}\n", r"names no image path column.*image,mask"),
        # an unknown second column is not taken as the target by elimination
        (
            "file,score\n{0},0.5\n{1},1.5\n",
            r"has no label column and other columns \(score\).*"
            r"label, class, cls, target.*label_column='score'",
        ),
    ],
)
def test_a_csv_header_is_read_by_name_or_refused_naming_what_it_found(
    tmp_path, image_folder, text, error
):
    with pytest.raises(SourceError, match=error):
        open_source(_csv(tmp_path, image_folder, text))


def test_documented_label_aliases_are_read_by_name(tmp_path, image_folder):
    src = open_source(_csv(tmp_path, image_folder, "file,cls\n{0},cat\n{1},dog\n{2},cat\n"))
    assert src.classes == ["cat", "dog"] and src.labels.tolist() == [0, 1, 0]
    src = open_source(_csv(tmp_path, image_folder, "target,image\n2,{0}\n1,{1}\n0,{2}\n"))
    assert src.labels.tolist() == [2, 1, 0] and src.name(0).endswith(".jpg")
    src = open_source(_csv(tmp_path, image_folder, "file,score\n{0},0.5\n"), label_column="score")
    assert src.labels.tolist() == [0.5]
