"""The pool's zygote: one start-up process loads the workers' payload once and forks every
worker; a module that leaves a thread running gets fresh interpreters instead."""

from __future__ import annotations

import os
import sys

import numpy as np
import psutil
import pytest

import stoker

# A dataset module that logs every process that imports it; THREAD starts a thread at import
# that stays (a module that leaves one running, as some libraries' imports do).
MODULE = """
import os, threading
import numpy as np
with open({log!r}, "a") as f:
    f.write(f"{{os.getpid()}}\\n")
if {thread}:
    threading.Thread(target=threading.Event().wait, daemon=True).start()
class Logged:
    def __len__(self):
        return 24
    def __getitem__(self, i):
        return {{"x": np.full(3, i, np.float32), "pid": np.int64(os.getpid())}}
"""


def _dataset(tmp_path, monkeypatch, thread: bool):
    log = tmp_path / "imports.log"
    name = f"zygote_mod_{int(thread)}"
    (tmp_path / f"{name}.py").write_text(MODULE.format(log=str(log), thread=thread))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    return module.Logged(), log, name


def _run(dataset) -> tuple[list[np.ndarray], set[int], list, int]:
    """The batches of one epoch made by the started workers, the pids that made them, the
    start reports and the zygote's pid."""
    with stoker.Loader(dataset, batch_size=4, workers=2, shuffle=False) as loader:
        pool = loader._supply.running.pool
        zygote = pool.zygote.popen.pid
        pool.wait_started()  # handshake: the first batch then comes from the workers
        batches = list(loader)
        reports = loader._supply.running.started
        workers = [p.pid for p in pool.procs]
        parents = {psutil.Process(w).ppid() for w in workers}
    assert parents == {zygote}
    return [b["x"] for b in batches], {int(p) for b in batches for p in b["pid"]}, reports, zygote


@pytest.mark.timeout(120)
def test_the_datasets_module_is_imported_once_for_all_workers(tmp_path, monkeypatch):
    dataset, log, name = _dataset(tmp_path, monkeypatch, thread=False)
    xs, pids, reports, zygote = _run(dataset)
    imports = [int(line) for line in log.read_text().split()]
    assert imports == [os.getpid(), zygote]  # this process, then the zygote: no worker
    assert os.getpid() not in pids and zygote not in pids and len(pids) == 2
    assert all(r.forked for r in reports)
    assert np.concatenate(xs)[:, 0].tolist() == list(range(24))
    sys.modules.pop(name, None)


@pytest.mark.timeout(120)
def test_a_module_that_leaves_a_thread_running_gets_fresh_workers(tmp_path, monkeypatch):
    dataset, log, name = _dataset(tmp_path, monkeypatch, thread=True)
    xs, pids, reports, zygote = _run(dataset)
    imports = [int(line) for line in log.read_text().split()]
    assert imports[:2] == [os.getpid(), zygote] and len(imports) == 4  # each worker its own
    assert set(imports[2:]) == pids  # the workers that imported it are the ones that ran
    assert not any(r.forked for r in reports)
    assert np.concatenate(xs)[:, 0].tolist() == list(range(24))
    sys.modules.pop(name, None)


@pytest.mark.timeout(60)
def test_pools_left_to_their_libraries_start_fresh_workers():
    images = np.zeros((8, 8, 8, 3), np.uint8)
    with stoker.Loader(images, batch_size=4, image_size=8, workers=2, worker_threads=None) as ld:
        next(iter(ld))
        assert ld._supply.running.pool.zygote is None
        assert {psutil.Process(p.pid).ppid() for p in ld._supply.running.pool.procs} == {
            os.getpid()
        }
