"""The user's own ways of running, each with real worker processes: a top-level script with no
``__main__`` guard and ``import keras`` at the top, ``python - < script``, ``python -c``,
``python -i`` driven through stdin, and a Jupyter notebook with a transform defined in a cell.

In each, a callable defined by the user (in ``__main__``, a cell, a lambda) runs in the
workers, and the workers neither re-run the user's code nor import what it imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")
LIMIT_S = 240  # a fresh interpreter importing keras + tensorflow on a loaded 2-core machine


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
        **extra,
    }


def _python(
    args: list[str], cwd: Path, timeout: float, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess:
    """A fresh interpreter run with ``args`` in ``cwd`` (``stdin`` fed to it, ``env`` added to
    _env()), its output captured as text."""
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=_env(**env),
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


# The README's Keras example as a user saves it: no guard, `import keras` first. The extra
# loader's transform, defined in this script, reports whether keras is loaded where it runs.
README_SCRIPT = """\
import json, os, sys
import keras
import stoker

print("SCRIPT START", flush=True)

train = stoker.Loader({train!r}, batch_size=6, image_size=32, augment="train", workers=2)
val = stoker.Loader({val!r}, batch_size=6, image_size=32, augment="eval", shuffle=False,
                    workers=2)

model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Rescaling(1 / 255),
                          keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(train.keras(), validation_data=val.keras(), epochs=1, verbose=0)
print(train.stats())

def keras_here(image, rng):
    image = image.copy()
    image[:, :] = 200 if "keras" in sys.modules else 100
    return image

probe = stoker.Loader({train!r}, batch_size=6, image_size=8, augment=keras_here, workers=2)
x, _ = next(iter(probe))
print("RESULT " + json.dumps({{
    "loss": [float(v) for v in history.history["loss"]],
    "val_loss": [float(v) for v in history.history["val_loss"]],
    "workers": [train.stats().workers, val.stats().workers, probe.stats().workers],
    "keras_in_workers": sorted(set(x.ravel().tolist())),
}}))
"""


@pytest.mark.needs("keras")
@pytest.mark.slow
@pytest.mark.timeout(LIMIT_S + 30)
def test_readme_keras_script_without_a_guard_runs_as_python_train_py(image_folder, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(README_SCRIPT.format(train=str(image_folder), val=str(image_folder)))
    proc = _python([str(script)], tmp_path, LIMIT_S)
    out = _result(proc)
    assert proc.stdout.count("SCRIPT START") == 1  # the workers never ran the script
    assert len(out["loss"]) == 1 and len(out["val_loss"]) == 1
    assert out["workers"] == [2, 2, 2]
    assert out["keras_in_workers"] == [100]  # the transform ran where keras was not imported
    assert "workers started in" in proc.stdout


# The seed's own source: 20,000 in-memory images and their labels, unguarded, read from stdin.
MEMORY_SCRIPT = """\
import json
import keras
import numpy as np
import stoker

rng = np.random.default_rng(0)
train_image = rng.integers(0, 255, (20_000, 28, 28, 3), dtype=np.uint8)
train_gt = rng.integers(0, 10, 20_000)
train = stoker.Loader(train_image, labels=train_gt, image_size=28, workers=2)
model = keras.Sequential([keras.Input((28, 28, 3)), keras.layers.Rescaling(1 / 255),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(train.keras(), epochs=1, steps_per_epoch=8, verbose=0)
print("RESULT " + json.dumps({"loss": history.history["loss"], "workers": train.stats().workers,
                              "batches": train.stats().batches}))
train.close()
"""


@pytest.mark.needs("keras")
@pytest.mark.slow
@pytest.mark.timeout(LIMIT_S + 30)
def test_unguarded_script_over_20000_in_memory_images_trains_from_stdin(tmp_path):
    """This script hung forever: the labels went through the start-up pipe of workers that
    died re-running it."""
    proc = _python(["-"], tmp_path, LIMIT_S, stdin=MEMORY_SCRIPT, KERAS_BACKEND="torch")
    out = _result(proc)
    assert len(out["loss"]) == 1 and out["workers"] == 2 and out["batches"] >= 8


# A lambda typed on the command line; it marks the pixels with whether it ran in a worker.
ONE_LINER = (
    "import json, os, numpy as np, stoker; me = os.getpid(); "
    "mark = lambda im, rng: np.full_like(im, 1 if os.getpid() != me else 2); "
    "loader = stoker.Loader(np.zeros((24, 8, 8, 3), np.uint8), batch_size=4, image_size=8, "
    "workers=2, augment=mark); xs = [x for x, _ in loader]; "
    "print('RESULT ' + json.dumps({'values': sorted({int(v) for x in xs for v in x.ravel()}), "
    "'batches': len(xs), 'workers': loader.stats().workers})); loader.close()"
)


@pytest.mark.timeout(120)
def test_python_dash_c_with_a_lambda(tmp_path):
    proc = _python(["-c", ONE_LINER], tmp_path, 100)
    assert _result(proc) == {"values": [1], "batches": 6, "workers": 2}


SESSION = textwrap.dedent(
    """\
    import json, os, numpy as np, stoker
    me = os.getpid()
    def mark(image, rng):
        return np.full_like(image, 1 if os.getpid() != me else 2)

    images = np.zeros((24, 8, 8, 3), np.uint8)
    loader = stoker.Loader(images, batch_size=4, image_size=8, workers=2, augment=mark)
    xs = [x for x, _ in loader]
    values = sorted({int(v) for x in xs for v in x.ravel()})
    out = {'values': values, 'batches': len(xs), 'workers': loader.stats().workers}
    print('RESULT ' + json.dumps(out))
    loader.close()
    """
)


@pytest.mark.timeout(120)
def test_interactive_python_session_through_stdin(tmp_path):
    proc = _python(["-i"], tmp_path, 100, stdin=SESSION)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert _result(proc) == {"values": [1], "batches": 6, "workers": 2}


NOTEBOOK_CELLS = [
    "import json, os, sys\nimport numpy as np\nimport stoker\nme = os.getpid()",
    # a transform defined in a cell: it lives in the kernel's __main__, so it travels by value
    "def mark(image, rng):\n    return np.full_like(image, 1 if os.getpid() != me else 2)",
    "loader = stoker.Loader({folder!r}, batch_size=6, image_size=24, augment=mark, workers=2)\n"
    "got = [x for x, _ in loader]",
    "print('RESULT ' + json.dumps({{\n"
    "    'batches': len(got), 'workers': loader.stats().workers,\n"
    "    'values': sorted({{int(v) for x in got for v in x.ravel()}})}}))\n"
    "loader.close()",
]


@pytest.mark.timeout(180)
def test_jupyter_notebook_with_a_transform_defined_in_a_cell(image_folder, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(c.format(folder=str(image_folder))) for c in NOTEBOOK_CELLS
    ]
    client = nbclient.NotebookClient(
        nb, timeout=150, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    line = next(ln for ln in text.splitlines() if ln.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    assert out == {"batches": 6, "workers": 2, "values": [1]}


@pytest.mark.timeout(150)
def test_convert_with_worker_processes_from_python_dash_c(image_folder, tmp_path):
    code = (
        "import json; from stoker.cli.convert import convert; "
        f"m = convert({str(image_folder)!r}, 'out', workers=2, shard_bytes=40_000, "
        "progress=False); "
        "print('RESULT ' + json.dumps({'rows': m['rows'], 'shards': len(m['shards'])}))"
    )
    proc = _python(["-c", code], tmp_path, 120)
    out = _result(proc)
    assert out["rows"] == 36 and out["shards"] >= 2  # several shards, so both workers wrote
