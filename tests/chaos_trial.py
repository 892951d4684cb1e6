"""One kill trial, run inside a private mount namespace with a fresh tmpfs on /dev/shm.

``python chaos_trial.py train DATA MOMENT EPOCH`` is the training process: a stoker Loader over
an ImageFolder, iterated epoch after epoch by a consumer that does no work (input-bound: the
workers are always busy), closed in its third epoch. At MOMENT of epoch EPOCH it stops where it
is and says so with a line ``AT MOMENT EPOCH``, then waits for its signal:

- ``mid``: after the epoch's second batch, the loader running;
- ``end``: after the epoch's last batch, before the next epoch starts;
- ``close-pool`` / ``close-ring``: inside ``close()``, just before the workers are stopped, or
  after they are stopped and just before the ring's segments are unlinked;
- ``startup``: never (the kill comes at a random time after launch).

``python chaos_trial.py trial DATA MOMENT DELAY SIGNAL EPOCH`` starts that training process with
a unique tag in its environment, waits for its ``AT`` line (``startup``: DELAY seconds after
launch), then DELAY seconds more, and kills it with SIGNAL. So a kill meant for the middle of an
epoch or of a close lands there by a handshake, on a fast idle machine as on a slow busy one.
It prints one JSON line: the segments (``stoker_*`` in /dev/shm and in the trial's TMPDIR) and
the tagged processes alive at the kill and still there after a grace period. Only the standard
library is imported here, so nothing of stoker runs in this process.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

GRACE_S = 5.0  # the promise: "within a few seconds" nothing is left


LAST_EPOCH = 2  # the trainer closes its loader in this epoch


def _stop_here(moment: str) -> None:
    """Say where the trainer is, then wait there for the trial's signal."""
    print(f"AT {moment}", flush=True)
    while True:
        time.sleep(3600)


def _pause_inside_close(moment: str) -> None:
    """Make ``close()`` stop at ``close-pool`` (workers still running) or ``close-ring``
    (workers stopped, the ring's segments not yet unlinked)."""
    from stoker.workers.engine import Engine
    from stoker.workers.pool import WorkerPool

    cls, name = (WorkerPool, "close") if moment == "close-pool" else (Engine, "close")
    original = getattr(cls, name)

    def paused(self, *args, **kwargs):
        _stop_here(f"{moment} {LAST_EPOCH}")
        return original(self, *args, **kwargs)

    setattr(cls, name, paused)


def train(data: str, moment: str, at_epoch: int) -> None:
    import stoker

    loader = stoker.Loader(data, batch_size=4, image_size=96, workers=2, timeout=60)
    assert len(loader) > 2, "the trial's folder needs at least three batches an epoch"
    for epoch in range(LAST_EPOCH + 1):
        for i, _ in enumerate(loader):
            if i == 1 and (moment, epoch) == ("mid", at_epoch):
                _stop_here(f"mid {epoch}")
        if (moment, epoch) == ("end", at_epoch):
            _stop_here(f"end {epoch}")
    if moment.startswith("close"):
        _pause_inside_close(moment)
    loader.close()
    time.sleep(60)


def _segments(tmpdir: str) -> list[str]:
    found = []
    for folder in ("/dev/shm", tmpdir):
        try:
            found += [os.path.join(folder, n) for n in os.listdir(folder) if "stoker_" in n]
        except OSError:
            pass
    return found


def _tagged(tag: str) -> list[str]:
    """Live (not zombie) processes whose environment carries ``tag``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if tag.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[-1].split()[0]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            found.append(f"{pid}: {cmd}")
    return found


def _wait_line(proc: subprocess.Popen, want: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], 0.5)[0]:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return False
        buf += chunk
        if f"{want}\n".encode() in buf:
            return True
    return False


def trial(data: str, moment: str, delay: float, signame: str, epoch: int) -> dict:
    tag = f"STOKER_CHAOS_TAG={uuid.uuid4().hex}"
    tmpdir = tempfile.mkdtemp(prefix="chaos_tmp_")
    env = {**os.environ, "STOKER_CHAOS_TAG": tag.split("=")[1], "TMPDIR": tmpdir}
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "train", data, moment, str(epoch)],
        stdout=subprocess.PIPE,
        env=env,
    )
    reached = moment == "startup" or _wait_line(proc, f"AT {moment} {epoch}", 120)
    time.sleep(delay)
    at_kill = {"segments": len(_segments(tmpdir)), "processes": len(_tagged(tag)) - 1}
    if os.environ.get("CHAOS_DEBUG"):
        print(_segments(tmpdir), _tagged(tag), file=sys.stderr)
    proc.send_signal(getattr(signal, signame))
    code = proc.wait(60)
    deadline = time.monotonic() + GRACE_S
    while (_segments(tmpdir) or _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    segments_left = _segments(tmpdir)
    shutil.rmtree(tmpdir, ignore_errors=True)
    return {
        "moment": moment,
        "signal": signame,
        "delay": delay,
        "reached": reached,
        "exit": code,
        "at_kill": at_kill,
        "segments_left": segments_left,
        "processes_left": _tagged(tag),
    }


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        result = trial(sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
        print(json.dumps(result), flush=True)
