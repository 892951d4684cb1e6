"""Keras adapter: index bookkeeping (peeks, restarts, any order) and real ``fit`` on 3 backends.

The backend of Keras 3 is fixed when keras is imported, so each backend's training run happens
in a fresh interpreter with ``KERAS_BACKEND`` set.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import script_result
from stoker.schema import SlotLayout
from stoker.sources import open_source

# --------------------------------------------------------------------------- bookkeeping


class FakeLoader:
    """Stands in for a Loader: batch k of the stream is filled with the value k."""

    batch_size, image_size = 2, (4, 4)
    recipe = SimpleNamespace(
        schema=SimpleNamespace(
            slot_layout=SlotLayout(2, (("image", "uint8", (4, 4, 3)), ("label", "int64", ())))
        ),
        source=open_source(np.zeros((2, 4, 4, 3), np.uint8)),
    )

    def __init__(self, batches: int) -> None:
        self.batches, self.pulled = batches, 0

    def __len__(self) -> int:
        return self.batches

    def stream(self):
        while True:
            k = self.pulled
            self.pulled += 1
            yield np.full((2, 4, 4, 3), k % 256, np.uint8), np.full(2, k, np.int64)


def _dataset(batches: int):
    keras_adapter = pytest.importorskip("stoker.adapters.keras")
    loader = FakeLoader(batches)
    return keras_adapter.to_keras(loader), loader


def _epoch(ds, order=None) -> list[int]:
    """One Keras-style pass: begin, every index (in ``order``), end; the labels it got."""
    ds.on_epoch_begin()
    got = [int(ds[i][1][0]) for i in (order if order is not None else range(len(ds)))]
    ds.on_epoch_end()
    return got


@pytest.mark.timeout(60)
def test_tf_style_peek_reuses_the_peeked_batches() -> None:
    ds, loader = _dataset(5)
    assert len(ds) == ds.num_batches == 5
    peek = [int(ds[i][1][0]) for i in range(2)]  # outside any epoch, as get_tf_dataset does
    ds.on_epoch_end()  # EpochIterator.reset()
    assert peek == [0, 1]
    assert _epoch(ds) == [0, 1, 2, 3, 4]
    assert _epoch(ds) == [5, 6, 7, 8, 9]
    assert loader.pulled == 10


@pytest.mark.timeout(60)
def test_model_building_restart_reuses_the_first_batch() -> None:
    ds, loader = _dataset(4)
    ds.on_epoch_begin()  # JAX/torch _symbolic_build: one batch, then reset()
    assert int(ds[0][1][0]) == 0
    ds.on_epoch_end()
    assert _epoch(ds) == [0, 1, 2, 3]
    assert _epoch(ds) == [4, 5, 6, 7]
    assert loader.pulled == 8


@pytest.mark.timeout(60)
def test_shuffled_indices_and_repeats_get_each_batch_once() -> None:
    ds, loader = _dataset(6)
    order = [3, 0, 5, 1, 4, 2]
    got = _epoch(ds, order)
    assert sorted(got) == list(range(6)) and got == [0, 1, 2, 3, 4, 5]
    ds.on_epoch_begin()
    first = ds[4][1][0]
    assert ds[4][1][0] == first  # a repeated index gives the same batch
    for i in (0, 1, 2, 3, 5):
        ds[i]
    ds.on_epoch_end()
    assert loader.pulled == 12


@pytest.mark.timeout(60)
def test_steps_per_epoch_shorter_than_the_dataset_continues_the_pass() -> None:
    ds, loader = _dataset(4)
    assert _epoch(ds, [0, 1]) == [0, 1]  # fit(steps_per_epoch=2): the same generator goes on
    assert _epoch(ds, [2, 3]) == [2, 3]
    assert _epoch(ds, [0, 1]) == [4, 5]
    assert loader.pulled == 6


@pytest.mark.timeout(60)
def test_kept_batches_are_views_until_the_loader_would_reuse_them() -> None:
    ds, loader = _dataset(5)
    ds._keeps = False  # a backend that lets go of its batches (PyTorch, JAX on an accelerator)
    a = ds[0][0]  # a peek outside any epoch: Keras will ask for index 0 again
    ds[1]
    assert ds._entries[0].copied and ds._entries[1].copied  # a peek is Keras' to keep
    ds.on_epoch_end()
    ds.on_epoch_begin()
    assert ds[0][0] is a  # the same batch again
    ds[1]
    ds[2]
    assert set(ds._entries) == {1, 2}  # served ones go once older than the newest
    assert not ds._entries[2].copied  # inside an epoch: the loader's zero-copy view
    ds[3]
    ds[4]
    ds.on_epoch_end()
    assert not ds._entries and loader.pulled == 5
    assert _epoch(ds) == [5, 6, 7, 8, 9]

    ds, loader = _dataset(3)
    ds._keeps = True  # TensorFlow, JAX on CPU: every batch is a copy Keras may keep
    ds.on_epoch_begin()
    ds[0]
    ds[1]
    assert all(e.copied for e in ds._entries.values())
    assert ds[1][0].flags.owndata


@pytest.mark.timeout(60)
def test_a_restart_past_the_kept_batches_starts_a_new_keras_epoch() -> None:
    ds, loader = _dataset(5)
    ds.on_epoch_begin()
    for i in range(3):
        ds[i]
    ds.on_epoch_end()  # interrupted after 3 batches; index 0's batch is gone
    assert _epoch(ds) == [3, 4, 5, 6, 7]
    assert _epoch(ds) == [8, 9, 10, 11, 12]
    with pytest.raises(IndexError):
        ds[5]


def test_import_does_not_pull_a_batch() -> None:
    ds, loader = _dataset(3)
    assert loader.pulled == 0 and "3 batches" in repr(ds)


# --------------------------------------------------------------------------- real fit

SCRIPT = textwrap.dedent(
    """
    import json
    import sys
    import time

    import stoker


    def main(folder):
        import keras
        import numpy as np

        class Steps(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                self.steps = []

            def on_epoch_begin(self, epoch, logs=None):
                self.steps.append(0)

            def on_train_batch_end(self, batch, logs=None):
                self.steps[-1] += 1

        keras.utils.set_random_seed(0)
        t0 = time.perf_counter()
        with stoker.Loader(folder, batch_size=8, image_size=32, workers=2, seed=0) as train, \\
                stoker.Loader(folder, batch_size=8, image_size=32, workers=1, augment="eval",
                              shuffle=False) as val:
            model = keras.Sequential([
                keras.Input((32, 32, 3)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Conv2D(8, 3, activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(3, activation="softmax"),
            ])
            model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
            steps = Steps()
            csv = keras.callbacks.CSVLogger("log.csv")
            hist = model.fit(train.keras(), validation_data=val.keras(), epochs=2,
                             callbacks=[steps, train.keras_report(), csv], verbose=0)
            report = train.stats()
            after_fit = (train.stats().batches, val.stats().batches)
            scores = model.evaluate(val.keras(), verbose=0)
            preds = model.predict(val.keras(), verbose=0)
            out = {
                "backend": keras.backend.backend(),
                "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
                "steps": steps.steps,
                "len_train": len(train), "len_val": len(val),
                "train_batches": after_fit[0], "val_batches_fit": after_fit[1],
                "val_batches_all": val.stats().batches,
                "kept_train": train.stats().kept_batches,
                "kept_val": val.stats().kept_batches,
                "csv_header": open("log.csv").readline().strip().split(","),
                "train_s": report.train_s, "outside_s": report.outside_s,
                "scores": [float(s) for s in np.ravel(scores)],
                "pred_shape": list(preds.shape),
                "seconds": time.perf_counter() - t0,
            }
        print("RESULT " + json.dumps(out))


    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.needs("keras")
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_fit_evaluate_predict(
    backend: str, image_folder: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    for module in ("keras", backend):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    script = tmp_path / "fit_script.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "KERAS_BACKEND": backend,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        "JAX_PLATFORMS": "cpu",
    }
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(script), str(image_folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=270,
        cwd=tmp_path,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    print(f"{backend}: {time.perf_counter() - t0:.1f} s in the subprocess, {out}")

    assert out["backend"] == backend
    n_train, n_val = out["len_train"], out["len_val"]
    assert (n_train, n_val) == (4, 5)  # 36 images: 4 full shuffled batches; 5 in order
    hist = out["history"]
    assert len(hist["loss"]) == 2 and len(hist["val_loss"]) == 2
    assert all(np.isfinite(hist["loss"] + hist["val_loss"]))
    assert out["steps"] == [n_train, n_train]
    assert out["train_batches"] == 2 * n_train  # each loader batch handed out once, none extra
    assert out["val_batches_fit"] == 2 * n_val
    assert out["val_batches_all"] == 4 * n_val  # + evaluate + predict
    assert len(out["scores"]) == 2 and all(np.isfinite(out["scores"]))
    assert out["pred_shape"] == [36, 3]
    # the wait report reaches Keras' logs (History and CSVLogger), one value per epoch
    assert len(hist["data_wait"]) == len(hist["input_img_s"]) == 2
    assert all(0.0 <= w <= 1.0 for w in hist["data_wait"])
    assert all(r > 0 for r in hist["input_img_s"])
    assert {"data_wait", "input_img_s"} <= set(out["csv_header"])
    assert out["outside_s"] > 0 and out["train_s"] > 0  # validation is not training time
    assert out["kept_train"] == 0 and out["kept_val"] == 0  # no slot replaced


RESUME_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import keras, numpy as np, stoker

    KW = dict(batch_size=4, image_size=16, workers=2, seed=3)

    def model():
        m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
        m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    def main(folder, ckpt):
        with stoker.Loader(folder, **KW) as first:  # trains 7 batches, saves every 3
            cb = first.keras_checkpoint(ckpt, save_freq=3)
            model().fit(first.keras(), epochs=1, steps_per_epoch=7, callbacks=[cb], verbose=0)
            pulled = first.state_dict()
        with stoker.Loader(folder, **KW) as again:  # the restarted job
            cb = again.keras_checkpoint(ckpt)
            restored = again.state_dict()
            got = again.keras()[0]
        with stoker.Loader(folder, **KW) as plain:  # an uninterrupted run, for reference
            want = [b for _, b in zip(range(7), plain.stream())][-1]
        print("RESULT " + json.dumps({
            "restored": cb.restored, "saved": json.load(open(ckpt)), "state": restored,
            "pulled": pulled, "same": bool(np.array_equal(got[0], want[0])
                                           and np.array_equal(got[1], want[1]))}))

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2])
    """
)


@pytest.mark.needs("keras")
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_checkpoint_callback_resumes_at_the_trained_batch(image_folder, tmp_path) -> None:
    script = tmp_path / "resume_script.py"
    script.write_text(RESUME_SCRIPT)
    ckpt = str(tmp_path / "ckpt" / "loader.json")
    out, _ = script_result(
        script, str(image_folder), ckpt, timeout=210, KERAS_BACKEND="torch", CUDA_VISIBLE_DEVICES=""
    )
    assert out["restored"] is True
    assert (out["saved"]["epoch"], out["saved"]["position"]) == (0, 6)  # saved after 3 and 6
    assert out["state"] == out["saved"]
    assert out["same"]  # the first batch after the restart is batch 7 of an uninterrupted run
