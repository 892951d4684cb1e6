"""Structured batches: ``batch="dict"``, tuples and dicts of field names, sample weights and
the user's own fields, through numpy and every adapter, and Keras ``fit`` with
``(x, y, sample_weight)``, ``class_weight`` and a two-input model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stoker
from stoker.errors import ConfigError


def _data(n: int = 12):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 8, 6, 3), dtype=np.uint8)
    labels = rng.normal(size=(n, 2)).astype(np.float32)
    meta = rng.normal(size=(n, 5))
    weights = np.linspace(0.5, 2.0, n)
    return images, labels, meta, weights


@pytest.mark.timeout(120)
def test_dict_batch_carries_every_field_exactly():
    images, labels, meta, weights = _data()
    with stoker.Loader(
        images,
        labels=labels,
        sample_weight=weights,
        fields={"meta": meta},
        batch="dict",
        batch_size=4,
        workers=2,
        seed=5,
    ) as loader:
        batches = list(loader)
    assert len(batches) == 3
    for b in batches:
        assert set(b) == {"image", "label", "weight", "meta", "index", "path"}
        i = b["index"]
        assert np.array_equal(b["image"], images[i])
        assert b["label"].dtype == np.float32 and np.array_equal(b["label"], labels[i])
        assert b["meta"].dtype == np.float64 and np.array_equal(b["meta"], meta[i])
        assert b["weight"].dtype == np.float32 and np.allclose(b["weight"], weights[i])
        assert b["path"].tolist() == [f"array[{k}]" for k in i]


@pytest.mark.timeout(60)
def test_tuple_and_nested_forms_and_their_errors():
    images, labels, meta, weights = _data()
    opts = dict(labels=labels, batch_size=4, shuffle=False, workers=0)
    with stoker.Loader(images, sample_weight=weights, **opts) as loader:
        x, y, w = next(iter(loader))  # a sample weight makes the Keras (x, y, sample_weight)
        assert w.tolist() == weights[:4].astype(np.float32).tolist()
    form = ({"pixels": "image", "meta": "meta"}, "label")
    with stoker.Loader(images, fields={"meta": meta}, batch=form, **opts) as loader:
        inputs, y = next(iter(loader))
        assert set(inputs) == {"pixels", "meta"} and inputs["meta"].shape == (4, 5)
    with pytest.raises(ConfigError, match="no field 'nope'"):
        stoker.Loader(images, batch=("image", "nope"), **opts)
    with pytest.raises(ConfigError, match="built-in field"):
        stoker.Loader(images, fields={"label": labels}, **opts)
    with pytest.raises(ConfigError, match="one row per sample"):
        stoker.Loader(images, fields={"meta": meta[:3]}, **opts)
    with pytest.raises(ConfigError, match="finite and >= 0"):
        stoker.Loader(images, sample_weight=-weights, **opts)


@pytest.mark.timeout(240)
def test_adapters_keep_the_structure_and_dtypes():
    import torch

    images, labels, meta, weights = _data()
    form = {"x": "image", "y": "label", "id": "index", "path": "path"}
    with stoker.Loader(
        images, labels=labels, batch=form, batch_size=6, shuffle=False, workers=1
    ) as loader:
        t = next(iter(loader.torch(channels_last=False, dtype=torch.float32)))
        assert t["x"].shape == (6, 3, 8, 6) and t["x"].dtype == torch.float32
        assert t["y"].dtype == torch.float32 and torch.equal(t["y"], torch.from_numpy(labels[:6]))
        assert t["path"].tolist()[:2] == ["array[0]", "array[1]"]
        j = next(iter(loader.jax()))  # an iteration goes on where the last one stopped
        ids = np.asarray(j["id"])
        assert ids.tolist() == list(range(6, 12)) and j["path"][5] == "array[11]"
        assert np.array_equal(np.asarray(j["y"]), labels[ids])
        spec = loader.tf().element_spec
        assert spec["y"].dtype.name == "float32" and spec["path"].dtype.name == "string"
        f = next(iter(loader.tf()))
        ids = f["id"].numpy()
        assert np.array_equal(f["y"].numpy(), labels[ids]) and f["path"].numpy()[0] == (
            f"array[{ids[0]}]".encode()
        )


KERAS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import keras, numpy as np, stoker

    def main():
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (32, 8, 8, 3), dtype=np.uint8)
        ids = (np.arange(32) % 2).astype(np.int64)
        meta = rng.normal(size=(32, 3)).astype(np.float32)
        out = {}
        with stoker.Loader(images, labels=ids, sample_weight=np.arange(32) % 3,
                           batch_size=8, workers=1) as loader:
            m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255),
                                  keras.layers.Flatten(), keras.layers.Dense(2)])
            m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            h = m.fit(loader.keras(), epochs=1, verbose=0)
            out["weighted"] = h.history["loss"]
        with stoker.Loader(images, labels=ids, batch_size=8, workers=1) as loader:
            h = m.fit(loader.keras(), epochs=1, verbose=0, class_weight={0: 1.0, 1: 3.0})
            out["class_weight"] = h.history["loss"]
        form = ({"pixels": "image", "meta": "meta"}, "label")
        with stoker.Loader(images, labels=ids, fields={"meta": meta}, batch=form,
                           batch_size=8, workers=1) as loader:
            a = keras.Input((8, 8, 3), name="pixels")
            b = keras.Input((3,), name="meta")
            z = keras.layers.Concatenate()([keras.layers.Flatten()(a), b])
            two = keras.Model({"pixels": a, "meta": b}, keras.layers.Dense(2)(z))
            two.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            h = two.fit(loader.keras(), epochs=1, verbose=0)
            out["two_inputs"] = h.history["loss"]
        print("RESULT " + json.dumps(out))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.needs("keras")
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_keras_fit_with_sample_weights_class_weight_and_two_inputs(tmp_path):
    script = tmp_path / "keras_batches.py"
    script.write_text(KERAS_SCRIPT)
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    for key in ("weighted", "class_weight", "two_inputs"):
        assert len(out[key]) == 1 and np.isfinite(out[key][0]), key
