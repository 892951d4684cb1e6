"""Thread pools inside worker processes: one thread per pool by default (torch intra/inter-op,
OpenMP/BLAS, OpenCV, TensorFlow, XLA), ``worker_threads=`` to change it, the trainer's own
process untouched. This module must not import torch at the top: the augments below import it
lazily inside the worker, as user code does, so the import hook is what is tested."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker
from stoker.errors import ConfigError
from stoker.importhook import AfterImport, after_import
from stoker.workers import threads as threads_mod
from stoker.workers.jobs import map_jobs

VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)


def pool_sizes() -> dict:
    """What this process's pools are sized to, importing torch (and numpy's BLAS) here."""
    import cv2
    import threadpoolctl
    import torch

    np.ones((64, 64)) @ np.ones((64, 64))  # numpy's BLAS loaded and used
    torch.ones(8) + 1
    return {
        "torch": torch.get_num_threads(),
        "interop": torch.get_num_interop_threads(),
        "cv2": cv2.getNumThreads(),
        "pools": sorted({p["num_threads"] for p in threadpoolctl.threadpool_info()}),
        "apis": sorted({p["user_api"] for p in threadpoolctl.threadpool_info()}),
        "env": {name: os.environ.get(name) for name in VARS},
        "xla": os.environ.get("XLA_FLAGS"),
        "pid": os.getpid(),
    }


class Report:
    """An augment that writes, once per worker, the sizes of its thread pools to ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = str(folder)

    def __call__(self, image, rng):
        out = Path(self.folder) / f"{os.getpid()}.json"
        if not out.exists():
            out.write_text(json.dumps(pool_sizes()))
        return image


def reports(tmp_path: Path, **kwargs) -> list[dict]:
    images = np.zeros((16, 8, 8, 3), np.uint8)
    with stoker.Loader(
        images,
        labels=np.arange(16),
        batch_size=4,
        image_size=8,
        workers=2,
        shuffle=False,
        augment=Report(tmp_path),
        **kwargs,
    ) as loader:
        for _ in loader:
            pass
        text = str(loader.stats())
    found = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert found, "no worker reported"
    return [dict(r, stats=text) for r in found]


@pytest.mark.timeout(180)
def test_every_pool_in_a_worker_has_one_thread_and_the_trainer_is_untouched(tmp_path):
    env_before = dict(os.environ)
    for r in reports(tmp_path):
        assert r["pid"] != os.getpid()
        assert (r["torch"], r["interop"], r["cv2"]) == (1, 1, 1)
        assert "openmp" in r["apis"] and "blas" in r["apis"]  # torch's OpenMP, numpy's BLAS
        assert r["pools"] == [1]
        assert set(r["env"].values()) == {"1"}
        assert "--xla_cpu_multi_thread_eigen=false" in r["xla"]
        assert "worker threads: 1 per pool" in r["stats"]
    assert dict(os.environ) == env_before


@pytest.mark.timeout(180)
def test_worker_threads_asks_for_more_threads_per_pool(tmp_path):
    for r in reports(tmp_path, worker_threads=2):
        assert (r["torch"], r["interop"], r["cv2"]) == (2, 2, 2)
        assert r["pools"] == [2]
        assert set(r["env"].values()) == {"2"}
        assert "worker threads: 2 per pool" in r["stats"]


@pytest.mark.timeout(180)
def test_worker_threads_none_leaves_the_environment_as_the_trainer_has_it(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    for r in reports(tmp_path, worker_threads=None):
        assert r["env"]["OMP_NUM_THREADS"] == "3" and r["env"]["MKL_NUM_THREADS"] is None
        assert r["xla"] == "--xla_force_host_platform_device_count=2"
        assert "left to each library (worker_threads=None)" in r["stats"]


@pytest.mark.timeout(180)
def test_the_users_xla_flags_are_kept_beside_the_single_thread_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    (r, *_) = reports(tmp_path)
    assert r["xla"].startswith("--xla_force_host_platform_device_count=2 ")
    assert r["xla"].endswith(threads_mod.XLA_ONE_THREAD)


def _job_sizes(job):
    return pool_sizes()


@pytest.mark.timeout(120)
def test_job_processes_have_one_thread_per_pool():
    ((_, r),) = list(map_jobs(_job_sizes, [0], 1))
    assert (r["torch"], r["interop"], r["cv2"], r["pools"]) == (1, 1, 1, [1])


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1"])
def test_worker_threads_must_be_a_positive_int_or_none(value):
    with pytest.raises(ConfigError, match="worker_threads="):
        stoker.Loader(np.zeros((4, 8, 8, 3), np.uint8), worker_threads=value)


def test_the_hook_sizes_a_module_right_after_its_import_and_then_leaves(tmp_path, monkeypatch):
    (tmp_path / "fake_pool_lib.py").write_text("size = None\nimported_with = size\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def setter(module):
        seen.append(module.imported_with)
        module.size = 1

    # without a hook an earlier test left waiting (seeding's for torch, after a workers=0 run
    # of a user augment in this process): this one's must be the only watch, so it leaves
    monkeypatch.setattr(
        sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, AfterImport)]
    )
    after_import("fake_pool_lib", setter)
    hook = next(f for f in sys.meta_path if isinstance(f, AfterImport))
    import fake_pool_lib  # noqa: PLC0415

    assert fake_pool_lib.size == 1 and seen == [None]
    assert hook not in sys.meta_path
    assert type(fake_pool_lib.__loader__).__name__ == "SourceFileLoader"
    monkeypatch.delitem(sys.modules, "fake_pool_lib")
