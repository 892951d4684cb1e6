"""The trainer's data port (``workers.door``) and a node's dial, on loopback without Ray: every
connection is authenticated on its own, so silent, garbage and flooding peers hold up no node."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import pytest

from stoker.workers import door as door_mod
from stoker.workers import wire

SECRET = os.urandom(32)


class Trainer:
    """A Door on 127.0.0.1 that admits nodes 0 and 1 once each, counting what it refuses."""

    def __init__(self) -> None:
        self.admitted: dict[int, socket.socket] = {}
        self.refused = 0
        self.door = door_mod.Door(door_mod.listen("127.0.0.1"), SECRET, self.admit, self.refuse)
        self.address = ("127.0.0.1", self.door.port)

    def admit(self, index: int, sock: socket.socket) -> bool:
        if index not in (0, 1) or index in self.admitted:
            return False
        self.admitted[index] = sock
        return True

    def refuse(self) -> None:
        self.refused += 1


@pytest.fixture
def trainer() -> Iterator[Trainer]:
    made = Trainer()
    try:
        yield made
    finally:
        made.door.close()
        for sock in made.admitted.values():
            sock.close()


def _until_closed(sock: socket.socket) -> None:
    """Read until the trainer closes ``sock`` (it counts a refusal before closing)."""
    with contextlib.suppress(ConnectionError):
        while sock.recv(4096):
            pass


@pytest.mark.timeout(60)
def test_a_node_gets_in_past_silent_and_garbage_connections(trainer):
    silent = [socket.create_connection(trainer.address, timeout=30) for _ in range(3)]
    garbage = socket.create_connection(trainer.address, timeout=30)
    garbage.sendall(b"GET / HTTP/1.1\r\n\r\n" + b"x" * 64)
    try:
        node = door_mod.dial(*trainer.address, SECRET, 1, timeout=30)
        with node:
            trainer.admitted[1].sendall(b"batch")  # the admitted socket is the node's
            assert wire.recv_exact(node, 5) == b"batch"
        _until_closed(garbage)
        assert trainer.refused == 1  # the garbage; the silent ones are still in their budget
    finally:
        for sock in [*silent, garbage]:
            sock.close()


@pytest.mark.timeout(60)
def test_a_flood_beyond_the_pending_bound_drops_the_oldest_not_the_node(trainer, monkeypatch):
    monkeypatch.setattr(door_mod, "MAX_PENDING", 4)
    flood = [socket.create_connection(trainer.address, timeout=30) for _ in range(10)]
    try:
        with door_mod.dial(*trainer.address, SECRET, 0, timeout=30):
            assert 0 in trainer.admitted
        assert trainer.refused >= 6  # each flood connection past the bound dropped the oldest
    finally:
        for sock in flood:
            sock.close()


@pytest.mark.timeout(60)
def test_a_node_without_the_secret_or_a_second_one_for_an_index_is_refused(trainer):
    with pytest.raises(wire.WireError, match="secret"):
        door_mod.dial(*trainer.address, os.urandom(32), 0, timeout=0.5)
    assert trainer.refused >= 1 and not trainer.admitted
    door_mod.dial(*trainer.address, SECRET, 0, timeout=30).close()
    refused = trainer.refused
    with pytest.raises(wire.WireError, match="EOFError"):  # the trainer closed it: no node 0
        door_mod.dial(*trainer.address, SECRET, 0, timeout=0.5)
    assert trainer.refused > refused


@pytest.mark.timeout(60)
def test_a_port_where_no_connection_opens_is_given_up_before_the_timeout():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(wire.WireError, match="ConnectionRefusedError"):
        door_mod.dial("127.0.0.1", port, SECRET, 0, timeout=3600, unreachable_s=0.5)
