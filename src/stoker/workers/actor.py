"""The node's side of the cluster: one decode actor per Ray node, driving stoker's own worker
pool on that node's cores.

The actor receives the loader's Recipe, the very one the trainer's local pool gets (sent with
its shared arrays by value), starts a ``WorkerPool`` of its own from it, and fills the batches
the trainer asks for into slots of its own ring; so the C decode, read-ahead, replacement of
bad samples and worker failure handling are the local code. A finished batch goes back as one
frame (``wire``) over the trainer's TCP connection, or, on the object-store path, as the return
value of ``fill``.

This module does not import Ray: ``workers.cluster`` wraps :class:`Decoder` with
``ray.remote`` on the trainer. When the trainer's connection ends (its process exited or was
killed) the actor stops its pool and exits at once. Its reaper is detached (no child of the
actor's process), so when Ray kills the actor first, and its workers with it, the reaper still
removes the node's segments and lock files and kills what is left of its workers.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import queue
import socket
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import StokerError, WorkerDied
from ..schema import SlotLayout
from ..shm import reaper
from ..shm.segments import Segment
from ..shm.stale import clean_stale
from . import wire
from .pool import WorkerPool

if TYPE_CHECKING:
    from ..loader.recipe import Recipe

PER_WORKER = 2  # tasks queued on each of the node's worker processes
POLL_S = 0.2
Result = tuple[str, Any]  # ("ok", Report) or ("error", JSON-able error)


def identity(claimed_version: str | None = None) -> dict[str, str]:
    """What must match between trainer and node: stoker's version and its decoders.

    ``claimed_version`` replaces the real version; it exists only so the test suite can
    start a node that says it runs another stoker (``tests/test_cluster.py``)."""
    import cv2

    from .. import __version__
    from ..decode import decoder_name, jpegcrop

    return {
        "stoker": claimed_version or __version__,
        "decoder": decoder_name(),
        "jpeg extension": f"API {jpegcrop.API_VERSION}, built: {jpegcrop.AVAILABLE}",
        "opencv": cv2.__version__,
        "numpy": np.__version__,
    }


def field_parts(layout: SlotLayout, seg: Segment, count: int) -> list[memoryview]:
    """The first ``count`` rows of every field of a slot, as byte views (no copy)."""
    return [np.ascontiguousarray(arr[:count]).data.cast("B") for arr in layout.views(seg).values()]


def digest(parts: list[memoryview]) -> str:
    """SHA-256 over a batch's field bytes, field by field."""
    h = hashlib.sha256()
    for part in parts:
        h.update(wire.LENGTH.pack(part.nbytes))  # fields cannot run into each other
        h.update(part)
    return h.hexdigest()


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
        cores: int,
        capacity: int,
        timeout: float,
        threads: int | None = 1,
    ) -> None:
        clean_stale()
        self.layout: SlotLayout = recipe.schema.slot_layout
        self.pool = WorkerPool(cores, recipe, timeout, threads)
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


class Decoder:
    """One node's decode actor (wrapped with ``ray.remote`` by the trainer).

    ``settings`` is the cloudpickled Recipe of the trainer's loader (what its local
    ``WorkerPool`` hands each worker in its ``WorkerSpec``) and ``threads`` its thread count
    per worker: this node's ``WorkerPool(cores, recipe, timeout, threads)`` is the trainer's
    own, on ``cores`` processes that fill at most ``capacity`` batches at a time.
    ``claimed_version`` is the test suite's hook to impersonate another stoker version (see
    :func:`identity`)."""

    def __init__(
        self,
        settings: bytes,
        cores: int,
        capacity: int,
        timeout: float,
        threads: int | None = 1,
        claimed_version: str | None = None,
    ) -> None:
        reaper.detach()  # before the first segment: Ray's kill of this actor kills its children
        self.recipe: Recipe = pickle.loads(settings)
        self.cores, self.capacity, self.timeout, self.threads = cores, capacity, timeout, threads
        self.claimed = claimed_version
        self.ring: NodeRing | None = None
        self.futures: dict[int, Future] = {}
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        self.requests = self.finished = 0

    # ------------------------------------------------------------------ start-up checks

    def hello(self, index: int) -> dict[str, Any]:
        """Who this node is, what it runs, and whether it can read sample ``index``."""
        source = self.recipe.source
        try:
            source.open_in_worker()
            source.read(index)
            readable = ""
        except Exception as exc:  # noqa: BLE001 - the trainer names the node and the path
            readable = f"{type(exc).__name__}: {exc}"
        return {
            "identity": identity(self.claimed),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "name": source.name(index),
            "unreadable": readable,
            "python": sys.version.split()[0],
        }

    def start(self) -> dict[str, Any]:
        """Start the node's worker pool; this actor's pid and its workers'."""
        self.ring = NodeRing(self.recipe, self.cores, self.capacity, self.timeout, self.threads)
        self.ring.done = self._done
        self.ring.start()
        return {"pid": os.getpid(), "workers": [p.pid for p in self.ring.pool.procs]}

    def counts(self) -> dict[str, int]:
        """Requests this node received from the trainer, and batches it finished."""
        return {"requests": self.requests, "finished": self.finished}

    def probe(self, key: tuple[int, int]) -> dict[str, Any]:
        """Fill batch ``key`` here: the digest of its bytes and its bad samples."""
        kind, value, (slot, parts) = self._fill_now(-1, key)
        if kind != "ok":
            return {"error": value}
        found = digest(parts)
        del parts
        assert self.ring is not None
        self.ring.release(slot)
        return {"digest": found, "bad": [list(b) for b in value.bad]}

    # ------------------------------------------------------------------ the TCP path

    def connect(self, host: str, port: int, secret: bytes, index: int) -> str:
        """Open the data connection to the trainer; "" when it is up, else why not."""
        try:
            sock = socket.create_connection((host, port), timeout=10.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.prove(sock, secret, b"node", b"trainer")
            sock.sendall(wire.LENGTH.pack(index))
            sock.settimeout(None)
        except (OSError, EOFError, wire.WireError) as exc:
            return f"{type(exc).__name__}: {exc}"
        self.sock = sock
        threading.Thread(target=self._read_requests, name="stoker-node-in", daemon=True).start()
        threading.Thread(target=self._send_batches, name="stoker-node-out", daemon=True).start()
        return ""

    def _read_requests(self) -> None:
        """Requests from the trainer; its connection closing ends this actor."""
        assert self.sock is not None and self.ring is not None
        try:
            while True:
                head = wire.read_header(self.sock)
                if head.kind != wire.REQUEST:
                    raise wire.WireError(f"unexpected frame kind {head.kind} from the trainer")
                self.requests += 1
                self.ring.submit(head.ticket, head.key)
        except BaseException:  # noqa: BLE001 - EOF, reset, or garbage: the trainer is gone
            self._exit()

    def _send_batches(self) -> None:
        assert self.sock is not None and self.ring is not None
        try:
            while True:
                ticket, key, slot, result = self.outbox.get()
                kind, value = result
                parts: list[memoryview] = []
                if kind == "fatal":
                    raise StokerError(value)
                if kind == "ok":
                    parts = field_parts(self.ring.layout, self.ring.segments[slot], value.count)
                    wire.send_frame(
                        self.sock, wire.DATA, ticket, key, wire.report_bytes(value), parts
                    )
                else:
                    wire.send_frame(self.sock, wire.ERROR, ticket, key, _json(value), [])
                del parts
                self.ring.release(slot)
        except BaseException:  # noqa: BLE001 - the connection broke: nobody to serve
            self._exit()

    def _done(self, ticket: int, key: tuple[int, int], slot: int, result: Result) -> None:
        self.finished += 1
        with self.lock:
            future = self.futures.pop(ticket, None)
        if future is not None:
            future.set_result((slot, result))
        elif result[0] == "fatal" and self.futures:
            for fut in list(self.futures.values()):
                fut.set_result((-1, result))
        else:
            self.outbox.put((ticket, key, slot, result))

    def _exit(self) -> None:
        """Stop everything and end this actor's process (its workers follow it). The segments
        go first: Ray may kill this process any moment once the trainer's job is gone."""
        try:
            if self.ring is not None:
                self.ring.unlink()
            self._release()
            if self.ring is not None:
                self.ring.close()
        finally:
            os._exit(0)

    # ------------------------------------------------------------------ the object-store path

    def _fill_now(self, ticket: int, key: tuple[int, int]) -> tuple[str, Any, Any]:
        """Fill ``key`` and wait for it: (kind, report or error, (slot, parts))."""
        assert self.ring is not None
        self.requests += ticket >= 0
        future: Future = Future()
        with self.lock:
            self.futures[ticket] = future
        self.ring.submit(ticket, key)
        slot, (kind, value) = future.result(timeout=max(self.timeout, 60.0))
        if kind == "fatal":
            raise WorkerDied(value)
        parts = (
            field_parts(self.ring.layout, self.ring.segments[slot], value.count)
            if kind == "ok"
            else []
        )
        if kind == "ok":
            return kind, value, (slot, parts)
        self.ring.release(slot)
        return kind, value, (slot, [])

    def fill(self, ticket: int, epoch: int, batch: int) -> tuple[bytes, np.ndarray]:
        """Batch ``(epoch, batch)`` through Ray's object store: a frame's header and report,
        and the field bytes in one array."""
        kind, value, (slot, parts) = self._fill_now(ticket, (epoch, batch))
        if kind != "ok":
            return wire.pack_header(wire.ERROR, ticket, (epoch, batch), _json(value), ()) + _json(
                value
            ), np.zeros(0, np.uint8)
        report = wire.report_bytes(value)
        head = wire.pack_header(
            wire.DATA, ticket, (epoch, batch), report, [p.nbytes for p in parts]
        )
        out = np.empty(sum(p.nbytes for p in parts), np.uint8)
        at = 0
        for part in parts:
            out[at : at + part.nbytes] = np.frombuffer(part, np.uint8)
            at += part.nbytes
        del parts
        assert self.ring is not None
        self.ring.release(slot)
        return head + report, out

    def stop(self) -> None:
        """Stop the pool and remove this node's segments (the trainer then kills the actor)."""
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        self._release()

    def _release(self) -> None:
        """Unlink the node's copies of the source's and the columns' shared arrays."""
        for part in (self.recipe.source, self.recipe.schema.columns):
            try:
                part.close()
            except Exception:  # noqa: BLE001 - closing is best effort on the way out
                pass

    def alive(self) -> float:
        """A liveness check: this node's clock."""
        return time.time()


def _json(value: Any) -> bytes:
    import json

    return json.dumps(value, separators=(",", ":"), default=str).encode()
