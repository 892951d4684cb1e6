"""``pad_to_aspect_ratio=True`` against Keras' ``image_dataset_from_directory`` itself, on the
same JPEGs: how far stoker's pixels are from Keras', and how much of that is the decoder.

For each output size it prints the mean and largest absolute difference (0-255 levels) between
stoker's batches and Keras' (``interpolation="bilinear"`` for both), whether the black border
rows and columns are the same in every image, and the largest difference against
``tf.image.resize_with_pad`` on libjpeg's accurate decode (stoker's decoder; TensorFlow's own
default is the fast integer IDCT). Usage::

    python benchmarks/keras_pad.py --folder /tmp/keras_pad --per-class 6
"""

from __future__ import annotations

import argparse
import os

import numpy as np

SIZES = [(32, 32), (48, 80), (100, 60), (224, 224)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", default="/tmp/keras_pad")
    parser.add_argument("--per-class", type=int, default=6)
    parser.add_argument("--interpolation", default="bilinear", help="stoker's interpolation")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    import stoker
    from stoker.datasets import make_image_folder

    root = make_image_folder(
        args.folder, classes=2, per_class=args.per_class, min_side=64, max_side=120, seed=1
    )
    files = sorted(str(p) for p in root.glob("*/*.jpg"))
    n = len(files)
    for size in SIZES:
        ds = keras.utils.image_dataset_from_directory(
            str(root),
            image_size=size,
            batch_size=n,
            shuffle=False,
            verbose=False,
            pad_to_aspect_ratio=True,
            interpolation="bilinear",
        )
        theirs = np.concatenate([x.numpy() for x, _ in ds])
        with stoker.Loader(
            root,
            image_size=size,
            augment=None,
            shuffle=False,
            batch_size=n,
            workers=0,
            interpolation=args.interpolation,
            pad_to_aspect_ratio=True,
            drop_last=False,
        ) as loader:
            ours = np.concatenate([x for x, _ in loader]).astype(np.float32)
        same_border = all(
            np.array_equal(
                (theirs[i] == 0).all(axis=(1 - a, 2)), (ours[i] == 0).all(axis=(1 - a, 2))
            )
            for i in range(n)
            for a in (0, 1)
        )
        accurate = np.stack(
            [
                tf.image.resize_with_pad(
                    tf.io.decode_jpeg(
                        tf.io.read_file(f), channels=3, dct_method="INTEGER_ACCURATE"
                    ),
                    *size,
                    method="bilinear",
                ).numpy()
                for f in files
            ]
        )
        d = np.abs(ours - theirs)
        print(
            f"{size[0]}x{size[1]}: vs keras mean {d.mean():.2f} max {d.max():.1f}, same border "
            f"{same_border}; vs resize_with_pad(accurate decode) max "
            f"{np.abs(ours - accurate).max():.2f}"
        )


if __name__ == "__main__":
    main()
