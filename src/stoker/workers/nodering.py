"""A decode node's own ring: its worker pool (stoker's ``WorkerPool``, from the loader's Recipe),
its slots, and the trainer's tasks waiting for a worker; the node's actor (``actor``) owns it."""

from __future__ import annotations

import pickle
import socket
import threading
from collections import deque
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from ..schema import SlotLayout
from ..shm.segments import Segment
from ..shm.stale import clean_stale
from .pool import WorkerPool

if TYPE_CHECKING:
    from ..recipe import Recipe
    from .runspec import RunSpec

PER_WORKER = 2  # tasks queued on each of the node's worker processes
POLL_S = 0.2


def error_json(payload: dict[str, Any]) -> dict[str, Any]:
    """A worker's packed exception without its pickle: type, text, traceback, sample, and
    the bad samples a TooManyErrors carries."""
    bad: list[Any] = []
    if payload.get("blob") is not None:
        try:
            bad = list(getattr(pickle.loads(payload["blob"]), "bad", []))
        except Exception:  # noqa: BLE001 - the text and traceback still travel
            bad = []
    return {
        "type": payload["type"],
        "text": payload["text"],
        "tb": payload["tb"],
        "wid": payload["wid"],
        "sample": payload["sample"],
        "bad": bad,
    }


class NodeRing:
    """The node's pool, its slots, and the trainer's tasks; a thread hands tasks to the
    workers and calls ``done(ticket, key, slot, result)`` as each finishes."""

    def __init__(
        self,
        recipe: Recipe,
        run: RunSpec,
        cores: int,
        capacity: int,
    ) -> None:
        clean_stale()
        self.layout: SlotLayout = recipe.schema.slot_layout
        self.pool = WorkerPool(cores, recipe, run)
        self.pool.wait_started()
        self.segments = [Segment.create(self.layout.nbytes, f"node{i}") for i in range(capacity)]
        self.free: deque[int] = deque(range(capacity))
        self.waiting: deque[tuple[int, tuple[int, int]]] = deque()
        self.running: dict[int, tuple[int, tuple[int, int], int]] = {}  # slot -> wid, key, ticket
        self.load = [0] * cores
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = socket.socketpair()
        self.failure: BaseException | None = None
        self.stopped = False
        self.done: Any = None  # set by the owner before the first task

    def start(self) -> None:
        """Start handing out tasks."""
        threading.Thread(target=self._run, name="stoker-node-ring", daemon=True).start()

    def submit(self, ticket: int, key: tuple[int, int]) -> None:
        """Queue batch ``key`` under ``ticket``."""
        with self.lock:
            self.waiting.append((ticket, key))
        self._wake()

    def release(self, slot: int) -> None:
        """The batch in ``slot`` went out: the slot takes the next task."""
        with self.lock:
            self.free.append(slot)
        self._wake()

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"x")
        except OSError:
            pass

    def _run(self) -> None:
        try:
            while not self.stopped:
                self._dispatch()
                ready = wait([*self.pool.conns, self.wake_r], POLL_S)
                for conn in ready:
                    if conn is self.wake_r:
                        self.wake_r.recv(4096)
                    else:
                        self._reply(self.pool.conns.index(conn), conn)  # type: ignore[arg-type]
                self.pool.check_alive("")
        except BaseException as exc:  # noqa: BLE001 - a dead worker ends this node
            if not self.stopped:
                self.failure = exc
                self.done(-1, (-1, -1), -1, ("fatal", f"{type(exc).__name__}: {exc}"))

    def _dispatch(self) -> None:
        with self.lock:
            while self.waiting and self.free:
                wid = min(range(len(self.load)), key=self.load.__getitem__)
                if self.load[wid] >= PER_WORKER:
                    return
                ticket, key = self.waiting.popleft()
                slot = self.free.popleft()
                self.running[slot] = (wid, key, ticket)
                self.load[wid] += 1
                self.pool.send(wid, (key[0], key[1], slot, self.segments[slot].handle()))

    def _reply(self, wid: int, conn: Any) -> None:
        try:
            kind, epoch, batch, slot, payload = conn.recv()
        except (EOFError, OSError):
            self.pool.raise_dead(wid, "")
        with self.lock:
            _, key, ticket = self.running.pop(slot)
            self.load[wid] -= 1
        if kind == "ok":
            self.done(ticket, key, slot, ("ok", payload))
        else:
            self.done(ticket, key, slot, ("error", error_json(payload)))

    def unlink(self) -> None:
        """Remove the node's segments from the file system at once (mappings stay valid)."""
        for seg in self.segments:
            seg.unlink()
        self.pool.status_seg.unlink()

    def close(self) -> None:
        """Stop the workers and unlink the slots."""
        self.stopped = True
        self.pool.close(0.5)
        for seg in self.segments:
            seg.unlink()
            seg.close()
        self.segments = []
