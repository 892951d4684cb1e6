"""Start-up of ``Loader(dataset)``: the workers are launched when the Loader is made (so their
imports overlap the caller's own set-up), a Loader closed or dropped before its first batch
leaves nothing behind, and ``stats()`` names the true cause of a slow start."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

import stoker
from stoker.workers.command import BOOT
from stoker.workers.zygote import ZYGOTE_BOOT


class Squares:
    """A small per-sample dataset."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": np.full((4,), i, np.float32), "label": np.int64(i)}


def _workers() -> list[psutil.Process]:
    """Live workers and zygotes among this process's descendants."""
    found = []
    for kid in psutil.Process().children(recursive=True):
        try:
            line = " ".join(kid.cmdline())
            if (BOOT in line or ZYGOTE_BOOT in line) and kid.status() != psutil.STATUS_ZOMBIE:
                found.append(kid)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.mark.timeout(120)
def test_a_datasets_workers_are_launched_by_the_constructor_before_any_batch():
    before = {p.pid for p in _workers()}
    with stoker.Loader(Squares(), batch_size=4, workers=2, shuffle=False) as loader:
        # the pool's own start-up process, not a command-line match (a child just forked
        # still shows this process's command line until it execs)
        zygote = loader._supply.running.pool.zygote.popen.pid
        assert zygote in {k.pid for k in psutil.Process().children()}
        batch = next(iter(loader))
        assert batch["label"].tolist() == [0, 1, 2, 3]
        loader._supply.running.pool.wait_started()
        workers = [p.pid for p in loader._supply.running.pool.procs]
        assert len(set(workers)) == 2 and all(psutil.Process(w).ppid() == zygote for w in workers)
        assert {p.pid for p in _workers()} - before == {zygote, *workers}  # none more
        startup = loader.stats().startup  # made here while they start, or by them once started
        assert "made in this process" in startup or "the first batch waited" in startup


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
        stream = loader.stream()
        while "workers started in" not in loader.stats().startup:  # until they took over
            next(stream)
        report = loader.stats()
    assert report.startup_s >= 2.5  # the sleep is a floor, not a bound on the machine
    assert "importing the dataset's modules (slow_dataset_mod) once, in the start-up" in (
        report.startup
    )
    assert "augment" not in report.startup
    sys.modules.pop("slow_dataset_mod", None)


# A dataset module that, in a worker (never in the test's process), is still importing until
# the test creates FLAG: a worker "slow to import torch" held by a handshake, not a sleep. The
# cap only keeps a broken run from hanging; FAIL makes the import fail once released.
GATED = """
import os, time
import numpy as np
PARENT, FLAG, LOG, FAIL = {parent}, {flag!r}, {log!r}, {fail!r}
if os.getpid() != PARENT:
    cap = time.monotonic() + 30
    while not os.path.exists(FLAG) and time.monotonic() < cap:
        time.sleep(0.02)
    if FAIL:
        raise RuntimeError(FAIL)
class Gated:
    def __len__(self):
        return 24
    def __getitem__(self, i):
        with open(LOG, "a") as f:
            f.write(f"{{i}} {{os.getpid()}}\\n")
        rng = np.random.default_rng(i)
        return {{"x": rng.random(3) + np.random.random(3), "label": np.int64(i % 3)}}
"""


def _gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str = "") -> tuple[Any, Path]:
    """``(Gated(), FLAG)``: the module written and imported here (its workers wait for FLAG)."""
    name = f"gated_mod_{len(fail)}"
    flag, log = tmp_path / "go", tmp_path / "loads.log"
    text = GATED.format(parent=os.getpid(), flag=str(flag), log=str(log), fail=fail)
    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    module = __import__(name)
    return module.Gated(), flag


def _loaders(log: Path) -> dict[int, int]:
    """sample -> the pid that last ran its ``__getitem__``."""
    rows = [line.split() for line in log.read_text().splitlines()]
    return {int(i): int(pid) for i, pid in rows}


def _plain(dataset: Any, batches: int) -> list[dict[str, np.ndarray]]:
    with stoker.Loader(dataset, batch_size=4, workers=0, seed=5) as loader:
        stream = loader.stream()
        return [{k: v.copy() for k, v in next(stream).items()} for _ in range(batches)]


@pytest.mark.timeout(180)
def test_the_first_batches_are_made_here_while_the_workers_start_then_the_workers_take_over(
    tmp_path, monkeypatch
):
    dataset, flag = _gated(tmp_path, monkeypatch)
    log = tmp_path / "loads.log"
    got = []
    with stoker.Loader(dataset, batch_size=4, workers=2, seed=5) as loader:
        stream = loader.stream()
        got.append({k: v.copy() for k, v in next(stream).items()})
        first = _loaders(log)
        assert set(first.values()) == {os.getpid()}  # the workers are still importing
        assert "first batch was made in this process" in loader.stats().startup
        assert "not all started yet" in loader.stats().startup
        flag.touch()
        while "workers started in" not in loader.stats().startup:  # until they took over
            got.append({k: v.copy() for k, v in next(stream).items()})
        mine = len(got)
        for _ in range(8):  # two epochs' worth more, from the workers
            got.append({k: v.copy() for k, v in next(stream).items()})
        startup = loader.stats().startup
        workers = {p.pid for p in loader._supply.running.pool.procs}
    here = "first batch was" if mine == 2 else f"first {mine - 1} batches were"  # the last: ring
    assert f"the {here} made in this process" in startup and "did not wait" in startup
    assert "importing stoker" in startup and "importing the dataset's modules" in startup
    assert set(_loaders(log).values()) & workers  # the later samples ran in the workers
    want = _plain(dataset, len(got))
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(180)
def test_a_worker_that_fails_to_start_while_batches_are_made_here_is_raised(tmp_path, monkeypatch):
    dataset, flag = _gated(tmp_path, monkeypatch, fail="no GPU in a worker")
    with stoker.Loader(dataset, batch_size=4, workers=2) as loader:
        stream = loader.stream()
        next(stream)  # made here: the workers are still importing
        flag.touch()
        with pytest.raises(RuntimeError, match="no GPU in a worker"):
            for _ in stream:
                pass


@pytest.mark.timeout(180)
def test_cuda_transfer_is_picked_again_once_the_workers_took_over(tmp_path, monkeypatch):
    """torch(device="cuda") picks its transfer at the first batch; made here, there is no ring
    to page-lock yet, so it is picked again at the first batch from the ring (zero-copy)."""
    pytest.importorskip("torch")
    from test_cuda_transfer import FakeCuda  # the CUDA boundary faked, the transfer logic real

    dataset, flag = _gated(tmp_path, monkeypatch)
    runtime = FakeCuda()
    with stoker.Loader(dataset, batch_size=4, workers=2, seed=5) as loader:
        view = iter(loader.torch(device="cuda", cuda_runtime=runtime))
        next(view)
        assert "no ring yet" in loader._device_stats().transfer
        flag.touch()
        while not loader._supply.running.pool.poll_started():  # handshake: every worker has started
            time.sleep(0.02)
        rest = list(view)  # the same view: its next batch comes from the ring
        runtime.finish()
        transfer = loader.stats().transfer
    assert "zero-copy" in transfer, transfer
    assert len(rest) == 5  # 24 samples, batches of 4: none lost or repeated at the switch


# A script that ends while its workers are still starting: the workers' start-up process,
# importing the dataset's module, says so (a file) and waits; the script waits for it,
# releases it and ends at once, so the workers go on starting while the process exits.
ENDS_EARLY = """
import os, sys, time
sys.path.insert(0, {folder!r})
os.environ["GATE_PARENT"] = str(os.getpid())
import stoker, gate_mod
loader = stoker.Loader(gate_mod.Gated(), batch_size=4, workers=2)
next(iter(loader))  # made here: the workers are held in their import
cap = time.monotonic() + 60
while not [f for f in os.listdir({folder!r}) if f.startswith("importing")]:
    assert time.monotonic() < cap, "the workers never began importing"
    time.sleep(0.02)
open({flag!r}, "w").close()
print("last line")
"""

GATE = """
import os, time
import numpy as np
if os.environ.get("GATE_PARENT") not in (None, str(os.getpid())):
    open(os.path.join({folder!r}, f"importing_{{os.getpid()}}"), "w").close()
    cap = time.monotonic() + 30
    while not os.path.exists({flag!r}) and time.monotonic() < cap:
        time.sleep(0.01)
class Gated:
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return {{"x": np.full(3, i, np.float32)}}
"""


@pytest.mark.timeout(300)
def test_a_script_that_ends_while_its_workers_start_prints_no_traceback_and_leaves_no_file(
    tmp_path,
):
    for run in range(3):
        folder = tmp_path / f"run{run}"
        folder.mkdir()
        flag = str(folder / "go")
        (folder / "gate_mod.py").write_text(GATE.format(folder=str(folder), flag=flag))
        script = ENDS_EARLY.format(folder=str(folder), flag=flag)
        child = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0 and out.strip() == "last line", err
        assert "Traceback" not in err and "Error" not in err, err
        assert [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker_{child.pid}_")] == []
        for name in os.listdir(folder):  # each worker that began starting is gone, not left
            if name.startswith("importing_"):
                assert not _still_a_worker(int(name.split("_")[1]))


def _still_a_worker(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and BOOT in proc.cmdline()
    except psutil.Error:
        return False
