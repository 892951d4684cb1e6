"""Targets of any numeric dtype and fixed shape come through bit for bit, from every kind of
source and through the shared-memory slots; nothing is ever cast into another meaning (a float
label truncated, a float-valued CSV column turned into class ids); array sources are not
resized or augmented unless asked."""

from __future__ import annotations

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import stoker
from stoker.errors import SourceError
from stoker.sources import open_source


def _images(n: int, h: int = 12, w: int = 10) -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def _all_batches(loader) -> dict[str, np.ndarray]:
    """Every field of one epoch, concatenated (dict batches)."""
    parts: dict[str, list[np.ndarray]] = {}
    for batch in loader:
        for name, value in batch.items():
            parts.setdefault(name, []).append(np.array(value))
    return {k: np.concatenate(v) for k, v in parts.items()}


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


TARGETS = {
    "float32 (N,)": np.random.default_rng(2).normal(size=40).astype(np.float32) * 3.3,
    "float64 (N, 4)": np.random.default_rng(3).normal(size=(40, 4)),
    "float16 (N, 2, 3)": np.random.default_rng(4).normal(size=(40, 2, 3)).astype(np.float16),
    "int16 (N, 5)": np.random.default_rng(5).integers(-300, 300, (40, 5)).astype(np.int16),
    "uint8 (N,)": np.arange(40, dtype=np.uint8),
    "bool (N, 3)": np.random.default_rng(6).random((40, 3)) < 0.5,
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_array_targets_keep_dtype_shape_and_bits_through_the_slots(workers):
    images = _images(40)
    for name, y in TARGETS.items():
        with stoker.Loader(
            images,
            labels=y,
            batch_size=8,
            workers=workers,
            seed=3,
            batch="dict",
            drop_last=False,
        ) as loader:
            got = _all_batches(loader)
        order = got["index"]
        assert sorted(order.tolist()) == list(range(40)), name
        assert got["label"].dtype == y.dtype and got["label"].shape == y.shape, name
        assert _bits(got["label"]) == _bits(y[order]), name
        assert _bits(got["image"]) == _bits(images[order]), name  # defaults: no resize/augment


@pytest.mark.timeout(60)
def test_float_labels_are_never_truncated_in_the_default_tuple():
    y = np.array([0.25, 1.75, -2.5, 3.0, 0.9, 7.5], np.float32)
    with stoker.Loader(_images(6), labels=y, batch_size=3, shuffle=False, workers=0) as loader:
        labels = np.concatenate([b for _, b in loader])
    assert labels.dtype == np.float32 and _bits(labels) == _bits(y)


@pytest.mark.timeout(60)
def test_lists_of_float_labels_stay_floats(image_folder):
    files = sorted(image_folder.glob("class_*/*.jpg"))[:4]
    src = open_source(paths=files, labels=[0.5, 1.5, 2.25, -1.0])
    assert src.labels.dtype == np.float64 and src.labels.tolist() == [0.5, 1.5, 2.25, -1.0]
    src = open_source(paths=files, labels=[[0.5, 1], [2, 3], [4, 5], [6, 7.5]])
    assert src.labels.shape == (4, 2) and src.labels[3, 1] == 7.5
    with pytest.raises(SourceError, match="mix numbers and text"):
        open_source(paths=files, labels=[1, "cat", 2, 3])


def _table(tmp_path, image_folder, header: str, rows: list[str], name: str = "t.csv"):
    files = sorted(image_folder.glob("class_*/*.jpg"))
    lines = [header] if header else []
    lines += [f"{files[i]},{row}" for i, row in enumerate(rows)]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.timeout(60)
def test_float_valued_csv_column_is_a_numeric_target_not_class_ids(tmp_path, image_folder):
    scores = ["0.5", "1.25", "0.5", "3", "2.75"]
    for header in ("path,label", ""):
        src = open_source(_table(tmp_path, image_folder, header, scores))
        assert src.classes is None
        assert src.labels.dtype == np.float64
        assert src.labels.tolist() == [0.5, 1.25, 0.5, 3.0, 2.75]


@pytest.mark.timeout(60)
def test_csv_columns_by_name_and_vector_targets(tmp_path, image_folder):
    rows = [f"{i},{i * 0.5},{-i},0.{i}1,{'cat' if i % 2 else 'dog'}" for i in range(6)]
    table = _table(tmp_path, image_folder, "path,id,x,y,w,kind", rows)
    src = open_source(table, label_column="x")
    assert src.labels.tolist() == [i * 0.5 for i in range(6)]
    src = open_source(table, label_column=["x", "y", "w"])
    assert src.labels.shape == (6, 3) and src.labels.dtype == np.float64
    assert src.labels[5].tolist() == [2.5, -5.0, 0.51]
    src = open_source(table, label_column="kind")
    assert src.classes == ["cat", "dog"] and src.labels.tolist() == [1, 0, 1, 0, 1, 0]
    src = open_source(table, label_column="id")
    assert src.labels.dtype == np.int64 and src.labels.tolist() == list(range(6))
    with pytest.raises(SourceError, match="no column 'z'"):
        open_source(table, label_column="z")
    with pytest.raises(SourceError, match="label_column="):
        open_source(table)  # several candidate columns and no 'label': say which to pick
    with pytest.raises(SourceError, match="'kind' holds text"):
        open_source(table, label_column=["x", "kind"])


@pytest.mark.timeout(60)
def test_a_label_column_mixing_numbers_and_text_is_an_error_naming_it(tmp_path, image_folder):
    table = _table(tmp_path, image_folder, "path,label", ["1", "2", "n/a", "0.5"])
    with pytest.raises(SourceError, match=r"column 'label'.*mixes numbers.*row 3: 'n/a'"):
        open_source(table)


@pytest.mark.timeout(120)
def test_csv_targets_and_weights_reach_the_batch(tmp_path, image_folder):
    rows = [f"{i / 4},{i % 3 + 0.5}" for i in range(8)]
    table = _table(tmp_path, image_folder, "path,score,w", rows)
    with stoker.Loader(
        table,
        label_column="score",
        sample_weight="w",
        batch_size=4,
        image_size=16,
        shuffle=False,
        workers=1,
    ) as loader:
        batches = list(loader)
    x, y, w = batches[1]
    assert x.shape == (4, 16, 16, 3) and y.dtype == np.float64 and w.dtype == np.float32
    assert y.tolist() == [1.0, 1.25, 1.5, 1.75] and w.tolist() == [1.5, 2.5, 0.5, 1.5]


@pytest.mark.timeout(60)
def test_npy_and_hdf5_targets_keep_dtype_and_shape(tmp_path):
    images = _images(10)
    y = np.random.default_rng(7).normal(size=(10, 3)).astype(np.float16)
    np.save(tmp_path / "x.npy", images)
    np.save(tmp_path / "y.npy", y)
    src = open_source(tmp_path / "x.npy", labels=tmp_path / "y.npy")
    assert src.labels.dtype == np.float16 and _bits(src.labels) == _bits(y)
    boxes = np.random.default_rng(8).random((10, 4)).astype(">f4")  # big-endian in the file
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f.create_dataset("images", data=images)
        f.create_dataset("labels", data=boxes)
    with stoker.Loader(tmp_path / "d.h5", batch_size=5, shuffle=False, workers=0) as loader:
        x, got = next(iter(loader))
    assert got.dtype == np.float32 and got.shape == (5, 4)
    assert got.tolist() == boxes[:5].astype(np.float32).tolist()
    assert _bits(x) == _bits(images[:5])


@pytest.mark.timeout(60)
def test_parquet_float_and_fixed_size_list_targets(tmp_path, image_folder):
    files = sorted(image_folder.glob("class_*/*.jpg"))[:6]
    data = [f.read_bytes() for f in files]
    score = np.array([0.5, 1.5, -2.25, 3.0, 0.125, 9.5], np.float32)
    boxes = np.arange(24, dtype=np.float32).reshape(6, 4) / 8
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": d, "path": f.name} for d, f in zip(data, files, strict=True)]
            ),
            "label": pa.array(score),
            "box": pa.FixedSizeListArray.from_arrays(pa.array(boxes.reshape(-1)), 4),
        }
    )
    pq.write_table(table, tmp_path / "s.parquet", compression="NONE", use_dictionary=False)
    src = open_source(tmp_path / "s.parquet")
    assert src.labels.dtype == np.float32 and _bits(src.labels) == _bits(score)
    src = open_source(tmp_path / "s.parquet", label_column="box")
    assert src.labels.dtype == np.float32 and _bits(src.labels) == _bits(boxes)


def _shard(path, files, **columns) -> None:
    data = [f.read_bytes() for f in files]
    image = pa.array([{"bytes": d, "path": f.name} for d, f in zip(data, files, strict=True)])
    table = pa.table({"image": image, **columns})
    pq.write_table(table, path, compression="NONE", use_dictionary=False)


@pytest.mark.timeout(120)
def test_parquet_target_from_several_columns(tmp_path, image_folder):
    """label_column=[...] stacks named scalar columns into (N, K), their dtype kept bit for
    bit, across shards and through the workers into the batch."""
    files = sorted(image_folder.glob("class_*/*.jpg"))[:8]
    rng = np.random.default_rng(5)
    box = rng.normal(size=(8, 4)).astype(np.float32)
    ids = rng.integers(-9, 9, (8, 2)).astype(np.int16)
    (tmp_path / "shards").mkdir()
    for k, part in enumerate((slice(0, 5), slice(5, 8))):
        _shard(
            tmp_path / "shards" / f"part-{k}.parquet",
            files[part],
            label=pa.array(["cat", "dog", "cat", "dog", "cat"][: part.stop - part.start]),
            x=pa.array(box[part, 0]),
            y=pa.array(box[part, 1]),
            w=pa.array(box[part, 2]),
            h=pa.array(box[part, 3]),
            a=pa.array(ids[part, 0]),
            b=pa.array(ids[part, 1]),
            flag=pa.array(ids[part, 0] > 0),
        )
    folder = tmp_path / "shards"
    src = open_source(folder, label_column=["x", "y", "w", "h"])
    assert src.labels.dtype == np.float32 and src.labels.shape == (8, 4)
    assert _bits(src.labels) == _bits(box) and src.classes is None  # not the 'label' classes
    src = open_source(folder, label_column=["b", "a"])  # the order given
    assert src.labels.dtype == np.int16 and np.array_equal(src.labels, ids[:, ::-1])
    assert open_source(folder, label_column=["flag"]).labels.dtype == np.bool_
    assert open_source(folder).classes == ["cat", "dog"]  # the default 'label' column still
    with stoker.Loader(
        folder,
        label_column=["x", "y", "w", "h"],
        batch_size=4,
        image_size=16,
        shuffle=False,
        workers=1,
        augment=None,
    ) as loader:
        got = np.concatenate([y for _, y in loader])
    assert got.dtype == np.float32 and _bits(got) == _bits(box)


@pytest.mark.timeout(60)
def test_parquet_target_columns_that_cannot_be_one_are_named(tmp_path, image_folder):
    files = sorted(image_folder.glob("class_*/*.jpg"))[:3]
    path = tmp_path / "s.parquet"
    _shard(
        path,
        files,
        x=pa.array([0.5, 1.0, 2.0], pa.float32()),
        y=pa.array([1.0, 2.0, 3.0], pa.float64()),
        z=pa.array([1.0, None, 3.0], pa.float32()),
        kind=pa.array(["a", "b", "a"]),
        v=pa.array([0.5, 1.5, 2.5], pa.float32()),
    )
    with pytest.raises(SourceError, match=r"s.parquet: no column 'q' \(columns: image, x"):
        open_source(path, label_column=["x", "q"])
    with pytest.raises(SourceError, match="no column 'q'"):  # a name given must be there
        open_source(path, label_column="q")
    with pytest.raises(SourceError, match=r"differ in dtype \(x: float32, y: float64\)"):
        open_source(path, label_column=["x", "y"])
    with pytest.raises(SourceError, match="column 'kind' is string"):
        open_source(path, label_column=["x", "kind"])
    with pytest.raises(SourceError, match="column 'z' has 1 null rows"):
        open_source(path, label_column=["x", "z"])
    with pytest.raises(SourceError, match="distinct names"):
        open_source(path, label_column=["x", "x"])
    assert open_source(path, label_column=["x", "v"]).labels.dtype == np.float32
    assert open_source(path).labels.tolist() == [-1, -1, -1]  # no 'label' column: unlabeled


@pytest.mark.timeout(60)
def test_array_defaults_keep_the_arrays_as_they_are():
    images = _images(8, 28, 20)
    with stoker.Loader(images, batch_size=4, shuffle=False, workers=0) as loader:
        assert "image_size=(28, 20), augment=None" in repr(loader)
        got = np.concatenate([x for x, _ in loader])
    assert _bits(got) == _bits(images)
    with stoker.Loader(images, batch_size=4, image_size=14, augment="train", workers=0) as loader:
        assert next(iter(loader))[0].shape == (4, 14, 14, 3)  # asked for: resized, augmented


@pytest.mark.timeout(240)
def test_every_adapter_keeps_the_targets_bits():
    images = _images(16)
    y = np.random.default_rng(9).normal(size=(16, 4)).astype(np.float32)
    ids = np.arange(16, dtype=np.int32) * 3
    opts = dict(batch_size=8, shuffle=False, workers=1)
    with stoker.Loader(images, labels=y, **opts) as loader:
        torch_y = np.concatenate([t.numpy() for _, t in loader.torch()])
        jax_y = np.concatenate([np.asarray(t) for _, t in loader.jax()])
        tf_y = np.concatenate([t.numpy() for _, t in loader.tf()])
        ds = loader.keras()
        keras_y = np.concatenate([np.array(ds[i][1]) for i in range(len(ds))])
    for got in (torch_y, jax_y, tf_y, keras_y):
        assert got.dtype == np.float32 and _bits(got) == _bits(y)
    with stoker.Loader(images, labels=ids, batch=("image", "label", "index"), **opts) as loader:
        x, t, i = next(iter(loader.torch()))
        assert str(t.dtype) == "torch.int32" and t.tolist() == ids[:8].tolist()
        spec = loader.tf().element_spec
        assert spec[1].dtype.name == "int32" and tuple(spec[1].shape) == (8,)
