"""The node's side of the cluster: one decode actor per Ray node, driving stoker's own worker
pool on that node's cores.

The actor receives the loader's Recipe, the very one the trainer's local pool gets (sent with
its shared arrays by value), starts a ``WorkerPool`` of its own from it, and fills the batches
the trainer asks for into slots of its own ring (``nodering``); so the C decode, read-ahead,
replacement of bad samples and worker failure handling are the local code. A finished batch
goes back as one frame (``wire``) over the trainer's TCP connection, or, on the object-store
path, as the return value of ``fill``. The actor serves only the loader that started it (its
secret).

This module does not import Ray: ``workers.cluster`` wraps :class:`Decoder` with
``ray.remote`` on the trainer. When the trainer's connection ends (its process exited or was
killed) the actor stops its pool and exits at once. Its reaper is detached (no child of the
actor's process), so when Ray kills the actor first, and its workers with it, the reaper still
removes the node's segments and lock files and kills what is left of its workers.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import queue
import socket
import sys
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import StokerError, WorkerDied
from ..schema import SlotLayout
from ..shm import reaper
from ..shm.segments import Segment
from . import door, wire
from .nodering import NodeRing

if TYPE_CHECKING:
    from ..recipe import Recipe
    from .runspec import RunSpec

Result = tuple[str, Any]  # ("ok", Report) or ("error", JSON-able error)


def identity() -> dict[str, str]:
    """What must match between trainer and node: stoker's version and its decoders."""
    import cv2

    from .._version import __version__
    from ..decode import decoder_name, jpegcrop

    return {
        "stoker": __version__,
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


class Decoder:
    """One node's decode actor (wrapped with ``ray.remote`` by the trainer).

    ``settings`` is the cloudpickled Recipe of the trainer's loader and ``run`` its RunSpec
    (what its local ``WorkerPool`` hands each worker in its ``WorkerSpec``): this node's
    ``WorkerPool(cores, recipe, run)`` is the trainer's own, on ``cores`` processes that fill
    at most ``capacity`` batches at a time.

    ``secret`` is the loader's job secret: a method that starts, stops, connects or hands out
    batches takes it as its ``secret`` argument and refuses (``PermissionError``) a caller
    without it, so another driver of the same Ray cluster that finds this named actor cannot
    take the node or its batches."""

    def __init__(
        self,
        settings: bytes,
        secret: bytes,
        cores: int,
        capacity: int,
        run: RunSpec,
    ) -> None:
        reaper.detach()  # before the first segment: Ray's kill of this actor kills its children
        self.recipe: Recipe = pickle.loads(settings)
        self.cores, self.capacity, self.run = cores, capacity, run
        self.secret = secret
        self.refused = 0  # calls without the secret
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
            "identity": identity(),
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "name": source.name(index),
            "unreadable": readable,
            "python": sys.version.split()[0],
        }

    def _check(self, secret: Any) -> None:
        """Refuse a caller that does not hold this loader's secret."""
        if not (isinstance(secret, bytes) and hmac.compare_digest(secret, self.secret)):
            self.refused += 1
            raise PermissionError(
                "this stoker decode actor serves only the loader that started it: the caller "
                "does not hold that loader's secret"
            )

    def start(self, secret: bytes) -> dict[str, Any]:
        """Start the node's worker pool; this actor's pid and its workers'."""
        self._check(secret)
        self.ring = NodeRing(self.recipe, self.run, self.cores, self.capacity)
        self.ring.done = self._done
        self.ring.start()
        return {"pid": os.getpid(), "workers": [p.pid for p in self.ring.pool.procs]}

    def counts(self) -> dict[str, int]:
        """Requests this node received from the trainer, batches it finished, and the calls
        it refused (no secret)."""
        return {"requests": self.requests, "finished": self.finished, "refused": self.refused}

    def probe(self, secret: bytes, key: tuple[int, int]) -> dict[str, Any]:
        """Fill batch ``key`` here: the digest of its bytes and its bad samples."""
        self._check(secret)
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
        """Open the data connection to the trainer (trying again within ``timeout``); "" when
        it is up, else why not. Only the loader that started this actor may call it."""
        self._check(secret)
        if self.sock is not None:
            raise PermissionError("this node's data connection is already up")
        try:
            sock = door.dial(host, port, self.secret, index, self.run.timeout)
        except wire.WireError as exc:
            return str(exc)
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
        slot, (kind, value) = future.result(timeout=max(self.run.timeout, 60.0))
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

    def fill(self, secret: bytes, ticket: int, epoch: int, batch: int) -> tuple[bytes, np.ndarray]:
        """Batch ``(epoch, batch)`` through Ray's object store: a frame's header and report,
        and the field bytes in one array."""
        self._check(secret)
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

    def stop(self, secret: bytes) -> None:
        """Stop the pool and remove this node's segments (the trainer then kills the actor)."""
        self._check(secret)
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
