"""Resource faults end clean: a full /dev/shm and /tmp never fail a run through the automatic
deepening, the /dev/shm-or-/tmp choice compares what is needed with what each has, and every
message names the true cause and its fix."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

import chaos_env
from stoker.shm import folder as shm_folder
from stoker.shm.folder import pick_folder
from stoker.shm.segments import ShmFullError

MiB = 1 << 20


def _run(code: str, **namespace: object) -> subprocess.CompletedProcess:
    argv = chaos_env.python(textwrap.dedent(code))
    return chaos_env.run_in_namespace(argv, **namespace)  # type: ignore[arg-type]


FILL = """
    def fill(folder):
        with open(os.path.join(folder, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass
"""


@pytest.mark.timeout(180)
def test_deepening_into_a_full_dev_shm_and_tmp_stays_at_its_depth_and_says_why(
    tmp_path, needs_namespace
):
    """/dev/shm and /tmp fill up mid-run; the engine is then asked to deepen (as its measure
    would, called directly so the test does not depend on timing): the run goes on at the
    depth it had, and stats() says why it did not deepen."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    code = (
        FILL
        + """
    import os, tempfile
    import numpy as np, stoker
    images = np.arange(48 * 16 * 16 * 3, dtype=np.uint64).astype(np.uint8).reshape(48, 16, 16, 3)
    with stoker.Loader(images, batch_size=4, workers=2, augment=None, shuffle=False) as loader:
        it = iter(loader)
        first = next(it)[0].copy()
        fill("/dev/shm")
        fill(tempfile.gettempdir())
        engine = loader._supply.running.engine
        before = len(engine.segments)
        engine._deepen(0.5)
        rest = [x.copy() for x, _ in it]
        print("SAME", len(engine.segments) == before, engine.per_worker)
        print("BATCHES", 1 + len(rest), np.array_equal(np.concatenate([first, *rest]), images))
        print("STATS", str(loader.stats()).replace(chr(10), " | "))
    left = [n for d in ("/dev/shm", tempfile.gettempdir()) for n in os.listdir(d)
            if n.startswith("stoker_")]
    print("LEFT", left)
    """
    )
    out = _run(code, shm="64m", tmp=(str(folder), "16m"), timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SAME True 1" in out.stdout and "BATCHES 12 True" in out.stdout, out.stdout
    assert "stays at 1 per worker: a deeper ring would have had batches ready" in out.stdout
    assert "could not be made in /dev/shm" in out.stdout and "LEFT []" in out.stdout


def _rooms(monkeypatch, shm: tuple[int, int], tmp: tuple[int, int]) -> None:
    monkeypatch.setattr(
        shm_folder, "folder_room", lambda f: shm if f == shm_folder.SHM_DIR else tmp
    )


def test_a_ring_that_fits_dev_shm_is_not_sent_to_a_smaller_tmp(monkeypatch, recwarn):
    _rooms(monkeypatch, shm=(40 * MiB, 64 * MiB), tmp=(10 * MiB, 20 * MiB))
    assert pick_folder(30 * MiB) == "/dev/shm"  # fits without the margin, /tmp is smaller
    assert pick_folder(12 * 1024, "the workers' settings") == "/dev/shm"  # tiny: fits well
    assert not recwarn.list
    _rooms(monkeypatch, shm=(40 * MiB, 64 * MiB), tmp=(900 * MiB, 1000 * MiB))
    with pytest.warns(
        UserWarning,
        match=r"/dev/shm has 40.0 MiB free but the batch ring needs "
        r"62.5 MiB \(with room to grow\) and 8.0 MiB is left for other programs; "
        r"using file-backed memory in .* \(900.0 MiB free\)",
    ):
        assert pick_folder(50 * MiB) != "/dev/shm"  # does not fit: /tmp has the room
    _rooms(monkeypatch, shm=(20 * MiB, 64 * MiB), tmp=(30 * MiB, 40 * MiB))
    with pytest.warns(UserWarning):
        assert pick_folder(25 * MiB) != "/dev/shm"  # fits neither with growth: the larger


@pytest.mark.timeout(120)
def test_a_ring_that_fits_a_small_dev_shm_starts_there_beside_a_smaller_tmp(
    tmp_path, needs_namespace
):
    folder = tmp_path / "tmp"
    folder.mkdir()
    code = """
    import numpy as np, stoker
    images = np.zeros((16, 32, 32, 3), np.uint8)
    with stoker.Loader(images, batch_size=4, image_size=1024, workers=2, augment=None) as loader:
        print("BATCHES", sum(1 for _ in loader), loader.stats().memory_folder)
    """  # 4 slots of 12 MiB: 48 MiB fits a 64 MiB /dev/shm, not the 16 MiB /tmp
    out = _run(code, shm="64m", tmp=(str(folder), "16m"), timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "BATCHES 4 /dev/shm" in out.stdout


def test_messages_name_the_folder_and_the_fix_that_applies():
    ring = str(ShmFullError("/dev/shm/stoker_1_x_1_slot0", 5 * MiB))
    assert "lower batch_size or prefetch" in ring and "--shm-size" in ring
    tmp = str(ShmFullError("/tmp/stoker_1_x_1_slot0", 5 * MiB))
    assert "in /tmp:" in tmp and "--shm-size" not in tmp and "TMPDIR" in tmp


@pytest.mark.timeout(180)
def test_kept_batches_filling_shared_memory_say_to_copy_them_not_to_lower_batch_size(
    tmp_path, needs_namespace
):
    code = """
    import numpy as np, stoker
    images = np.zeros((400, 64, 64, 3), np.uint8)
    kept = []
    try:
        with stoker.Loader(images, batch_size=8, image_size=512, workers=1,
                           augment=None) as loader:
            for x, _ in loader:
                kept.append(x)  # each kept batch holds its slot's segment
    except stoker.errors.StokerError as exc:
        print("ERROR", type(exc).__name__, exc)
    """  # a 6 MiB slot; a 64 MiB /dev/shm holds ten
    out = _run(code, shm="64m", tmp=(str(tmp_path), "1m"), timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ERROR ShmFullError" in out.stdout, out.stdout
    assert "keeps the arrays of" in out.stdout and "images.copy()" in out.stdout
    assert "would not help" in out.stdout


@pytest.mark.timeout(120)
def test_ulimit_n_9_is_a_resource_limit_error_naming_the_limit_and_leaves_nothing():
    import resource
    import sys

    code = textwrap.dedent("""
    import os, numpy as np, stoker
    images = np.zeros((16, 16, 16, 3), np.uint8)
    try:
        with stoker.Loader(images, batch_size=4, workers=2, augment=None) as loader:
            next(iter(loader))
    except stoker.ResourceLimitError as exc:
        print("LIMIT", exc)
    left = [n for n in os.listdir("/dev/shm") if n.startswith(f"stoker_{os.getpid()}_")]
    print("LEFT", left)
    """)

    def nine_files():
        resource.setrlimit(resource.RLIMIT_NOFILE, (9, 9))

    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=100,
        env=chaos_env.env(),
        preexec_fn=nine_files,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "LIMIT cannot start worker process" in out.stdout, out.stdout + out.stderr[-2000:]
    assert "ulimit -n, is 9" in out.stdout and "LEFT []" in out.stdout


@pytest.mark.parametrize(
    "code,says",
    [
        ("EMFILE", "ulimit -n"),
        ("ENFILE", "fs.file-max"),
        ("EAGAIN", "ulimit -u"),
        ("ENOMEM", "out of memory"),
        ("ENOSPC", "no space left"),
    ],
)
def test_each_os_limit_is_named_with_its_fix(code, says):
    import errno

    from stoker.errors import ResourceLimitError, limit_error

    exc = limit_error(OSError(getattr(errno, code), "raw"), "start worker process 0")
    assert isinstance(exc, ResourceLimitError) and says in str(exc)
    assert str(exc).startswith("cannot start worker process 0: ")
    other = OSError(errno.EACCES, "raw")
    assert limit_error(other, "x") is other


TRAINER = """
import sys, time
import numpy as np, stoker
from stoker.shm import reaper
images = np.zeros((64, 32, 32, 3), np.uint8)
loader = stoker.Loader(images, batch_size=4, workers=2, augment=None)
it = iter(loader)
next(it)
pids = [p.pid for p in loader._supply.running.pool.procs]
print("READY", reaper.reaper_pid(), *pids, flush=True)
time.sleep(600)
"""

# what both orchestrators start with: a process is gone, wait for a test, the segments
WATCH = """
import os, signal, subprocess, sys, time

def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True

def until(test, limit):
    deadline = time.monotonic() + limit
    while not test() and time.monotonic() < deadline:
        time.sleep(0.02)
    return test()

def segments():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("stoker_"))
"""

ORCHESTRATE = """
trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
_, reaper_pid, *workers = trainer.stdout.readline().split()
print("HAD", len(segments()) > 0)
os.kill(int(reaper_pid), signal.SIGKILL)
print("REAPER GONE", until(lambda: gone(int(reaper_pid)), 30))
os.kill(trainer.pid, signal.SIGKILL)
trainer.wait()
print("WORKERS GONE", until(lambda: all(gone(int(w)) for w in workers), 30))
until(lambda: not segments(), 10)
print("LEFT", segments())
"""


@pytest.mark.timeout(180)
def test_sigkill_of_the_reaper_then_of_the_trainer_leaves_no_segment(needs_namespace):
    """The workers see their parent's pipe close and remove its segments before they exit,
    so a reaper killed first (it would have removed them) changes nothing."""
    code = f"TRAINER = {TRAINER!r}\n" + textwrap.dedent(WATCH + ORCHESTRATE)
    out = chaos_env.run_in_namespace(chaos_env.python(code), shm="256m", timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HAD True" in out.stdout and "REAPER GONE True" in out.stdout, out.stdout
    assert "WORKERS GONE True" in out.stdout and "LEFT []" in out.stdout, out.stdout


TRAINER_NEXT = """
import sys, time
import numpy as np, stoker
from stoker.shm import reaper
images = np.zeros((64, 32, 32, 3), np.uint8)
loader = stoker.Loader(images, batch_size=4, workers=2, augment=None)
it = iter(loader)
next(it)
print("READY", reaper.reaper_pid(), flush=True)
sys.stdin.readline()  # the test killed the reaper
next(it)
print("NEXT", reaper.reaper_pid(), flush=True)
time.sleep(600)
"""

ORCHESTRATE_GROUP = """
trainer = subprocess.Popen([sys.executable, "-c", TRAINER_NEXT], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
first = int(trainer.stdout.readline().split()[1])
os.kill(first, signal.SIGKILL)
print("REAPER GONE", until(lambda: gone(first), 30))
trainer.stdin.write("go\\n")
trainer.stdin.flush()
second = trainer.stdout.readline().split()[1]
print("REPLACED", second not in ("None", str(first)))
os.killpg(trainer.pid, signal.SIGKILL)  # the trainer and its workers at once
trainer.wait()
until(lambda: not segments(), 10)
print("LEFT", segments())
"""


@pytest.mark.timeout(180)
def test_a_killed_reaper_is_replaced_between_batches(needs_namespace):
    """The reaper is killed; at the next batch the trainer starts a new one, told every
    segment and worker, so the trainer and its workers killed together still leave nothing."""
    code = f"TRAINER_NEXT = {TRAINER_NEXT!r}\n" + textwrap.dedent(WATCH + ORCHESTRATE_GROUP)
    out = chaos_env.run_in_namespace(chaos_env.python(code), shm="256m", timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REAPER GONE True" in out.stdout and "REPLACED True" in out.stdout, out.stdout
    assert "LEFT []" in out.stdout, out.stdout
