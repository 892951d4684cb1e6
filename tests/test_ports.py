"""Three well-known training scripts, ported to stoker without workarounds, each asserting the
exact targets come through: the keras.io "image classification from scratch" script
(validation_split=0.2, subset="both", label_mode="categorical", color_mode="grayscale"), a
PyTorch ImageNet-style loop (ImageFolder, train/eval transforms, normalisation on the device)
and a Flax regression loop with (N, 4) float targets (bit for bit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stoker

KERAS_PORT = textwrap.dedent(
    """
    import json, sys
    import keras, numpy as np, stoker

    def main(folder):
        train, val = stoker.Loader(
            folder, validation_split=0.2, subset="both", seed=1337, image_size=(24, 24),
            batch_size=8, label_mode="categorical", color_mode="grayscale", augment=None,
            workers=2)
        with train, val:
            inputs = keras.Input((24, 24, 1))
            x = keras.layers.Rescaling(1.0 / 255)(inputs)
            x = keras.layers.Conv2D(4, 3, activation="relu")(x)
            x = keras.layers.GlobalAveragePooling2D()(x)
            outputs = keras.layers.Dense(len(train.class_names), activation="softmax")(x)
            model = keras.Model(inputs, outputs)
            model.compile(optimizer=keras.optimizers.Adam(1e-3),
                          loss="categorical_crossentropy", metrics=["accuracy"])
            hist = model.fit(train.keras(), epochs=2, validation_data=val.keras(), verbose=0)
            shapes = [list(a.shape) for a in train.keras()[0]]
            dtypes = [str(a.dtype) for a in train.keras()[0]]
            train_paths, val_paths = train.file_paths, val.file_paths
            names = train.class_names
        check = stoker.Loader(folder, validation_split=0.2, subset="training", seed=1337,
                              image_size=(24, 24), batch_size=8, label_mode="categorical",
                              color_mode="grayscale", augment=None, workers=0,
                              batch=("label", "path"))
        with check:
            exact = all(
                np.array_equal(y, np.eye(len(names), dtype=np.float32)[
                    [names.index(p.split("/")[-2]) for p in paths]])
                for y, paths in check)
        print("RESULT " + json.dumps({
            "history": hist.history, "shapes": shapes, "dtypes": dtypes, "names": names,
            "train": len(train_paths), "val": len(val_paths),
            "overlap": len(set(train_paths) & set(val_paths)), "exact": bool(exact)}))

    if __name__ == "__main__":
        main(sys.argv[1])
    """
)


@pytest.mark.needs("keras")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_keras_image_classification_from_scratch_port(image_folder, tmp_path):
    script = tmp_path / "keras_port.py"
    script.write_text(KERAS_PORT)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(script), str(image_folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert out["names"] == ["class_000", "class_001", "class_002"]
    assert (out["train"], out["val"], out["overlap"]) == (29, 7, 0)  # int(0.2 * 36) = 7
    assert out["shapes"] == [[8, 24, 24, 1], [8, 3]]
    assert out["dtypes"] == ["uint8", "float32"]
    assert len(out["history"]["val_loss"]) == 2 and all(np.isfinite(out["history"]["loss"]))
    assert out["exact"]


@pytest.mark.timeout(240)
def test_pytorch_imagenet_style_loop(image_folder):
    import torch
    from torch import nn

    torch.manual_seed(0)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    common = dict(image_size=32, batch_size=6, workers=2, batch=("image", "label", "path"))
    train = stoker.Loader(image_folder, augment="train", shuffle=True, **common)
    val = stoker.Loader(image_folder, augment="eval", shuffle=False, **common)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 3),
    )
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    classes = train.class_names
    with train, val:
        for _epoch in range(2):
            model.train()
            for images, target, paths in train.torch(
                channels_last=False, dtype=torch.float32, mean=mean, std=std
            ):
                assert images.shape == (6, 3, 32, 32) and target.dtype == torch.int64
                assert target.tolist() == [classes.index(p.split("/")[-2]) for p in paths]
                loss = criterion(model(images), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            model.eval()
            correct = seen = 0
            with torch.no_grad():
                for images, target, paths in val.torch(
                    channels_last=False, dtype=torch.float32, mean=mean, std=std
                ):
                    assert target.tolist() == [classes.index(p.split("/")[-2]) for p in paths]
                    correct += int((model(images).argmax(1) == target).sum())
                    seen += len(target)
            assert seen == 36 and 0 <= correct <= 36
        assert torch.isfinite(loss)


@pytest.mark.timeout(240)
def test_flax_regression_loop_with_float_targets_bit_for_bit():
    import jax
    import jax.numpy as jnp
    import optax
    from flax import linen as nn

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8)
    boxes = rng.random((40, 4), dtype=np.float32) * 16  # (N, 4) float targets

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(4, (3, 3))(x.astype(jnp.float32) / 255)
            return nn.Dense(4)(x.mean(axis=(1, 2)))

    model = Net()
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3), jnp.uint8))
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    seen = []
    with stoker.Loader(
        images, labels=boxes, batch_size=8, seed=1, workers=2, batch=("image", "label", "index")
    ) as loader:
        assert "image_size=(16, 16), augment=None" in repr(loader)  # the arrays as given
        for _ in range(2):
            for x, y, index in loader.jax():
                idx = np.asarray(index)
                assert np.asarray(y).dtype == np.float32
                assert np.asarray(y).tobytes() == boxes[idx].tobytes()  # bit for bit
                assert np.asarray(x).tobytes() == images[idx].tobytes()
                params, opt_state, loss = step(params, opt_state, x, y)
                seen.extend(idx.tolist())
    assert sorted(seen) == sorted(list(range(40)) * 2) and np.isfinite(float(loss))
