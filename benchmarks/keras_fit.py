"""Input throughput through `loader.keras()` inside `model.fit` vs plain iteration of the loader.

TensorFlow backend (KERAS_BACKEND=tensorflow is set here). The model is so small that its
compute is negligible: uint8 input -> take every 16th pixel (14x14x3), cast, /255 ->
GlobalAveragePooling2D -> Dense(classes). So fit's images/s is the input path's images/s:
loader -> stoker's keras PyDataset -> Keras' data adapter (on TF: a tf.data generator) -> step.

    stoker numpy     `for x, y in loader` (continuous epochs), median epoch img/s
    stoker fit       `model.fit(loader.keras(), epochs=1 + N)`, epoch times from a callback;
                     the first epoch (tracing, worker start) is dropped
    keras numpy      the Keras PyDataset peer (peers.py: load_img + Pillow RandomResizedCrop,
                     workers=2, use_multiprocessing=True) through Keras' own adapter/enqueuer
    keras fit        the same PyDataset in model.fit
    model only       fit on one in-memory batch repeated (tf.data from_tensors.repeat): the
                     model's own speed, to show it is far above every input rate

Goal: stoker fit / stoker numpy >= 0.9.

Usage
    python benchmarks/keras_fit.py                       # 3 measured epochs x 2 repeats each
    python benchmarks/keras_fit.py --max-images 1024 --epochs 2 --repeats 1 --no-keras-peer
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import peers  # noqa: E402


def build_model(classes: int) -> Any:
    import keras
    from keras import layers, ops

    class Subsample(layers.Layer):
        """Every 16th pixel, as float in [0, 1]: keeps the model's compute negligible."""

        def call(self, x: Any) -> Any:
            return ops.cast(x[:, ::16, ::16, :], "float32") / 255.0

    inputs = keras.Input((224, 224, 3), dtype="uint8")
    x = layers.GlobalAveragePooling2D()(Subsample()(inputs))
    model = keras.Model(inputs, layers.Dense(classes, activation="softmax")(x))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


class EpochTimer:
    """A Keras callback recording wall time per epoch."""

    def __new__(cls) -> Any:
        import keras

        class _Timer(keras.callbacks.Callback):
            def __init__(self) -> None:
                super().__init__()
                self.times: list[float] = []
                self._t0 = 0.0

            def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
                self._t0 = time.perf_counter()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                self.times.append(time.perf_counter() - self._t0)

        return _Timer()


def fit_rates(
    model: Any, ds: Any, epochs: int, images_per_epoch: int, shuffle: bool = True
) -> list[float]:
    """img/s of epochs 2..1+epochs of ``model.fit(ds)`` (epoch 1 is the warm-up)."""
    timer = EpochTimer()
    model.fit(ds, epochs=1 + epochs, verbose=0, callbacks=[timer], shuffle=shuffle)
    return [images_per_epoch / t for t in timer.times[1:]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=common.DEFAULT_DATA)
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs (after 1 warm-up)")
    ap.add_argument("--max-images", type=int, default=0, help="random subset (smoke runs)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-keras-peer", action="store_true", help="skip the PyDataset contrast")
    ap.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="run every block this many times, in reversed order every other time",
    )
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    facts = common.print_facts()
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, TF {tf.__version__}")
    all_items = common.list_items(args.data)
    items = common.subset(all_items, args.max_images)
    common.warm_page_cache(p for p, _ in items)
    data = args.data if len(items) == len(all_items) else None
    classes = max(y for _, y in items) + 1
    model = build_model(classes)
    bs = args.batch_size
    results: dict[str, list[float]] = {}

    def make_stoker() -> Any:
        return peers.make("stoker", items, data=data, batch_size=bs, workers=args.workers)

    # model only: one batch, in memory, repeated
    n = len(items) // bs
    x = np.random.default_rng(0).integers(0, 256, (bs, 224, 224, 3), dtype=np.uint8)
    y = np.zeros(bs, np.int64)
    mem = tf.data.Dataset.from_tensors((x, y)).repeat(n)
    results["model only (in-memory batch)"] = fit_rates(
        model, mem, args.epochs, n * bs, shuffle=False
    )

    def stoker_numpy() -> None:
        with make_stoker() as pipe:
            loader = pipe.obj
            common.time_epoch(loader)  # warm-up
            results.setdefault("stoker numpy", []).extend(
                common.time_epoch(loader).rate for _ in range(args.epochs)
            )

    def stoker_fit() -> None:
        with make_stoker() as pipe:
            loader = pipe.obj
            results.setdefault("stoker fit (loader.keras())", []).extend(
                fit_rates(model, loader.keras(), args.epochs, len(loader) * bs)
            )
            stats.append(str(loader.stats()))
            print(stats[-1])

    def keras_numpy() -> None:
        with peers.make("keras-pydataset", items, batch_size=bs, workers=args.workers) as pipe:
            common.time_epoch(pipe.epoch())  # warm-up
            results.setdefault("keras PyDataset numpy", []).extend(
                common.time_epoch(pipe.epoch()).rate for _ in range(args.epochs)
            )

    def keras_fit() -> None:
        ds = peers.keras_pydataset(items, bs, 224, args.workers)
        results.setdefault("keras PyDataset fit", []).extend(
            fit_rates(model, ds, args.epochs, len(ds) * bs)
        )

    stats: list[str] = []
    blocks = [stoker_numpy, stoker_fit] + ([] if args.no_keras_peer else [keras_numpy, keras_fit])
    for r in range(args.repeats):  # the block order reverses every repeat: drift hits all alike
        for block in blocks if r % 2 == 0 else blocks[::-1]:
            block()

    rows = [
        [name, f"{common.median(r):,.0f}", f"{min(r):,.0f}", f"{max(r):,.0f}"]
        for name, r in results.items()
    ]
    print(
        f"\n{len(items)} images, batch {bs}, {args.workers} workers; median of "
        f"{args.epochs} epochs after a warm-up x {args.repeats} repeats (block order "
        "reversed every other repeat)"
    )
    print(common.table(rows, ["input path", "img/s", "min", "max"]))

    def med(name: str) -> float:
        return common.median(results[name]) if name in results else float("nan")

    ratios = [
        common.ratio_line(
            "stoker: fit / numpy", med("stoker fit (loader.keras())"), med("stoker numpy"), ">= 0.9"
        )
    ]
    if not args.no_keras_peer:
        ratios.append(
            common.ratio_line(
                "keras PyDataset: fit / numpy (contrast)",
                med("keras PyDataset fit"),
                med("keras PyDataset numpy"),
                ">= 0.9",
            )
        )
        ratios.append(
            common.ratio_line(
                "stoker fit / keras PyDataset fit",
                med("stoker fit (loader.keras())"),
                med("keras PyDataset fit"),
                ">= 3.5",
            )
        )
    print()
    print(common.table(ratios, ["ratio (medians)", "value", "goal", "verdict"]))
    common.write_json(
        args.json,
        {
            "facts": facts,
            "images": len(items),
            "results": results,
            "ratios": ratios,
            "stoker_stats": stats,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
