"""Start-up of ``Loader(dataset)``: the workers are launched when the Loader is made (so their
imports overlap the caller's own set-up), a Loader closed or dropped before its first batch
leaves nothing behind, and ``stats()`` names the true cause of a slow start."""

from __future__ import annotations

import gc
import sys

import numpy as np
import psutil
import pytest

import stoker
from stoker.workers.launch import BOOT


class Squares:
    """A small per-sample dataset."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": np.full((4,), i, np.float32), "label": np.int64(i)}


def _workers() -> list[psutil.Process]:
    kids = psutil.Process().children()
    return [k for k in kids if BOOT in k.cmdline() and k.is_running()]


@pytest.mark.timeout(120)
def test_a_datasets_workers_are_launched_by_the_constructor_before_any_batch():
    before = {p.pid for p in _workers()}
    with stoker.Loader(Squares(), batch_size=4, workers=2, shuffle=False) as loader:
        # the pool's own processes, not a command-line match (a child just forked still shows
        # this process's command line until it execs)
        launched = [p.pid for p in loader._run.pool.procs]
        children = {k.pid for k in psutil.Process().children()}
        assert len(launched) == 2 and set(launched) <= children
        batch = next(iter(loader))
        assert batch["label"].tolist() == [0, 1, 2, 3]
        assert {p.pid for p in _workers()} - before == set(launched)  # none more at the batch
        assert "from Loader(); the first batch waited" in loader.stats().startup


@pytest.mark.timeout(120)
def test_a_dataset_loader_closed_or_dropped_before_its_first_batch_leaves_nothing():
    before = {p.pid for p in _workers()}
    loader = stoker.Loader(Squares(), batch_size=4, workers=2)
    loader.close()
    loader = stoker.Loader(Squares(), batch_size=4, workers=2)
    del loader
    gc.collect()
    assert {p.pid for p in _workers()} - before == set()
    # no_leaks (conftest) checks that no segment is left either


@pytest.mark.timeout(120)
def test_image_sources_still_start_their_workers_at_the_first_batch(image_folder):
    before = {p.pid for p in _workers()}
    with stoker.Loader(image_folder, batch_size=4, image_size=16, workers=2) as loader:
        assert {p.pid for p in _workers()} - before == set()
        next(iter(loader))


@pytest.mark.timeout(120)
def test_stats_names_the_datasets_modules_as_the_cause_not_an_augment(tmp_path, monkeypatch):
    (tmp_path / "slow_dataset_mod.py").write_text(
        "import time\nimport numpy as np\ntime.sleep(2.5)  # a module slow to import\n"
        "class Slow:\n    def __len__(self):\n        return 8\n"
        "    def __getitem__(self, i):\n        return {'x': np.zeros(2, np.float32)}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_dataset_mod  # noqa: E402 - imported here, by the test, from tmp_path

    with stoker.Loader(slow_dataset_mod.Slow(), batch_size=4, workers=2) as loader:
        next(iter(loader))
        report = loader.stats()
    assert report.startup_s >= 2.5  # the sleep is a floor, not a bound on the machine
    assert "importing the dataset's modules (slow_dataset_mod) in each worker" in report.startup
    assert "augment" not in report.startup
    sys.modules.pop("slow_dataset_mod", None)
