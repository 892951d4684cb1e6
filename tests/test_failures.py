"""Failures: worker exceptions, killed and hung workers, Ctrl-C, a killed parent, bad files."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import helpers
import stoker
from stoker.errors import RemoteTraceback, TooManyErrors, WorkerDied, WorkerHung

SRC = str(Path(__file__).resolve().parents[1] / "src")


def marked_loader(augment, n=40, marked=17, **kw):
    images = helpers.make_marked_array(n=n, marked=marked)
    opts = dict(batch_size=4, image_size=24, shuffle=False, workers=2, augment=augment)
    return stoker.Loader(images, labels=np.arange(len(images)), **{**opts, **kw})


@pytest.mark.timeout(60)
def test_worker_exception_is_reraised_as_the_same_type_with_its_traceback_and_sample():
    with marked_loader(helpers.fail_on_mark) as loader:
        with pytest.raises(ValueError, match="poisoned sample") as info:
            list(loader)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "fail_on_mark" in str(info.value.__cause__)
    assert any("array[17]" in note and "worker" in note for note in info.value.__notes__)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "augment,how",
    [
        (helpers.kill_on_mark, "SIGKILL"),
        (helpers.exit_on_mark, "exited with code 3"),
        (helpers.segfault_on_mark, "SIGSEGV"),
    ],
)
def test_dead_worker_is_reported_quickly_naming_worker_and_sample(augment, how):
    # timeout=600 s, ten times the test's own limit: passing proves the death was noticed by
    # the liveness check, not by waiting for a batch (no wall-clock bound on a busy machine)
    with marked_loader(augment, n=200, marked=199, timeout=600.0) as loader:
        it = iter(loader)
        next(it)  # workers are up; the poisoned sample is in the last batch
        with pytest.raises(WorkerDied, match=how) as info:
            list(it)
    assert "array[199]" in str(info.value) and "worker" in str(info.value)


@pytest.mark.timeout(60)
def test_a_loader_works_again_after_a_worker_error():
    with marked_loader(helpers.fail_on_mark, shuffle=True, seed=3) as loader:
        with pytest.raises(ValueError):
            list(loader)
        with pytest.raises(ValueError):  # the same sample fails again, after a clean restart
            list(loader)


@pytest.mark.timeout(60)
def test_hung_transform_times_out_and_close_is_bounded():
    with marked_loader(helpers.hang_on_mark, timeout=2.0) as loader:
        with pytest.raises(WorkerHung, match="array\\[17\\]"):
            list(loader)
    loader = marked_loader(helpers.hang_on_mark, timeout=600.0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    pids = [proc.pid for proc in loader._supply.running.pool.procs]
    time.sleep(0.5)  # a worker is now stuck in batch 4
    loader.close()  # bounded by the test's limit: it must not wait for the stuck batch
    assert not [
        p
        for p in pids
        if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
    ]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "fn,error,says",
    [
        (helpers.hang_in_batch_transform, WorkerHung, "still in batch_transform, on batch 2"),
        (helpers.exit_in_batch_transform, WorkerDied, "exited with code 3 while running batch_t"),
    ],
)
def test_a_batch_transform_that_hangs_or_exits_is_blamed_not_a_sample_file(
    image_folder, fn, error, says
):
    """The samples of the batch all loaded: the message names the batch_transform, not the
    batch's last file ("worker 0 is still on .../0053.jpg")."""
    timeout = 2.0 if error is WorkerHung else 600.0  # a death is seen by the liveness check
    opts = dict(batch_size=4, image_size=24, shuffle=False, workers=1, augment=None)
    with stoker.Loader(image_folder, batch_transform=fn, timeout=timeout, **opts) as loader:
        it = iter(loader)
        next(it), next(it)  # the worker is up; the function stops at the third batch
        with pytest.raises(error) as info:
            next(it)
    text = str(info.value)
    assert says in text and ".jpg" not in text, text


@pytest.mark.timeout(60)
def test_bad_user_transform_output_is_named():
    with marked_loader(helpers.bad_return) as loader:
        with pytest.raises(TypeError, match="bad_return"):
            next(iter(loader))


# ---------------------------------------------------------------- bad data


def folder_with(tmp_path, image_folder, bad_files):
    root = tmp_path / "data"
    (root / "a").mkdir(parents=True)
    for i, f in enumerate(sorted(image_folder.glob("class_000/*.jpg"))[:8]):
        (root / "a" / f"good{i}.jpg").write_bytes(f.read_bytes())
    for name, path in bad_files.items():
        (root / "a" / f"{name}.jpg").write_bytes(Path(path).read_bytes())
    return root


@pytest.mark.timeout(60)
def test_bad_files_are_replaced_named_and_counted(tmp_path, image_folder, corrupt_files):
    bad = {k: v for k, v in corrupt_files.items() if k.startswith("bad_")}
    root = folder_with(tmp_path, image_folder, bad)
    (root / "a" / "gone.jpg").symlink_to(root / "missing.jpg")
    runs = []
    for workers in (0, 2):
        with pytest.warns(stoker.StokerWarning, match="skipped"):
            with stoker.Loader(
                root, batch_size=3, image_size=16, workers=workers, max_errors=10, drop_last=False
            ) as loader:
                runs.append([x.copy() for x, _ in loader])
                report = loader.stats()
        assert report.images == 8 + len(bad) + 1
        named = {Path(n).stem for n, _ in report.bad_files}
        assert named == set(bad) | {"gone"} or named == (set(bad) | {"gone"}) - {"bad_truncated"}
    assert all(np.array_equal(a, b) for a, b in zip(*runs, strict=True))


@pytest.mark.timeout(60)
def test_odd_but_valid_files_decode(tmp_path, image_folder, corrupt_files):
    odd = {k: v for k, v in corrupt_files.items() if k.startswith("odd_")}
    root = folder_with(tmp_path, image_folder, odd)
    with stoker.Loader(
        root, batch_size=2, image_size=16, workers=2, max_errors=0, augment="eval"
    ) as loader:
        list(loader)
        assert loader.stats().skipped == 0


@pytest.mark.timeout(60)
def test_past_the_budget_a_clear_error_lists_the_files(tmp_path, image_folder, corrupt_files):
    bad = {k: v for k, v in corrupt_files.items() if k in ("bad_zero_bytes", "bad_text")}
    root = folder_with(tmp_path, image_folder, bad)
    with stoker.Loader(root, batch_size=10, image_size=16, workers=2, max_errors=1) as loader:
        with pytest.warns(stoker.StokerWarning), pytest.raises(TooManyErrors) as info:
            list(loader)
    assert "bad_zero_bytes.jpg" in str(info.value) and "bad_text.jpg" in str(info.value)


# ---------------------------------------------------------------- whole processes

SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    sys.path.insert(0, {src!r}); sys.path.insert(0, {tests!r})
    import numpy as np, stoker, helpers
    if __name__ == "__main__":
        # as in a terminal: Ctrl-C raises KeyboardInterrupt (a parent that ignores SIGINT,
        # e.g. a shell's background job, hands its children SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        images = helpers.make_marked_array(n=400, marked=399)
        with stoker.Loader(images, labels=np.arange(400), batch_size=4, image_size=24,
                           workers=2, augment=helpers.hang_on_mark, shuffle=False) as loader:
            for i, _ in enumerate(loader.stream()):
                if i == 3:
                    print("READY", flush=True)
                time.sleep(0.05)
    """
)


def start_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(src=SRC, tests=str(Path(__file__).parent)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "READY"
    kids = psutil.Process(proc.pid).children(recursive=True)
    return proc, kids


def segments_of(pid):
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker_{pid}_")]


def wait_gone(pid, kids, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
        if not alive and not segments_of(pid):
            return []
        time.sleep(0.1)
    return alive + segments_of(pid)


@pytest.mark.timeout(60)
def test_ctrl_c_ends_workers_and_unlinks_segments(tmp_path):
    proc, kids = start_script(tmp_path)
    assert segments_of(proc.pid) and len(kids) >= 2
    proc.send_signal(signal.SIGINT)
    proc.wait(20)
    assert wait_gone(proc.pid, kids) == []


@pytest.mark.timeout(60)
def test_killed_parent_takes_its_workers_and_segments_with_it(tmp_path):
    proc, kids = start_script(tmp_path)
    proc.kill()
    proc.wait(10)
    assert wait_gone(proc.pid, kids) == []


@pytest.mark.timeout(60)
def test_import_stoker_imports_no_ml_framework():
    code = (
        f"import sys; sys.path.insert(0, {SRC!r}); import stoker; "
        "bad = [m for m in ('torch', 'tensorflow', 'jax', 'keras', 'ray') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
