"""The door of the trainer's data port: every connection is authenticated on its own, so no
connection can hold up another, and the node's side of the same handshake.

The trainer (:class:`Door`) runs one thread over a selector: the listener is non-blocking, and
each accepted connection is a small state machine (the peer's challenge, its answer, its node
index; ``wire`` has the challenge). A silent or slow peer only keeps its own entry open: it
is closed and counted as refused once it breaks the protocol, fails the HMAC, or has not
finished within ``HANDSHAKE_S`` of its accept. At most ``MAX_PENDING`` handshakes are open at
once; a flood makes room by dropping the oldest, so it costs a node a retry, never a wait. A
node passes only once the trainer has taken its connection and said so (``wire.ADMITTED``).

A node (:func:`dial`) retries until its deadline: a connection dropped by a flood, refused, or
slow to answer is tried again, with a growing pause, before the node falls back to Ray's
object store; a port where no TCP connection opens at all (closed, firewalled) is given up
sooner.
"""

from __future__ import annotations

import hmac
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from . import wire

HANDSHAKE_S = 10.0  # one handshake's whole budget, from accept (trainer) or connect (node)
MAX_PENDING = 256  # handshakes open at once; a new one beyond it drops the oldest
POLL_S = 0.2  # how soon the door's thread sees close()
RETRY_S = 0.05  # a node's first pause between tries; doubled up to RETRY_MAX_S
RETRY_MAX_S = 1.0
UNREACHABLE_S = 30.0  # a node gives up this soon when no TCP connection opens at all
SEND_S = 5.0  # the admitted byte's send, on a socket made blocking again

#: ``admit(index, sock)``: whether node ``index`` takes this authenticated connection.
Admit = Callable[[int, socket.socket], bool]


def listen(host: str) -> socket.socket:
    """The trainer's data port on ``host`` (a free port), with room for a flood in its backlog."""
    return socket.create_server((host, 0), backlog=MAX_PENDING)


@dataclass
class _Peer:
    """One connection in its handshake: the bytes wanted now, and what they are."""

    sock: socket.socket
    deadline: float
    challenge: bytes
    stage: str = "challenge"  # then "answer", then "index"
    buf: bytearray = field(default_factory=bytearray)

    @property
    def need(self) -> int:
        """Bytes this stage reads."""
        if self.stage == "challenge":
            return len(wire.MAGIC) + wire.CHALLENGE_BYTES
        return wire.DIGEST_BYTES if self.stage == "answer" else wire.LENGTH.size


class Door:
    """Authenticates every connection to ``listener`` on one thread, none waiting for another.

    ``admit(index, sock)`` is called with each connection that proved the secret; ``refused()``
    once for each one closed without being admitted."""

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes,
        admit: Admit,
        refused: Callable[[], None],
    ) -> None:
        self.listener, self.secret = listener, secret
        self.admit, self.refused = admit, refused
        host, port = listener.getsockname()[:2]
        self.host, self.port = str(host), int(port)
        self.pending: dict[socket.socket, _Peer] = {}  # oldest first
        self.closed = False
        listener.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ)
        self.thread = threading.Thread(target=self._run, name="stoker-cluster-door", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.closed:
                for key, _ in self.selector.select(self._wait()):
                    if key.fileobj is self.listener:
                        self._accept_all()
                    elif key.fileobj in self.pending:
                        self._read(self.pending[key.fileobj])  # type: ignore[index]
                self._expire()
        finally:
            for sock in list(self.pending):
                self._refuse(sock)
            self.selector.close()
            self.listener.close()

    def _wait(self) -> float:
        if not self.pending:
            return POLL_S
        oldest = next(iter(self.pending.values()))
        return max(0.0, min(POLL_S, oldest.deadline - time.monotonic()))

    def _accept_all(self) -> None:
        """Every connection waiting in the backlog, each greeted with our challenge."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError:  # out of file descriptors: make room, else try again later
                if not self.pending:
                    time.sleep(POLL_S)
                    return
                self._refuse(next(iter(self.pending)))
                continue
            if len(self.pending) >= MAX_PENDING:
                self._refuse(next(iter(self.pending)))
            peer = _Peer(sock, time.monotonic() + HANDSHAKE_S, os.urandom(wire.CHALLENGE_BYTES))
            sock.setblocking(False)
            self.pending[sock] = peer
            self.selector.register(sock, selectors.EVENT_READ)
            self._send(peer, wire.MAGIC + peer.challenge)

    def _read(self, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(peer.need - len(peer.buf))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._refuse(peer.sock)
            return
        peer.buf += data
        if len(peer.buf) == peer.need:
            got, peer.buf = bytes(peer.buf), bytearray()
            self._step(peer, got)

    def _step(self, peer: _Peer, got: bytes) -> None:
        """One stage of the handshake complete: answer, check, or admit."""
        if peer.stage == "challenge":
            if got[: len(wire.MAGIC)] != wire.MAGIC:
                self._refuse(peer.sock)
                return
            peer.stage = "answer"
            self._send(peer, wire.answer(self.secret, got[len(wire.MAGIC) :], b"trainer"))
        elif peer.stage == "answer":
            if not hmac.compare_digest(got, wire.answer(self.secret, peer.challenge, b"node")):
                self._refuse(peer.sock)
                return
            peer.stage = "index"
        else:
            self._admit(peer, wire.LENGTH.unpack(got)[0])

    def _admit(self, peer: _Peer, index: int) -> None:
        sock = peer.sock
        self._forget(sock)
        try:
            sock.settimeout(SEND_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self.admit(index, sock):
                raise wire.WireError(f"no node {index} waits for a connection")
            sock.sendall(wire.ADMITTED)
            sock.settimeout(None)
        except (OSError, wire.WireError):
            self.refused()  # counted before the peer can see the close
            sock.close()

    def _send(self, peer: _Peer, data: bytes) -> None:
        """A few bytes into a fresh socket's empty buffer; a peer that will not take them is
        refused."""
        try:
            if peer.sock.send(data) == len(data):
                return
        except OSError:
            pass
        self._refuse(peer.sock)

    def _expire(self) -> None:
        now = time.monotonic()
        while self.pending:
            sock, peer = next(iter(self.pending.items()))
            if peer.deadline > now:
                return
            self._refuse(sock)

    def _forget(self, sock: socket.socket) -> None:
        if self.pending.pop(sock, None) is not None:
            self.selector.unregister(sock)

    def _refuse(self, sock: socket.socket) -> None:
        if sock not in self.pending:
            return
        self._forget(sock)
        self.refused()  # counted before the peer can see the close
        sock.close()

    def close(self) -> None:
        """Stop the thread; the listener and every handshake still open are closed."""
        self.closed = True
        self.thread.join(HANDSHAKE_S)


def dial(
    host: str,
    port: int,
    secret: bytes,
    index: int,
    timeout: float,
    unreachable_s: float = UNREACHABLE_S,
) -> socket.socket:
    """The node's side: connect to the trainer as node ``index`` and prove the secret, trying
    again until ``timeout`` seconds have passed, or ``unreachable_s`` of tries in a row that
    could not open a TCP connection at all (a closed or firewalled port: no flood does that);
    then a WireError with the last failure."""
    start = time.monotonic()
    deadline, pause, tries = start + timeout, RETRY_S, 0
    unreached_since: float | None = None
    while True:
        tries += 1
        left = deadline - time.monotonic()
        try:
            return _try(host, port, secret, index, max(0.1, min(HANDSHAKE_S, left)))
        except _Unreachable as exc:
            why: BaseException = exc.__cause__ or exc
            unreached_since = unreached_since or time.monotonic()
        except (OSError, EOFError, wire.WireError) as exc:
            why, unreached_since = exc, None
        spent = time.monotonic() - (unreached_since or start)
        if time.monotonic() + pause >= deadline or (unreached_since and spent >= unreachable_s):
            raise wire.WireError(
                f"{type(why).__name__}: {why} (after {tries} tries in "
                f"{time.monotonic() - start:.0f} s)"
            ) from why
        time.sleep(pause)
        pause = min(2 * pause, RETRY_MAX_S)


class _Unreachable(Exception):
    """No TCP connection could be opened (its cause says why)."""


def _try(host: str, port: int, secret: bytes, index: int, timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise _Unreachable from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.prove(sock, secret, b"node", b"trainer")
        sock.sendall(wire.LENGTH.pack(index))
        if wire.recv_exact(sock, len(wire.ADMITTED)) != wire.ADMITTED:
            raise wire.WireError("the trainer did not take this connection")
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock
