"""The cluster's data path: a fixed binary frame over TCP, and the per-job secret that guards it.

A frame is a fixed header (``HEAD``: magic, protocol version, kind, ticket, epoch, batch, the
report's length, the number of fields), one 8-byte length per field, the batch's report as
JSON, then each field's bytes. The trainer reads the field bytes with ``recv_into`` straight
into its ring slot; nothing in a frame is unpickled. A request (trainer to node) is a header
alone.

Both ends prove they hold the job's secret before anything else is read: each sends a random
challenge and answers the other's with ``HMAC-SHA256(secret, challenge + role)``; the node then
sends its index and waits for ``ADMITTED``. A peer without the secret is refused (the
connection is closed) and counted in ``stats()``; ``door`` runs the trainer's side of it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..assemble import Report
from ..errors import StokerError
from ..sources.fetch import RequestCounts

MAGIC = b"STKR"
PROTOCOL = 2
DATA, ERROR, REQUEST = 1, 2, 3
HEAD = struct.Struct("<4sHBxQqqII")  # magic, protocol, kind, ticket, epoch, batch, report, fields
LENGTH = struct.Struct("<Q")
CHALLENGE_BYTES = 32
DIGEST_BYTES = 32
MAX_REPORT_BYTES = 64 << 20
MAX_FIELDS = 4096
DRAIN_CHUNK = 1 << 20
ADMITTED = b"\x01"  # the trainer took this node's connection


class WireError(StokerError):
    """A peer broke the protocol or failed to prove it holds the job's secret."""


@dataclass(frozen=True)
class Header:
    """One frame's fixed part: what it is, which request it answers, how long its parts are."""

    kind: int
    ticket: int
    epoch: int
    batch: int
    report_len: int
    lengths: tuple[int, ...]

    @property
    def key(self) -> tuple[int, int]:
        """The batch key ``(epoch, batch)``."""
        return (self.epoch, self.batch)


def new_secret() -> bytes:
    """A fresh per-job secret."""
    return os.urandom(32)


def pack_header(
    kind: int, ticket: int, key: tuple[int, int], report: bytes, lengths: Sequence[int]
) -> bytes:
    """The header and field lengths of a frame (its report and field bytes follow)."""
    head = HEAD.pack(MAGIC, PROTOCOL, kind, ticket, key[0], key[1], len(report), len(lengths))
    return head + b"".join(LENGTH.pack(n) for n in lengths)


def recv_exact(sock: socket.socket, nbytes: int) -> bytes:
    """Exactly ``nbytes`` from ``sock``; EOFError when the peer closed first."""
    buf = bytearray(nbytes)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (no copy); EOFError when the peer closed first."""
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            raise EOFError("the peer closed the connection")
        got += n


def drain(sock: socket.socket, nbytes: int) -> None:
    """Read and drop ``nbytes`` (a frame nobody waits for any more)."""
    scratch = memoryview(bytearray(min(nbytes, DRAIN_CHUNK) or 1))
    while nbytes > 0:
        step = min(nbytes, len(scratch))
        recv_into_exact(sock, scratch[:step])
        nbytes -= step


def read_header(sock: socket.socket) -> Header:
    """The next frame's header; WireError for anything that is not a stoker frame."""
    return parse_header(recv_exact(sock, HEAD.size), lambda n: recv_exact(sock, n))


def parse_header(head: bytes, more: Any) -> Header:
    """A header from its fixed bytes; ``more(n)`` gives the ``n`` bytes of lengths after it."""
    magic, protocol, kind, ticket, epoch, batch, report_len, nfields = HEAD.unpack(head)
    if magic != MAGIC:
        raise WireError(f"not a stoker frame (magic {magic!r})")
    if protocol != PROTOCOL:
        raise WireError(
            f"stoker wire protocol {protocol}, this stoker speaks {PROTOCOL}: "
            "install the same stoker version on every node"
        )
    if kind not in (DATA, ERROR, REQUEST) or nfields > MAX_FIELDS or report_len > MAX_REPORT_BYTES:
        raise WireError(
            f"malformed stoker frame (kind {kind}, {nfields} fields, report {report_len} bytes)"
        )
    raw = more(nfields * LENGTH.size) if nfields else b""
    lengths = tuple(LENGTH.unpack_from(raw, k * LENGTH.size)[0] for k in range(nfields))
    return Header(kind, ticket, epoch, batch, report_len, lengths)


def send_request(sock: socket.socket, ticket: int, key: tuple[int, int]) -> None:
    """Ask a node for batch ``key`` under ``ticket``."""
    sock.sendall(pack_header(REQUEST, ticket, key, b"", ()))


def send_frame(
    sock: socket.socket,
    kind: int,
    ticket: int,
    key: tuple[int, int],
    report: bytes,
    parts: Sequence[memoryview],
) -> None:
    """A data or error frame: header, report, then each part straight from its memory."""
    sock.sendall(pack_header(kind, ticket, key, report, [p.nbytes for p in parts]) + report)
    for part in parts:
        sock.sendall(part)


# ---------------------------------------------------------------------------- reports


def report_bytes(report: Report) -> bytes:
    """A batch's report as JSON (its bad and warned samples, counts and timings)."""
    return json.dumps(asdict(report), separators=(",", ":")).encode()


def report_from(data: bytes) -> Report:
    """The Report of ``report_bytes``."""
    fields = json.loads(data)
    fields["bad"] = [tuple(b) for b in fields["bad"]]
    fields["warned"] = [tuple(w) for w in fields["warned"]]
    if "requests" in fields:
        fields["requests"] = RequestCounts(**fields["requests"])
    return Report(**fields)


# ---------------------------------------------------------------------------- the secret


def answer(secret: bytes, challenge: bytes, role: bytes) -> bytes:
    """The answer to ``challenge`` by the side called ``role`` (``b"trainer"``, ``b"node"``)."""
    return hmac.new(secret, challenge + role, hashlib.sha256).digest()


def prove(sock: socket.socket, secret: bytes, ours: bytes, theirs: bytes) -> None:
    """One side of the mutual challenge: send our challenge, answer theirs, check their answer.

    ``ours``/``theirs`` are the role names (``b"trainer"``, ``b"node"``)."""
    challenge = os.urandom(CHALLENGE_BYTES)
    sock.sendall(MAGIC + challenge)
    got = recv_exact(sock, len(MAGIC) + CHALLENGE_BYTES)
    if got[: len(MAGIC)] != MAGIC:
        raise WireError("the peer is not a stoker cluster node")
    sock.sendall(answer(secret, got[len(MAGIC) :], ours))
    got_answer = recv_exact(sock, DIGEST_BYTES)
    if not hmac.compare_digest(got_answer, answer(secret, challenge, theirs)):
        raise WireError("the peer does not hold this job's secret")
