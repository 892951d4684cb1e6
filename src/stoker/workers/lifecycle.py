"""A worker process's start and stop, the same for the loader's pool and one-off jobs: every
worker started is registered with the reaper (which kills it if this process dies first), and
every worker stopped is asked, then terminated, then killed, and untracked once it has ended."""

from __future__ import annotations

import time
from collections.abc import Sequence
from multiprocessing.connection import Connection

from ..shm import reaper
from .launch import Launch, Process
from .zygote import ForkedProcess


def start_worker(launch: Launch, wid: int) -> tuple[Process | ForkedProcess, Connection]:
    """Start worker ``wid`` from ``launch`` and register it with the reaper (a worker a zygote
    forks is registered when its pid arrives, the zygote from its start)."""
    proc, conn = launch.start(wid)
    if isinstance(proc, Process):
        reaper.track_process(proc.pid)
    return proc, conn


def stop_workers(
    procs: Sequence[Process | ForkedProcess], conns: Sequence[Connection], timeout: float = 5.0
) -> None:
    """Ask every worker to stop (``None`` on its pipe), wait up to ``timeout`` seconds for all
    of them together, then terminate and at last kill the ones still running; untrack each one
    that has ended and close the pipes. Never waits longer than needed."""
    for conn in conns:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + timeout
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(1.0)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
    for proc in procs:
        if proc.exitcode is not None:
            reaper.untrack_process(proc.pid)
    for conn in conns:
        conn.close()
