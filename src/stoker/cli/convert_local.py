"""The local engine of ``stoker convert``: shards written by worker processes on this machine.

The workers start from stoker's own entry point (:mod:`stoker.workers.launch`), as the loader's
do, so ``convert(..., workers=4)`` works from a script without a ``__main__`` guard, from
``python -c`` and from a notebook. Each worker gets the source once, then one shard at a time
over its own socket; it reports progress every few samples and the shard's record when done.
A shard that raises stops the conversion with that exception (the finished shards stay, and a
rerun rebuilds only the others); a worker that dies gives ``WorkerDied``.
"""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

from ..errors import WorkerDied
from ..sources.base import Source
from ..workers.errors import describe_exit, pack_exception, unpack_exception
from ..workers.launch import START_TIMEOUT_S, Launch, Process, payload_bytes
from .shard_writer import shard_name, write_shard

POLL_S = 0.25

__all__ = ["run_shards"]


def run_shards(source: Source, job: dict[str, Any], plan: dict[str, Any], todo: list[int],
               workers: int, bar: Any) -> Iterator[dict[str, Any]]:
    """Write the shards in ``todo``; yield each one's record as it completes."""
    if not todo:
        return
    if workers == 1 or len(todo) == 1:
        for number in todo:
            yield write_shard(source, job, number, plan["shards"][number], bar.add)
        return
    launch = Launch(payload_bytes(_worker, (source, job), {"source": source}))
    procs: list[Process] = []
    conns: list[Connection] = []
    try:
        for wid in range(min(workers, len(todo))):
            proc, conn = launch.start(wid)
            procs.append(proc)
            conns.append(conn)
        launch.wait_started(procs, conns, START_TIMEOUT_S)
        yield from _serve(procs, conns, list(todo), plan, bar)
    finally:
        launch.close()
        _stop(procs, conns)


def _serve(procs: list[Process], conns: list[Connection], queue: list[int],
           plan: dict[str, Any], bar: Any) -> Iterator[dict[str, Any]]:
    """Hand out shards one at a time per worker; yield records; raise a worker's error."""
    busy: dict[int, int] = {}

    def give(wid: int) -> None:
        if queue:
            number = queue.pop(0)
            conns[wid].send((number, plan["shards"][number]))
            busy[wid] = number

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
                bar.add(payload)
                continue
            if kind == "error":
                raise unpack_exception(payload, f"writing {shard_name(busy[wid])}")
            del busy[wid]
            yield payload
            give(wid)
        for wid in list(busy):
            if procs[wid].exitcode is not None:
                _died(wid, procs[wid], busy[wid])


def _died(wid: int, proc: Process, number: int) -> None:
    proc.join(2.0)
    raise WorkerDied(f"convert worker {wid} (pid {proc.pid}) {describe_exit(proc.exitcode)} "
                     f"while writing {shard_name(number)}; a rerun rebuilds only unfinished shards")


def _stop(procs: list[Process], conns: list[Connection]) -> None:
    """Ask every worker to stop, then terminate the ones that do not."""
    for conn in conns:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
    for proc in procs:
        proc.join(5.0)
        proc.terminate()
        proc.join(1.0)
        proc.kill()
        proc.join(1.0)
    for conn in conns:
        conn.close()


def _worker(wid: int, conn: Connection, source: Source, job: dict[str, Any]) -> None:
    """In a worker process: write the shards it is given until told to stop."""
    import cv2

    cv2.setNumThreads(1)  # one process per core already; cv2's own threads would contend
    source.open_in_worker()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if task is None:
            return
        number, samples = task
        try:
            record = write_shard(source, job, number, samples,
                                 lambda count: conn.send(("tick", count)))
        except Exception as exc:  # noqa: BLE001 - the parent re-raises it
            conn.send(("error", pack_exception(exc, wid, None)))
            continue
        conn.send(("done", record))
