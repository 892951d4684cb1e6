"""Segments left by a dead process are removed at the next start and by `stoker doctor --clean`."""

import os
import subprocess
import sys

import pytest

import stoker
from stoker.cli import main


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _plant(pid: int) -> str:
    path = f"/dev/shm/stoker_{pid}_dead00_1_slot0"
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    return path


@pytest.mark.timeout(60)
def test_next_start_removes_segments_of_dead_processes(image_folder):
    stale = _plant(_dead_pid())
    mine = f"/dev/shm/stoker_{os.getpid()}_alive0_1_keep"  # a live owner's segment stays
    open(mine, "wb").close()
    try:
        with stoker.Loader(image_folder, batch_size=6, image_size=16, workers=1) as loader:
            next(iter(loader))
        assert not os.path.exists(stale) and os.path.exists(mine)
    finally:
        os.unlink(mine)


def test_doctor_lists_and_cleans_stale_segments(capsys):
    stale = _plant(_dead_pid())
    main(["doctor"])
    assert stale in capsys.readouterr().out and os.path.exists(stale)
    main(["doctor", "--clean"])
    assert "removed 1 stale segment" in capsys.readouterr().out
    assert not os.path.exists(stale)
