"""Containers that share /dev/shm but not a PID namespace (several containers of one pod,
``docker run --ipc=shareable``): a trainer's start never takes another namespace's live
segments for stale, and a segment whose owner is provably gone (its lock free) is removed.

Two trainers run in PID namespaces of their own (``unshare -p -f --mount-proc``) over one
private tmpfs on /dev/shm (``unshare -m``): the machine's /dev/shm is never touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stoker

SRC = str(Path(stoker.__file__).resolve().parents[1])

# burns pids first, so trainer A's pid (about 40) does not exist in B's namespace, where B and
# its reaper and worker have the lowest pids
IN_OWN_PID_NS = (
    "unshare -p -f --mount-proc sh -c 'for i in $(seq {burn}); do /bin/true; done; "
    '"$0" "$@"; true\' {python} {script} {folder}'
)

TRAINER_A = """
import glob, json, os, sys, time
import numpy as np
import stoker
folder = sys.argv[1]
mine = lambda: sorted(glob.glob(f"/dev/shm/stoker_{os.getpid()}_*"))
images = np.zeros((64, 8, 8, 3), np.uint8)
batches = 0
with stoker.Loader(images, labels=np.arange(64), batch_size=4, image_size=8, workers=1,
                   augment=None) as loader:
    epoch = iter(loader)
    next(epoch)
    batches += 1
    before = mine()
    open(f"{folder}/a-ready", "w").close()
    deadline = time.monotonic() + 150
    while not os.path.exists(f"{folder}/b-done") and time.monotonic() < deadline:
        time.sleep(0.05)
    after = mine()
    batches += sum(1 for _ in epoch)
    for _ in range(2):
        batches += sum(1 for _ in loader)
print("RESULT", json.dumps({"pid": os.getpid(), "before": before, "after": after,
                            "batches": batches}))
"""

TRAINER_B = """
import os, sys, time
import numpy as np
import stoker
folder = sys.argv[1]
deadline = time.monotonic() + 150
while not os.path.exists(f"{folder}/a-ready") and time.monotonic() < deadline:
    time.sleep(0.05)
images = np.zeros((16, 8, 8, 3), np.uint8)
with stoker.Loader(images, labels=np.arange(16), batch_size=4, image_size=8, workers=1,
                   augment=None) as loader:
    print("B batches", sum(1 for _ in loader))
open(f"{folder}/b-done", "w").close()
"""

KILLED = """
import os, signal, sys
from stoker.shm import reaper
from stoker.shm.segments import Segment
segment = Segment.create(4096, "left")
open(sys.argv[1] + "/left", "w").write(segment.path)
pid = reaper.reaper_pid()
os.kill(pid, signal.SIGKILL)
os.waitpid(pid, 0)  # the reaper is gone: its hold on the lock is released
os.kill(os.getpid(), signal.SIGKILL)
"""

CLEANER = """
import json
from stoker.shm.stale import clean_stale
print("REMOVED", json.dumps(clean_stale()))
"""

DRIVER = """
import json, os, subprocess, sys
folder, python = sys.argv[1], sys.argv[2]
def own_ns(script, burn=0):
    return ["sh", "-c", {command!r}.format(burn=burn or 1, python=python,
            script=f"{{folder}}/{{script}}", folder=folder)]
a = subprocess.Popen(own_ns("a.py", burn=40), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                     text=True)
b = subprocess.run(own_ns("b.py"), capture_output=True, text=True, timeout=200)
a_out = a.communicate(timeout=200)[0]
killed = subprocess.run(own_ns("killed.py"), capture_output=True, text=True, timeout=100)
left = open(f"{{folder}}/left").read()
lock = left.rsplit("_", 2)[0] + ".lock"
left_before = [os.path.exists(left), os.path.exists(lock)]
cleaner = subprocess.run(own_ns("cleaner.py"), capture_output=True, text=True, timeout=100)
print("SUMMARY", json.dumps({{
    "a": a_out, "a_rc": a.returncode, "b": b.stdout + b.stderr, "b_rc": b.returncode,
    "killed_rc": killed.returncode, "killed": killed.stderr, "left": left,
    "left_before": left_before, "left_after": [os.path.exists(left), os.path.exists(lock)],
    "cleaner": cleaner.stdout + cleaner.stderr, "shm": sorted(os.listdir("/dev/shm")),
}}))
"""


def _namespaces_reason() -> str | None:
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    probe = subprocess.run(
        ["unshare", "-m", "-p", "-f", "--mount-proc", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return f"unshare -m -p is not permitted here (needs root or CAP_SYS_ADMIN): {probe.stderr}"
    return None


@pytest.mark.timeout(400)
def test_trainers_in_two_pid_namespaces_sharing_dev_shm_keep_each_others_live_segments(tmp_path):
    reason = _namespaces_reason()
    if reason:
        pytest.skip(reason)
    for name, code in (
        ("a.py", TRAINER_A),
        ("b.py", TRAINER_B),
        ("killed.py", KILLED),
        ("cleaner.py", CLEANER),
    ):
        (tmp_path / name).write_text(textwrap.dedent(code))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(command=IN_OWN_PID_NS))
    script = (
        f"mount -t tmpfs -o size=256m tmpfs /dev/shm && exec {sys.executable} {driver} "
        f"{tmp_path} {sys.executable}"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=380,
        env=env,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("SUMMARY ")), None)
    assert line is not None, out.stdout + out.stderr
    got = json.loads(line.split(" ", 1)[1])
    assert got["b_rc"] == 0 and "B batches 4" in got["b"], got["b"]
    assert got["a_rc"] == 0 and "RESULT " in got["a"], got["a"]
    a = json.loads(got["a"].split("RESULT ", 1)[1])
    # A's pid is missing in B's namespace: B's start must still leave A's segments alone
    assert a["before"] and a["after"] == a["before"], a
    assert a["batches"] == 3 * 16  # and A ran its three epochs to the end
    # a trainer SIGKILLed after its reaper: its lock is free, so its segment is stale
    assert got["left_before"] == [True, True] and got["left_after"] == [False, False], got
    assert got["left"] in got["cleaner"]
    assert got["shm"] == [], got["shm"]  # nothing else left behind by anyone
