"""What a script needs before its Loader exists: ``stoker.class_names`` and
``stoker.num_classes`` read from the source alone (and agree with the Loader's own), and
``validation_cut="last"`` cuts arrays exactly as Keras' ``fit(validation_split=)`` does."""

from __future__ import annotations

import numpy as np
import psutil
import pytest

import stoker
from stoker.errors import ConfigError


def _loader_names(source, **kwargs):
    with stoker.Loader(source, batch_size=2, workers=0, **kwargs) as loader:
        return loader.class_names


@pytest.mark.timeout(120)
def test_class_names_and_num_classes_of_a_folder_a_csv_and_arrays_without_a_loader(
    image_folder, tmp_path
):
    children = psutil.Process().children()
    names = stoker.class_names(image_folder)
    assert names == ["class_000", "class_001", "class_002"] == _loader_names(image_folder)
    assert stoker.num_classes(image_folder) == 3
    picked = stoker.class_names(image_folder, class_names=["class_002", "class_000"])
    assert picked == ["class_002", "class_000"]
    assert stoker.num_classes(image_folder, class_names=["class_002"]) == 1
    rows = [line.split(",") for line in (image_folder / "labels.csv").read_text().splitlines()]
    text = tmp_path / "named.csv"  # text labels: the classes are their sorted values
    text.write_text("path,label\n" + "".join(f"{image_folder / p},cls{c}\n" for p, c in rows[1:]))
    assert stoker.class_names(text) == ["cls0", "cls1", "cls2"] == _loader_names(text)
    x = np.zeros((6, 8, 8, 3), np.uint8)
    assert stoker.class_names(x, labels=np.array([0, 4, 1, 1, 0, 2])) is None
    assert stoker.num_classes(x, labels=np.array([0, 4, 1, 1, 0, 2])) == 5  # as one-hot counts
    with pytest.raises(ConfigError, match="not class ids"):
        stoker.num_classes(x, labels=np.linspace(0, 1, 6, dtype=np.float32))
    assert psutil.Process().children() == children  # no worker was started


class Named:
    """A torchvision-style dataset with ``classes``."""

    classes = ["cat", "dog"]

    def __len__(self):
        return 4

    def __getitem__(self, i):
        raise AssertionError("class_names must not load a sample")


@pytest.mark.timeout(120)
def test_class_names_of_a_hugging_face_dataset_and_a_torchvision_style_one_load_no_sample():
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {"x": datasets.Value("float32"), "label": datasets.ClassLabel(names=["ant", "bee", "fly"])}
    )
    hf = datasets.Dataset.from_dict({"x": [0.0, 1.0], "label": [0, 2]}, features=features)
    assert stoker.class_names(hf) == ["ant", "bee", "fly"] and stoker.num_classes(hf) == 3
    assert _loader_names(hf.with_format("numpy")) == ["ant", "bee", "fly"]
    assert stoker.class_names(Named()) == ["cat", "dog"] and stoker.num_classes(Named()) == 2

    class Plain(Named):
        classes = None

    assert stoker.class_names(Plain()) is None
    with pytest.raises(ConfigError, match="no class names"):
        stoker.num_classes(Plain())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,fraction", [(10, 0.25), (7, 0.2), (9, 0.5)])
def test_validation_cut_last_is_keras_fits_own_cut_of_the_same_arrays(n, fraction):
    from keras.src.trainers.data_adapters.array_slicing import train_validation_split

    x = np.arange(n * 4 * 4 * 3, dtype=np.uint8).reshape(n, 4, 4, 3)
    y = np.arange(n, dtype=np.int64)
    (_, y_train), (_, y_val) = train_validation_split((x, y), validation_split=fraction)
    got = {}
    for subset in ("training", "validation"):
        with stoker.Loader(
            x,
            labels=y,
            validation_split=fraction,
            subset=subset,
            validation_cut="last",
            shuffle=False,
            batch_size=1,
            workers=0,
        ) as loader:
            got[subset] = loader.source_indices
            images = np.concatenate([b[0] for b in loader])
        want = np.asarray(y_train if subset == "training" else y_val)
        assert np.array_equal(images, x[want])
    assert got["training"].tolist() == np.asarray(y_train).tolist()
    assert got["validation"].tolist() == np.asarray(y_val).tolist()


def test_validation_cut_is_checked_and_refuses_stratify():
    x = np.zeros((6, 4, 4, 3), np.uint8)
    with pytest.raises(ConfigError, match="validation_cut='first'.*'random'.*'last'"):
        stoker.Loader(x, validation_split=0.5, subset="training", validation_cut="first")
    with pytest.raises(ConfigError, match="stratify=True.*validation_cut='last'"):
        stoker.Loader(
            x,
            labels=np.arange(6) % 2,
            validation_split=0.5,
            subset="training",
            stratify=True,
            validation_cut="last",
        )
