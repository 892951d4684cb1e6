"""Worker launch: stoker's own entry point, callables by value, start-up that cannot hang, and
start-up reported in stats()."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

import stoker
from stoker.errors import ConfigError, WorkerDied


class DieOnArrival:
    """An augment whose unpickling ends the worker at once with exit code 3."""

    def __call__(self, image, rng):
        return image

    def __reduce__(self):
        return (os._exit, (3,))


class Heavy:
    """An augment carrying a large table (several MB of arguments)."""

    def __init__(self) -> None:
        self.table = np.arange(2 << 20, dtype=np.int64)

    def __call__(self, image, rng):
        return image


@pytest.mark.timeout(60)
def test_workers_that_die_at_once_with_large_arguments_raise_within_the_timeout():
    """The old launch wrote the pickled arguments into a pipe whose read end it still held:
    a worker that died before reading them left the parent blocked forever."""
    images = np.zeros((20_000, 8, 8, 3), np.uint8)
    with stoker.Loader(
        images,
        labels=np.arange(20_000),
        batch_size=8,
        image_size=8,
        workers=2,
        augment=[DieOnArrival(), Heavy()],
    ) as loader:
        with pytest.raises(WorkerDied, match="exited with code 3 while starting"):
            next(iter(loader))


@pytest.mark.timeout(60)
def test_a_value_that_cannot_be_sent_is_named_with_the_fix(tmp_path):
    log = open(tmp_path / "log.txt", "w")  # noqa: SIM115 - the point is an open file

    def write_and_pass(image, rng):
        log.write("x")
        return image

    lock = threading.Lock()

    class Locked:
        def __init__(self) -> None:
            self.guard = lock

        def __call__(self, image, rng):
            return image

    images = np.zeros((16, 8, 8, 3), np.uint8)
    cases = [(write_and_pass, "closure variable 'log'"), (Locked(), "augment.guard")]
    try:
        for augment, where in cases:
            with stoker.Loader(
                images, batch_size=4, image_size=8, workers=2, augment=augment
            ) as loader:
                with pytest.raises(ConfigError, match="cannot send augment") as info:
                    next(iter(loader))
            assert where in str(info.value) and "workers=0" in str(info.value)
    finally:
        log.close()


@pytest.mark.timeout(60)
def test_a_closure_over_local_data_travels_by_value():
    offset = np.uint8(7)
    seen = {}

    def shift(image, rng):  # a local function: pickled by value with its closure
        return image + offset

    images = np.zeros((12, 8, 8, 3), np.uint8)
    with stoker.Loader(
        images, batch_size=4, image_size=8, workers=2, shuffle=False, augment=shift
    ) as loader:
        for x, _ in loader:
            seen[len(seen)] = x
        report = loader.stats()
    assert report.workers == 2 and len(seen) == 3
    assert all((x == 7).all() for x in seen.values())


def test_forkserver_is_refused_and_says_why(image_folder):
    with pytest.raises(ConfigError, match="only 'spawn'"):
        stoker.Loader(image_folder, start_method="forkserver")


@pytest.mark.timeout(90)
def test_stats_show_start_up_and_why_it_was_slow(tmp_path, monkeypatch):
    (tmp_path / "slow_augment.py").write_text(
        "import time\ntime.sleep(2.5)  # a module that is slow to import\n"
        "def identity(image, rng):\n    return image\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_augment  # noqa: E402 - imported here, by the test, from tmp_path

    images = np.zeros((16, 8, 8, 3), np.uint8)
    with stoker.Loader(
        images, batch_size=4, image_size=8, workers=2, augment=slow_augment.identity
    ) as loader:
        next(iter(loader))
        text = str(loader.stats())
        report = loader.stats()
    assert "workers started in" in text
    assert report.startup_s >= 2.5  # the sleep is a floor, not a bound on the machine
    assert "slow because loading your augment (slow_augment) once, in the start-up process" in (
        report.startup
    )
    sys.modules.pop("slow_augment", None)


@pytest.mark.timeout(60)
def test_start_up_is_reported_with_its_parts(image_folder):
    with stoker.Loader(image_folder, batch_size=6, image_size=16, workers=2) as loader:
        next(iter(loader))
        report = loader.stats()
    assert report.startup.startswith("workers started in") and report.startup_s > 0
    assert "Python " in report.startup and "importing stoker" in report.startup


@pytest.mark.timeout(60)
def test_jobs_run_in_launched_workers_and_report_errors_and_deaths():
    from stoker.workers.jobs import map_jobs

    parent = os.getpid()
    got = dict(map_jobs(lambda job: (job * job, os.getpid() != parent), [1, 2, 3, 4], 2))
    assert got == {0: (1, True), 1: (4, True), 2: (9, True), 3: (16, True)}

    def fail_on_three(job):
        if job == 3:
            raise KeyError("three")
        return job

    with pytest.raises(KeyError, match="three") as info:
        list(map_jobs(fail_on_three, [1, 2, 3], 2))
    assert any("job 2" in note for note in info.value.__notes__)
    with pytest.raises(WorkerDied, match="exited with code 5 during job 0"):
        list(map_jobs(lambda job: os._exit(5), [0], 1))


@pytest.mark.timeout(60)
def test_job_workers_are_registered_with_the_reaper_while_they_run_and_untracked_after():
    from stoker.shm import reaper
    from stoker.workers.jobs import map_jobs

    results = map_jobs(lambda job: os.getpid(), [0, 1], 1)
    _, pid = next(results)
    assert pid in reaper._client.procs  # the reaper kills it if this process dies now
    assert [p for _, p in results] == [pid]
    assert pid not in reaper._client.procs
