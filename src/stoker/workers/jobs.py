"""One-off jobs in worker processes started from stoker's own entry point (:mod:`.launch`):
``stoker convert``'s shard writers, ``make_image_folder``'s generators, ``stoker bench``'s
pinned cores. Like the loader's workers they never re-run the user's script, so these work
from a script without a ``__main__`` guard, ``python -c`` or a notebook.

:func:`map_jobs` hands each worker one job at a time over its own socket and yields results as
they complete. A job that raises stops the run with that exception (re-raised here with the
worker's traceback); a worker that dies gives :class:`~stoker.errors.WorkerDied`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from ..errors import WorkerDied
from .errors import describe_exit, pack_exception, unpack_exception
from .launch import START_TIMEOUT_S, Launch, Process, payload_bytes
from .lifecycle import start_worker, stop_workers
from .zygote import ForkedProcess

POLL_S = 0.25

__all__ = ["map_jobs"]


def map_jobs(
    fn: Callable[..., Any],
    jobs: Sequence[Any],
    processes: int,
    on_tick: Callable[[int], None] | None = None,
) -> Iterator[tuple[int, Any]]:
    """``(index, fn(job))`` for every job, computed in ``processes`` workers, as each completes.

    With ``on_tick``, ``fn`` is called as ``fn(job, tick)`` and every ``tick(count)`` it makes
    in the worker reaches ``on_tick(count)`` here (progress). ``fn`` travels with cloudpickle.
    """
    if not jobs:
        return
    launch = Launch(payload_bytes(_job_loop, (fn, on_tick is not None), {"the job": fn}))
    procs: list[Process | ForkedProcess] = []  # Launch() without a zygote: all Process
    conns: list[Connection] = []
    try:
        for wid in range(max(1, min(processes, len(jobs)))):
            proc, conn = start_worker(launch, wid)
            procs.append(proc)
            conns.append(conn)
        launch.wait_started(procs, conns, START_TIMEOUT_S)
        yield from _serve(procs, conns, list(enumerate(jobs)), on_tick)
    finally:
        launch.close()
        stop_workers(procs, conns)


def _serve(
    procs: list[Process | ForkedProcess],
    conns: list[Connection],
    queue: list[tuple[int, Any]],
    on_tick: Callable[[int], None] | None,
) -> Iterator[tuple[int, Any]]:
    busy: dict[int, int] = {}

    def give(wid: int) -> None:
        if queue:
            index, job = queue.pop(0)
            conns[wid].send((index, job))
            busy[wid] = index

    for wid in range(len(conns)):
        give(wid)
    while busy:
        for ready in wait([conns[w] for w in busy], POLL_S):
            wid = conns.index(ready)  # type: ignore[arg-type]
            try:
                kind, payload = conns[wid].recv()
            except (EOFError, OSError):
                _died(wid, procs[wid], busy[wid])
            if kind == "tick":
                if on_tick is not None:
                    on_tick(payload)
                continue
            if kind == "error":
                raise unpack_exception(payload, f"(job {busy[wid]})")
            yield busy.pop(wid), payload
            give(wid)
        for wid in list(busy):
            if procs[wid].exitcode is not None:
                _died(wid, procs[wid], busy[wid])


def _died(wid: int, proc: Process | ForkedProcess, index: int) -> None:
    proc.join(2.0)
    raise WorkerDied(
        f"worker {wid} (pid {proc.pid}) {describe_exit(proc.exitcode)} during job {index}"
    )


def _job_loop(wid: int, conn: Connection, fn: Callable[..., Any], ticks: bool) -> None:
    """In a worker process (its thread pools at one thread each, one process per core
    already): run the jobs it is given until told to stop."""

    def tick(count: int) -> None:
        conn.send(("tick", count))

    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if task is None:
            return
        index, job = task
        try:
            result = fn(job, tick) if ticks else fn(job)
        except Exception as exc:  # noqa: BLE001 - the parent re-raises it
            conn.send(("error", pack_exception(exc, wid, None)))
            continue
        conn.send(("done", result))
