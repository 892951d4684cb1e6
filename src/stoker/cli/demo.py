"""``stoker demo``: build a small dataset of real photographs, train a small Keras model on it
through stoker for an epoch, and print the loader's report."""

from __future__ import annotations

import os
from typing import Any

from ..loader import Loader
from .outputs import output_folder

IMAGE_SIZE = 96


def _model(classes: int) -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3)),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(classes, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def run_demo(out: str | os.PathLike = "demo_data", epochs: int = 2, workers: Any = "auto") -> None:
    """Make the dataset (once), train for ``epochs`` with validation, print both loaders' stats."""
    from ..datasets import make_image_folder

    root = output_folder("--out", out)
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    print(f"stoker demo: photos from scikit-image/scikit-learn -> {root}")
    train_dir = make_image_folder(root / "train", classes=4, per_class=96, seed=0, progress=True)
    val_dir = make_image_folder(root / "val", classes=4, per_class=24, seed=1, progress=True)
    common = dict(batch_size=32, image_size=IMAGE_SIZE, workers=workers)
    with (
        Loader(train_dir, augment="train", seed=0, **common) as train,
        Loader(val_dir, augment="eval", shuffle=False, **common) as val,
    ):
        model = _model(len(train.class_names or []))
        model.fit(train.keras(), validation_data=val.keras(), epochs=epochs, verbose=2)
        print("\ntraining loader:")
        print(train.stats())
        print("\nvalidation loader:")
        print(val.stats())
