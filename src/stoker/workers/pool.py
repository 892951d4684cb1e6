"""Worker processes: start (through :mod:`.launch`, stoker's own entry point), the worker loop,
liveness, shutdown. Each worker has its own socket, so a dead worker shows up at once as
end-of-file, and no lock is shared that a killed process could leave held."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import seeding
from ..assemble import IN_BATCH_TRANSFORM
from ..errors import WorkerDied
from ..shm import ownerlock
from ..shm.segments import Segment
from ..shm.stale import clean_stale
from ..sources import fetch
from .errors import describe_exit, pack_exception
from .launch import START_TIMEOUT_S, Launch, Process, StartReport, payload_bytes
from .lifecycle import start_worker, stop_workers
from .zygote import ForkedProcess, Zygote

if TYPE_CHECKING:  # types only: both arrive pickled from the parent
    from ..recipe import Recipe
    from .runspec import RunSpec

STATUS_FIELDS = 2  # current sample index, batches done


@dataclass
class WorkerSpec:
    """What every worker gets, pickled once (cloudpickle) for all workers at start: the
    loader's ``recipe`` (what batches are made of) and ``run`` (how they are made), the status
    segment and the count of this pool's workers."""

    recipe: Recipe
    run: RunSpec
    status: tuple[str, int]
    workers: int


def _parent_alive(parent: int) -> bool:
    """False once ``parent`` has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{parent}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _watch_parent(parent: int, owner: str | None) -> None:
    """When the parent dies (even by SIGKILL), exit at once. The parent's reaper removes its
    segments; removing them here too covers a reaper that was killed with it."""
    try:
        fd = os.pidfd_open(parent)
        while _parent_alive(parent):
            select.select([fd], [], [], 5.0)
    except (AttributeError, OSError):
        while _parent_alive(parent):
            time.sleep(0.5)
    if owner is not None:
        clean_stale(owner=owner)  # the parent's segments by its tag: never another pid namespace's
    os._exit(0)


PARENT_EXIT_S = 5.0  # how long a worker whose pipe closed waits to see its parent gone


def _owner(spec: WorkerSpec) -> str | None:
    """The parent's owner tag (``<pid>_<token>``), read from its status segment's name."""
    return ownerlock.owner_of(os.path.basename(spec.status[0]))


def _end_with_parent(parent: int, owner: str | None) -> None:
    """The parent's end of the pipe closed without a stop task: the parent is exiting (killed,
    crashed). Wait until it is gone, then remove its segments before this process ends: its
    reaper may be dead too, and the watcher thread (a daemon) would end with this process
    before it had the chance."""
    deadline = time.monotonic() + PARENT_EXIT_S
    while _parent_alive(parent) and time.monotonic() < deadline:
        time.sleep(0.01)
    if not _parent_alive(parent) and owner is not None:
        clean_stale(owner=owner)


class _Worker:
    """The loop that runs inside one worker process."""

    def __init__(self, wid: int, conn: Connection, spec: WorkerSpec, parent: int = -1) -> None:
        self.wid, self.conn, self.spec, self.parent = wid, conn, spec, parent
        self.assembler = spec.recipe.assembler()
        reads = spec.recipe.read_settings
        if reads is not None:  # the loader's request-rate ceiling, shared by its workers
            fetch.configure(rate=reads.request_rate / max(1, spec.workers))
        self.status_seg = Segment.attach(*spec.status)
        self.status = self.status_seg.array(np.int64, (spec.workers, STATUS_FIELDS))[wid]
        self.slots: dict[int, tuple[str, Segment, dict[str, np.ndarray]]] = {}

    def views(self, slot: int, handle: tuple[str, int]) -> dict[str, np.ndarray]:
        """The slot's arrays, re-attaching if the parent gave the slot a new segment."""
        held = self.slots.get(slot)
        if held is not None and held[0] == handle[0]:
            return held[2]
        if held is not None:
            del self.slots[slot]
            held[1].close()
        seg = Segment.attach(*handle)
        fields = self.spec.recipe.schema.slot_layout.views(seg)
        self.slots[slot] = (handle[0], seg, fields)
        return fields

    def run(self) -> None:
        """Serve tasks until told to stop or the parent goes away."""
        while True:
            t0 = time.perf_counter()
            try:
                task = self.conn.recv()
            except (EOFError, OSError):
                self._parent_closed()
                return
            if task is None:
                return
            idle = time.perf_counter() - t0  # waiting for work: the engine sizes the ring by it
            try:
                self.conn.send(self.serve(*task, idle=idle))
            except (OSError, ValueError):
                self._parent_closed()
                return  # the parent stopped listening: end quietly, never with a traceback

    def _parent_closed(self) -> None:
        """The pipe to the parent closed under this worker: clean up after a dying parent."""
        if self.parent > 0:
            _end_with_parent(self.parent, _owner(self.spec))

    def serve(
        self, epoch: int, batch: int, slot: int, handle: tuple[str, int], *, idle: float = 0.0
    ) -> tuple:
        """Fill one batch; the reply says it is done (with ``idle``, the seconds this worker
        waited for the task, and the fill's own), or carries the exception."""
        try:
            t0 = time.perf_counter()
            report = self.assembler.fill(epoch, batch, self.views(slot, handle), self.status)
            report.idle_s, report.fill_s = idle, time.perf_counter() - t0
            self.status[1] += 1
            return ("ok", epoch, batch, slot, report)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            cur = self.assembler.current
            sample = self.spec.recipe.source.name(cur) if cur >= 0 else None
            return ("error", epoch, batch, slot, pack_exception(exc, self.wid, sample))


def worker_main(wid: int, conn: Connection, spec: WorkerSpec, parent: int) -> None:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent, _owner(spec)), daemon=True).start()
    import cv2

    # bad files are reported once, by name, in the parent; OpenCV's own stderr lines would not be
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    seeding.mark_worker()  # the global RNGs are the loader's here: reseeded, never put back
    spec.recipe.source.open_in_worker()
    _Worker(wid, conn, spec, parent).run()


def _parts(spec: WorkerSpec) -> dict[str, Any]:
    """The user-given pieces of ``spec``, by name, for an error saying which cannot be sent."""
    ops = getattr(spec.recipe.pipeline, "ops", None)
    parts: dict[str, Any] = {"augment": ops[0] if ops and len(ops) == 1 else ops}
    source = spec.recipe.source
    return {**parts, "source": source} if ops else {"source": source}


class WorkerPool:
    """The parent's side: ``count`` processes making ``recipe``'s batches as ``run`` says
    (``run.worker_threads`` sizes each worker's thread pools, see :mod:`.threads`), their
    pipes, and the status array they update. The workers are launched when the pool is made
    and waited for by :meth:`wait_started`."""

    def __init__(self, count: int, recipe: Recipe, run: RunSpec) -> None:
        self.status_seg = Segment.create(count * STATUS_FIELDS * 8, "status")
        self.status = self.status_seg.array(np.int64, (count, STATUS_FIELDS))
        self.status[:] = -1
        spec = WorkerSpec(recipe, run, self.status_seg.handle(), count)
        self.name = recipe.source.name
        self.procs: list[Process | ForkedProcess] = []
        self.conns: list[Connection] = []
        self.started: list[StartReport] = []
        self.limit = max(run.timeout, START_TIMEOUT_S)
        self.launch: Launch | None = None
        self.zygote: Zygote | None = None
        try:
            blob = payload_bytes(worker_main, (spec, os.getpid()), _parts(spec))
            # one start-up process loads the payload once and forks the workers (.zygote);
            # with the pools left alone torch's import starts a thread, and a fork needs none
            self.launch = Launch(blob, run.worker_threads, zygote=run.worker_threads is not None)
            self.zygote = self.launch.zygote
            for wid in range(count):
                proc, conn = start_worker(self.launch, wid)
                self.procs.append(proc)
                self.conns.append(conn)
        except BaseException:
            self.close(0.5)
            raise

    def wait_started(self) -> list[StartReport]:
        """Wait until every worker has started (they start as soon as the pool is made, so
        their imports overlap whatever the caller does until then); their reports."""
        launch, self.launch = self.launch, None
        if launch is not None:
            try:
                self.started = launch.wait_started(self.procs, self.conns, self.limit)
            except BaseException:
                launch.close()
                self.close(0.5)
                raise
        return self.started

    def poll_started(self) -> bool:
        """Without waiting: True once every worker has started (then :meth:`wait_started`
        returns at once); a worker that failed or died is raised here, the pool closed."""
        launch = self.launch
        if launch is None:
            return True
        try:
            return launch.poll(self.procs, self.conns)
        except BaseException:
            self.launch = None
            launch.close()
            self.close(0.5)
            raise

    def send(self, wid: int, task: tuple) -> None:
        """Give worker ``wid`` a task."""
        try:
            self.conns[wid].send(task)
        except (BrokenPipeError, OSError):
            self.raise_dead(wid, "")

    def receive(self, timeout: float) -> list[tuple[int, tuple]]:
        """Replies that arrived within ``timeout`` seconds; a closed pipe means a dead worker."""
        ready: list[Any] = wait(self.conns, timeout)
        out: list[tuple[int, Any]] = []
        for conn in ready:
            wid = self.conns.index(conn)  # type: ignore[arg-type]
            try:
                out.append((wid, conn.recv()))
            except (EOFError, OSError):
                self.raise_dead(wid, "")
        return out

    def check_alive(self, context: str) -> None:
        """Raise WorkerDied if any worker has exited."""
        for wid, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                self.raise_dead(wid, context)

    def current_sample(self, wid: int) -> int:
        """Index of the sample worker ``wid`` is (or was last) loading, -1 if none yet."""
        return int(self.status[wid, 0])

    def raise_dead(self, wid: int, context: str) -> None:
        """Raise the error for a worker that ended unasked (exit code or signal named)."""
        proc = self.procs[wid]
        proc.join(2.0)
        index = self.current_sample(wid)
        if not context and index == IN_BATCH_TRANSFORM:
            context = " while running batch_transform (its batch's samples had all loaded)"
        elif not context and index >= 0:
            context = f" while loading {self.name(index)}"
        elif index == -1 and proc.exitcode is not None and proc.exitcode < 0:
            context += " during its start-up, before loading any sample"
        elif index == -1:
            context += " before loading any sample (its error, if any, is printed above)"
        raise WorkerDied(f"worker {wid} (pid {proc.pid}) {describe_exit(proc.exitcode)}{context}")

    def forget(self) -> None:
        """In a forked child: drop the parent's workers without stopping them; only this
        process's copies of their socket ends are closed (the parent keeps its own)."""
        for conn in self.conns:
            try:
                conn.close()
            except OSError:
                pass
        self.procs, self.conns, self.launch = [], [], None  # the launch file is the parent's
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.forget()

    def close(self, timeout: float = 5.0) -> None:
        """Stop every worker: ask, then terminate, then kill; never waits longer than needed."""
        launch, self.launch = self.launch, None
        if launch is not None:  # closed before the workers were waited for
            launch.close()
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            zygote.stop()  # every fork asked for is known before the workers are stopped
        stop_workers(self.procs, self.conns, timeout)
        if zygote is not None:
            zygote.close()
        self.procs, self.conns = [], []
        self.status = np.zeros((0, STATUS_FIELDS), np.int64)
        self.status_seg.close()
        self.status_seg.unlink()
