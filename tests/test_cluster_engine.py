"""The cluster engine's policy without Ray: which node gets a lost batch, when a batch is to
blame, and what happens when every node is gone (a stand-in for the nodes, a real ring)."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import pytest

from stoker.errors import ClusterError
from stoker.schema import SlotLayout
from stoker.workers.cluster import ClusterEngine, MixedPool, Node
from stoker.workers.engine import RingSpec

LAYOUT = SlotLayout(2, (("image", "|u1", (4, 4, 3)), ("index", "<i8", ())))


@dataclass
class StandIn:
    """What ClusterEngine asks of ``cluster.Nodes``, recording the requests."""

    nodes: list[Node]
    sent: list[tuple[int, tuple[int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cores = sum(n.cores for n in self.nodes)
        self.wake_r, self.wake_w = socket.socketpair()

    def node_of(self, wid: int) -> Node:
        return next(n for n in self.nodes if wid in n.wids)

    def request(self, wid, key, slot, seg) -> None:
        self.sent.append((wid, key))

    def forget(self, node: Node) -> None:
        node.alive = False

    def live_cores(self) -> int:
        return sum(n.cores for n in self.nodes if n.alive)

    def report(self) -> dict:
        return {}

    def close(self) -> None:
        self.wake_r.close()
        self.wake_w.close()


def _engine(count: int) -> tuple[ClusterEngine, StandIn]:
    nodes = StandIn([Node(k, f"node{k}", f"10.0.0.{k}", 1, k) for k in range(count)])
    pool = MixedPool(None, nodes)  # type: ignore[arg-type]
    ring = RingSpec(
        LAYOUT,
        slots=count + 2,
        per_worker=1,
        batches=10,
        folder="/dev/shm",
        timeout=5.0,
        name=str,
        deepest=1,
    )
    engine = ClusterEngine(
        pool, ring, samples=lambda key: [f"img{key[1] * 2}.jpg", f"img{key[1] * 2 + 1}.jpg"]
    )
    return engine, nodes


def _lose(engine: ClusterEngine, wid: int) -> None:
    with pytest.warns(Warning, match="left"):
        engine._handle(wid, ("lost", -1, -1, -1, "killed"))


def test_a_lost_nodes_batches_go_to_the_live_nodes_and_the_third_loss_names_the_batch():
    engine, nodes = _engine(3)
    try:
        engine._reset((0, 0))
        engine._fill_window()
        first = {key: wid for wid, key in nodes.sent}
        assert set(first) == {(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)}  # 3 nodes x (1 + 1)
        victim = first[(0, 0)]
        _lose(engine, victim)
        moved = engine.inflight[(0, 0)][0]
        assert moved != victim and moved not in engine.dead
        assert nodes.nodes[victim].reissued == sum(1 for w in first.values() if w == victim)
        _lose(engine, moved)
        last = engine.inflight[(0, 0)][0]
        assert last not in (victim, moved)
        with (
            pytest.warns(Warning, match="left"),
            pytest.raises(
                ClusterError,
                match=r"(?s)batch 0 of epoch 0 was on 3 cluster nodes that died.*"
                r"img0\.jpg\n  img1\.jpg",
            ),
        ):
            engine._handle(last, ("lost", -1, -1, -1, "killed"))
    finally:
        engine.close()
        nodes.close()


def test_with_every_node_gone_and_no_local_worker_the_error_says_so():
    engine, nodes = _engine(1)
    try:
        engine._reset((0, 0))
        engine._fill_window()
        with (
            pytest.warns(Warning, match="left"),
            pytest.raises(ClusterError, match="every cluster node is gone.*workers=0"),
        ):
            engine._handle(0, ("lost", -1, -1, -1, "killed"))
    finally:
        engine.close()
        nodes.close()


def test_a_hang_on_a_node_names_the_node():
    engine, nodes = _engine(2)
    try:
        assert engine._sample(1) == "a batch on cluster node 10.0.0.1"
    finally:
        engine.close()
        nodes.close()
