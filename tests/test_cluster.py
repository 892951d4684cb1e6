"""Loader(cluster=...): decode actors on Ray nodes give exactly the batches of workers=0.

One simulated Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPU, where this
trainer runs, and two 1-CPU nodes) serves the whole module: each start costs seconds and
about half a GB. Faults are made by handshakes, never by delays: a node's worker processes
are stopped (SIGSTOP) so that its batches are surely in flight, then its actor is killed or
its node removed. The trainer listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import stoker
from helpers import global_steps
from stoker.workers import actor as actor_mod
from stoker.workers import cluster as cluster_mod
from stoker.workers import wire

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed"),
]
CORPUS = Path(__file__).parent / "corpus" / "jpeg"
HOST = "127.0.0.1"
FIELDS = ("image", "label", "index")
COMMON = {
    "batch_size": 4,
    "image_size": 32,
    "augment": "train",
    "seed": 3,
    "max_errors": 20,
    "timeout": 120.0,
}


@pytest.fixture(scope="module")
def ray_cluster():
    """A head node without CPUs (the trainer's) and two 1-CPU nodes."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
    )
    nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    cluster.wait_for_nodes()
    try:
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


def _ours(proc: psutil.Process) -> bool:
    """A process of stoker's: a worker, a reaper, or a decode actor."""
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "stoker" in line or "Decoder" in line


def _stoker_segments() -> set[str]:
    """stoker's segments made by this process tree (or by a process now gone): the machine
    is shared with other test runs, whose segments are theirs."""
    tree = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    found = set()
    for path in Path("/dev/shm").glob("stoker_*"):
        pid = path.name.split("_")[1]
        if not pid.isdigit() or int(pid) in tree or not psutil.pid_exists(int(pid)):
            found.add(path.name)
    return found


@pytest.fixture(autouse=True)
def no_leaks():
    """This module's leak check: Ray's own daemons and idle workers come and go, so only
    stoker's processes (workers, reapers, actors) and segments count."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    segs = _stoker_segments()
    yield
    deadline = time.monotonic() + 15.0
    while True:
        kids = [
            p
            for p in psutil.Process().children(recursive=True)
            if p.pid not in before
            and _ours(p)
            and p.status() != psutil.STATUS_ZOMBIE
            and not (p.ppid() == os.getpid() and "reaper.py" in " ".join(p.cmdline()))
        ]
        left = sorted(_stoker_segments() - segs)
        if not kids and not left:
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"test leaked: processes {[' '.join(p.cmdline()) for p in kids]}, segments {left}",
                pytrace=False,
            )
        time.sleep(0.1)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """An ImageFolder of awkward JPEGs: progressive, arithmetic, odd sampling, CMYK, grey,
    and corrupt files (each replaced by a good sample and counted once)."""
    import io

    from PIL import Image

    root = tmp_path_factory.mktemp("cluster_data")
    for k, path in enumerate(sorted(CORPUS.glob("*.jpg"))):
        folder = root / ("corpus_a" if k % 2 else "corpus_b")
        folder.mkdir(exist_ok=True)
        shutil.copy(path, folder / path.name)
    odd = root / "odd"
    odd.mkdir()
    im = Image.linear_gradient("L").resize((96, 64)).convert("RGB")
    for mode in ("CMYK", "L", "RGB"):
        buf = io.BytesIO()
        im.convert(mode).save(buf, "JPEG", quality=85, progressive=mode == "RGB")
        (odd / f"{mode.lower()}.jpg").write_bytes(buf.getvalue())
    (odd / "bad_text.jpg").write_bytes(b"not an image\n" * 10)
    (odd / "bad_truncated.jpg").write_bytes((odd / "rgb.jpg").read_bytes()[:300])
    return root


def _digests(batches) -> list[str]:
    return [hashlib.sha256(b"".join(a.tobytes() for a in batch)).hexdigest() for batch in batches]


def _reference(dataset: Path, epochs: int = 1, **kw) -> tuple[list[str], list[tuple[str, str]]]:
    with pytest.warns(stoker.StokerWarning):
        with stoker.Loader(dataset, workers=0, **{**COMMON, **kw}) as loader:
            out = []
            for _ in range(epochs):
                out += _digests(loader)
            return out, sorted(loader.stats().bad_files)


def _cluster_loader(dataset: Path, **kw) -> stoker.Loader:
    args = {**COMMON, "workers": 0, "cluster": "ray", "cluster_listen": HOST, **kw}
    return stoker.Loader(dataset, **args)


@contextlib.contextmanager
def _quiet():
    """Bad samples' warnings are expected here, whether or not these batches hold one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stoker.StokerWarning)
        yield


def _bad_names(report) -> list[str]:
    return sorted(name for name, _ in report.bad_files)


@contextlib.contextmanager
def _one_batch_in(
    dataset: Path, warns: str | None, **kw
) -> Iterator[tuple[stoker.Loader, Iterator, list[str], list[dict]]]:
    """A cluster loader one batch into its epoch, under ``pytest.warns(match=warns)``: yields
    the loader, its batch iterator, the first batch's digest and the nodes' rows."""
    with pytest.warns(stoker.StokerWarning, match=warns):
        with _cluster_loader(dataset, **kw) as loader:
            batches = iter(loader)
            got = _digests([next(batches)])
            yield loader, batches, got, loader.stats().cluster["nodes"]


@pytest.mark.timeout(300)
def test_batches_are_bit_identical_to_workers_0_over_tcp_and_the_object_store(ray_cluster, dataset):
    want, bad = _reference(dataset, epochs=2)
    with pytest.warns(stoker.StokerWarning, match=r"\[node "):
        with _cluster_loader(dataset) as loader:  # remote only, the TCP path
            got = _digests(loader) + _digests(loader)
            report = loader.stats()
    assert got == want
    assert _bad_names(report) == sorted(n for n, _ in bad)  # each bad sample once, over 2 epochs
    assert report.cluster["transport"] == "tcp" and report.cluster["cores"] == 2
    assert all(n["batches"] > 0 for n in report.cluster["nodes"])
    assert report.cluster["listen"].startswith(f"{HOST}:")
    assert "cluster: 2 remote core(s) over tcp" in str(report)
    with pytest.warns(stoker.StokerWarning):
        with _cluster_loader(
            dataset, workers=1, cluster_workers=1, cluster_transport="object_store"
        ) as loader:  # local + remote
            got = _digests(loader) + _digests(loader)
            report = loader.stats()
    assert got == want
    assert report.cluster["transport"] == "object_store"
    assert [n["cores"] for n in report.cluster["nodes"]] == [1]


def _stop(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def _resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# The mid-epoch tests' handshake: every node's workers (and the local ones) are stopped, the
# node is ended, and the others resume only once the loader counts it gone. The epoch cannot
# end before the loss is seen: with one-image batches it is longer than the ring, so batches
# are still to come from the stopped workers. Whatever the lost node held goes to the others.
ONE = {"batch_size": 1}


def _stop_all(loader: stoker.Loader, rows: list[dict]) -> list[int]:
    """Stop every node's workers and the loader's local ones; returns their pids (to resume)."""
    pids = [pid for row in rows for pid in row["workers"]]
    local = loader._supply.running.pool.local  # type: ignore[union-attr]
    pids += [proc.pid for proc in (local.procs if local is not None else [])]
    _stop(pids)
    return pids


def _until_dead(loader: stoker.Loader, index: int) -> None:
    """Wait until the loader counts node ``index`` as gone (its connection broke)."""
    deadline = time.monotonic() + 120
    while loader.stats().cluster["nodes"][index]["alive"]:
        assert time.monotonic() < deadline, f"node {index} still counts as alive"
        time.sleep(0.01)


def _lose_node(loader: stoker.Loader, batches, rows: list[dict], index: int, end) -> list[str]:
    """The rest of the epoch, node ``index`` ended by ``end(row)`` while every worker is
    stopped (the handshake above)."""
    assert loader.stats().cluster["ring_slots"] < len(loader) - 1, "the epoch must outlast the ring"
    held = _stop_all(loader, rows)
    try:
        end(rows[index])
        _until_dead(loader, index)
    finally:
        _resume(held)  # the lost node's workers see their parent gone and exit
    return _digests(batches)


def _assert_whole_without_node_0(got: list[str], want: list[str], report, bad) -> None:
    """The epoch came whole (the reference's batches and bad files) though node 0 failed in
    it: node 0 counts as dead with batches reissued, node 1 as alive."""
    assert got == want
    assert _bad_names(report) == sorted(n for n, _ in bad)
    rows = report.cluster["nodes"]
    assert rows[0]["alive"] is False and rows[1]["alive"] is True


@pytest.mark.timeout(300)
def test_an_actor_killed_mid_epoch_loses_and_repeats_nothing(ray_cluster, dataset):
    want, bad = _reference(dataset, **ONE)
    with _one_batch_in(dataset, "left", **ONE) as (loader, batches, got, rows):
        got += _lose_node(loader, batches, rows, 0, lambda row: os.kill(row["pid"], signal.SIGKILL))
        report = loader.stats()
    _assert_whole_without_node_0(got, want, report, bad)


@pytest.mark.timeout(300)
def test_a_hung_node_has_its_batches_reissued_after_the_timeout(ray_cluster, dataset):
    want, bad = _reference(dataset, **ONE)
    with _one_batch_in(dataset, "hung", timeout=20.0, **ONE) as (loader, batches, got, rows):
        row = rows[0]
        victims = _victims(row)
        _stop(row["workers"])  # its actor answers; its batches never come
        got += _digests(batches)
        report = loader.stats()
    _assert_whole_without_node_0(got, want, report, bad)
    assert report.cluster["nodes"][0]["reissued"] >= 1  # the batch it hung on
    _assert_cleaned_up(victims, [], 60)  # the node's reaper kills its stopped workers


def _until_gone(node_id: str) -> None:
    """Wait until Ray itself counts a removed node as dead (its health checks take a while),
    so that later tests are not placed on it."""
    import ray

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
            return
        time.sleep(0.2)
    raise AssertionError(f"Ray still counts node {node_id} as alive")


@pytest.mark.timeout(300)
def test_a_removed_node_loses_and_repeats_nothing(ray_cluster, dataset):
    cluster, _ = ray_cluster
    extra = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    try:
        want, bad = _reference(dataset, **ONE)
        with _one_batch_in(dataset, "left", **ONE) as (loader, batches, got, rows):
            index = next(k for k, r in enumerate(rows) if r["id"] == extra.node_id[:12])

            def remove(row) -> None:
                cluster.remove_node(extra, allow_graceful=False)
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.wait_procs([psutil.Process(row["pid"])], timeout=60)

            got += _lose_node(loader, batches, rows, index, remove)
            report = loader.stats()
    finally:
        if extra in cluster.worker_nodes:
            cluster.remove_node(extra)
        _until_gone(extra.node_id)
    # The removed node's actor dies before it can unlink its segments; its detached reaper
    # removes them (the no_leaks check waits for that).
    assert got == want
    assert _bad_names(report) == sorted(n for n, _ in bad)
    assert report.cluster["nodes"][index]["alive"] is False


@pytest.mark.timeout(300)
def test_every_node_gone_raises_without_local_workers_and_carries_on_with_them(
    ray_cluster, dataset
):
    want, _ = _reference(dataset, **ONE)
    kill = lambda row: os.kill(row["pid"], signal.SIGKILL)  # noqa: E731
    for workers in (0, 1):
        with _one_batch_in(dataset, None, workers=workers, cluster_workers=1, **ONE) as (
            loader,
            batches,
            got,
            rows,
        ):
            if workers == 0:
                with pytest.raises(cluster_mod.ClusterError, match="every cluster node"):
                    _lose_node(loader, batches, rows, 0, kill)
            else:
                got += _lose_node(loader, batches, rows, 0, kill)
                assert got == want


@pytest.mark.timeout(300)
def test_resume_with_another_node_count_or_no_cluster_gives_the_same_tail(ray_cluster, dataset):
    want, _ = _reference(dataset)
    with _quiet():
        with _cluster_loader(dataset, cluster_workers=2) as loader:
            batches = iter(loader)
            head = _digests([next(batches) for _ in range(3)])
            state = json.loads(json.dumps(loader.state_dict()))
    assert head == want[:3]
    with _quiet():
        with _cluster_loader(dataset, cluster_workers=1) as loader:
            loader.load_state_dict(state)
            assert _digests(loader) == want[3:]
    with _quiet():
        with stoker.Loader(dataset, workers=1, **COMMON) as loader:
            loader.load_state_dict(state)
            assert _digests(loader) == want[3:]


def _close(loaders: list[stoker.Loader]) -> None:
    for loader in loaders:
        loader.close()


def _cluster_ranks(world: int, batch_size: int, make) -> list[stoker.Loader]:
    """``world`` in-process ranks of ``batch_size``, rank ``r`` made by ``make(r, kw)``."""
    kw = {**COMMON, "batch_size": batch_size, "world_size": world, "batch": FIELDS}
    kw["drop_last"] = False  # each rank would drop its own last partial batch, and "pad"
    kw["rank_split"] = "once"  # fill the last step up to the world size: 31 samples
    return [make(r, {**kw, "rank": r}) for r in range(world)]


@pytest.mark.timeout(300)
def test_a_job_resumed_on_fewer_nodes_other_ranks_and_no_cluster_gives_the_same_global_batches(
    ray_cluster, dataset
):
    """1 rank x 8 on 2 nodes, saved after step 1; 2 ranks x 4 (rank 0 on 1 node and 2 local
    workers, rank 1 local), saved after step 2; 4 ranks x 2 without a cluster, workers=0: every
    global batch of both epochs is the uninterrupted 1 x 8 workers=0 run's, byte for byte."""
    local = lambda r, kw: stoker.Loader(dataset, **{**kw, "workers": 0})  # noqa: E731
    with _quiet():
        whole_run = _cluster_ranks(1, 8, local)
        whole = global_steps(whole_run) + global_steps(whole_run)  # two epochs
        first = _cluster_ranks(
            1, 8, lambda r, kw: _cluster_loader(dataset, cluster_workers=2, **kw)
        )
        got = global_steps(first, 1)
        state = json.loads(json.dumps(first[0].state_dict()))
        assert len(first[0].stats().cluster["nodes"]) == 2
        _close(first)  # its actors hold both nodes' CPUs
        on_one = lambda r, kw: (  # noqa: E731
            _cluster_loader(dataset, cluster_workers=1, **{**kw, "workers": 2})
            if r == 0
            else stoker.Loader(dataset, **{**kw, "workers": 1})
        )
        second = _cluster_ranks(2, 4, on_one)
        for loader in second:
            loader.load_state_dict(state)
        got += global_steps(second, 1)
        state = json.loads(json.dumps(second[1].state_dict()))
        assert len(second[0].stats().cluster["nodes"]) == 1
        _close(second)
        third = _cluster_ranks(4, 2, local)
        for loader in third:
            loader.load_state_dict(state)
        got += global_steps(third) + global_steps(third)
        _close(whole_run + third)
    assert len(whole) == 8 and got == whole  # 31 samples: 4 steps an epoch
    assert "world_size 2 -> 4" in third[0].resume_note


@pytest.mark.timeout(240)
def test_batches_in_flight_never_exceed_the_ring(ray_cluster, dataset):
    import ray

    with _quiet():
        with _cluster_loader(dataset, batch_size=2) as loader:
            batches = iter(loader)
            next(batches)
            next(batches)
            time.sleep(1.0)  # room for a loader without back-pressure to run ahead
            nodes = loader._supply.running.pool.nodes.nodes  # type: ignore[union-attr]
            counts = ray.get([n.actor.counts.remote() for n in nodes])
            report = loader.stats().cluster
            assert len(loader) > 2 + report["ring_slots"]  # so running ahead would show
            assert sum(c["requests"] for c in counts) <= 2 + report["ring_slots"]
            assert report["max_in_flight"] <= report["ring_slots"]


@pytest.mark.timeout(240)
def test_a_connection_without_the_secret_is_refused_and_counted(ray_cluster, dataset):
    with _quiet():
        with _cluster_loader(dataset, cluster_workers=1) as loader:
            batches = iter(loader)
            first = next(batches)
            host, port = loader.stats().cluster["listen"].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(wire.MAGIC + os.urandom(wire.CHALLENGE_BYTES))
                wire.recv_exact(sock, len(wire.MAGIC) + wire.CHALLENGE_BYTES)
                sock.sendall(os.urandom(wire.DIGEST_BYTES))  # a guess, not the HMAC
                wire.recv_exact(sock, wire.DIGEST_BYTES)
                with pytest.raises((EOFError, ConnectionError)):
                    while True:  # the trainer closes the connection: nothing else comes
                        wire.recv_exact(sock, 1)
            assert loader.stats().cluster["refused"] == 1
            rest = list(batches)
    assert len(rest) == len(loader) - 1 and first[0].shape == (4, 32, 32, 3)


TRAINER = """
import json, sys, time, ray, stoker
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
loader = stoker.Loader(sys.argv[2], batch_size=2, image_size=32, workers=0, max_errors=20,
                       cluster="ray", cluster_listen="127.0.0.1")
batches = iter(loader)
next(batches)
rows = loader.stats().cluster["nodes"]
print(json.dumps([[r["pid"], *r["workers"]] for r in rows]), flush=True)
time.sleep(600)
"""


def _reapers_of(pids: list[int]) -> list[int]:
    """The reaper processes watching any of ``pids`` (a reaper's last argument is its owner)."""
    owners = {str(p) for p in pids}
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        line = proc.info["cmdline"] or []
        if any(arg.endswith("reaper.py") for arg in line) and line[-1] in owners:
            found.append(proc.pid)
    return found


def _segments_of(pids: list[int]) -> list[str]:
    """Segments and lock files in /dev/shm made by any of ``pids``."""
    prefixes = tuple(f"stoker_{p}_" for p in pids)
    return sorted(p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(prefixes))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _victims(row: dict) -> list[int]:
    """A node's row's processes: its actor, the actor's workers and the actor's reaper."""
    return [row["pid"], *row["workers"], *_reapers_of([row["pid"]])]


def _assert_cleaned_up(
    pids: list[int], owners: list[int], seconds: float, on: str = "", on_files: str = ""
) -> None:
    """Wait up to ``seconds`` until none of ``pids`` runs and no segment or lock file of
    ``owners`` is left; fail naming what is left (``on``, ``on_files``: where, for the message)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _running(p)]
        left = _segments_of(owners)
        if not alive and not left:
            break
        time.sleep(0.1)
    assert not alive, f"processes left{on}: {alive}"
    assert not left, f"segments or lock files left{on_files}: {left}"


@pytest.mark.timeout(300)
def test_a_trainer_killed_mid_epoch_leaves_no_segment_lock_or_process_on_any_node(
    ray_cluster, dataset
):
    cluster, _ = ray_cluster
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(TRAINER), cluster.address, str(dataset)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # the handshake: mid-epoch, nodes busy
        assert line, "the trainer ended before its first batch"
        rows = json.loads(line)
        actors = [row[0] for row in rows]
        pids = [pid for row in rows for pid in row] + _reapers_of([proc.pid, *actors])
        assert len(pids) == 2 * len(actors) + len(actors) + 1  # actor, worker, reaper; trainer's
        assert all(_segments_of([a]) for a in actors)  # each node has its segments and lock
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    _assert_cleaned_up(pids, [proc.pid, *actors], 90, " on the cluster", " on the nodes")


@pytest.mark.timeout(300)
def test_an_actor_killed_by_ray_leaves_no_segment_lock_or_process_on_its_node(ray_cluster, dataset):
    import ray

    want, _ = _reference(dataset, **ONE)
    with _one_batch_in(dataset, "left", **ONE) as (loader, batches, got, rows):
        row = rows[0]
        victims = _victims(row)
        assert len(victims) == 3 and _segments_of([row["pid"]])
        # Ray's own kill: the actor's process exits, killing its direct children with it
        actor = loader._supply.running.pool.nodes.nodes[0].actor  # type: ignore[union-attr]
        got += _lose_node(loader, batches, rows, 0, lambda _: ray.kill(actor, no_restart=True))
    assert got == want
    _assert_cleaned_up(victims, [row["pid"]], 60, " on the node", " on the node")


NODE_CMD = (
    'mount -t tmpfs -o size=1m tmpfs "$0" && exec ray start --address="$1" --num-cpus=1 '
    "--node-ip-address=127.0.0.1 --block --disable-usage-stats"
)


@contextlib.contextmanager
def _node_without(folder: Path, address: str):
    """A 1-CPU Ray node (``ray start``) in a mount namespace of its own, where ``folder`` is an
    empty tmpfs: the data exists on the trainer only, as on a node without the shared mount.
    Yields the node's id."""
    import ray

    before = {n["NodeID"] for n in ray.nodes()}
    node = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", NODE_CMD, str(folder), address],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    node_id = ""
    try:
        deadline = time.monotonic() + 120
        while not node_id and time.monotonic() < deadline:
            assert node.poll() is None, "ray start ended"
            new = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] not in before]
            node_id = new[0] if new else ""
            time.sleep(0.2)
        assert node_id, "the extra node did not join"
        yield node_id
    finally:
        node.terminate()  # ray start --block stops the node's processes on SIGTERM
        try:
            node.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(30)
        if node_id:
            _until_gone(node_id)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
@pytest.mark.timeout(300)
def test_a_path_a_node_cannot_read_is_an_error_naming_the_node_and_the_path(
    ray_cluster, dataset, tmp_path
):
    cluster, _ = ray_cluster
    local = tmp_path / "local_only"
    shutil.copytree(dataset / "odd", local / "odd", ignore=shutil.ignore_patterns("bad_*"))
    with _node_without(local, cluster.address) as node_id:
        loader = _cluster_loader(local, batch_size=2)
        with pytest.raises(cluster_mod.ClusterError) as caught:
            next(iter(loader))
        loader.close()
    text = str(caught.value)
    assert node_id[:12] in text and str(local / "odd") in text
    assert "same path" in text and "shared file system" in text


@pytest.mark.timeout(300)
def test_a_loader_inside_a_ray_actor_killed_by_ray_leaves_no_segment_or_process(
    ray_cluster, dataset
):
    import ray

    class LoaderActor:  # defined here, so that it travels by value
        """A trainer inside a Ray worker (as under Ray Train): a local loader, one worker."""

        def start(self, folder: str) -> dict:
            import stoker as st

            self.loader = st.Loader(folder, batch_size=2, image_size=32, workers=1, max_errors=20)
            self.batches = iter(self.loader)
            next(self.batches)
            return {
                "pid": os.getpid(),
                "workers": [p.pid for p in self.loader._supply.running.pool.procs],
            }

    actor = ray.remote(num_cpus=1)(LoaderActor).remote()
    try:
        row = ray.get(actor.start.remote(str(dataset)), timeout=240)
        victims = _victims(row)
        assert len(victims) == 3 and _segments_of([row["pid"]])
    finally:
        ray.kill(actor, no_restart=True)
    _assert_cleaned_up(victims, [row["pid"]], 60)


KERAS_TRAINER = """
import json, sys, ray, keras, stoker
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
keras.utils.set_random_seed(0)
with stoker.Loader(sys.argv[2], batch_size=4, image_size=32, workers=0, max_errors=20,
                   cluster="ray", cluster_listen="127.0.0.1", seed=0) as train:
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy")
    hist = model.fit(train.keras(), epochs=2, callbacks=[train.keras_report()], verbose=0)
    meter = train.wait_meter(every=2)
    figures = []
    for images, labels in train:
        if (got := meter.step()) is not None:
            figures.append(got)
    out = {
        "history": {k: [float(v) for v in vs] for k, vs in hist.history.items()},
        "meter": figures,
        "len": len(train),
        "cluster_batches": sum(n["batches"] for n in train.stats().cluster["nodes"]),
    }
print("RESULT " + json.dumps(out), flush=True)
"""


def _driver(script: str, args: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run ``script`` (another Ray driver) in a fresh interpreter: its ``RESULT {json}`` line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="keras is not installed")
@pytest.mark.timeout(400)
def test_the_keras_wait_report_and_the_wait_meter_work_on_a_cluster_loader(ray_cluster, dataset):
    cluster, _ = ray_cluster
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "KERAS_BACKEND": "torch",
        "CUDA_VISIBLE_DEVICES": "",
    }
    out = _driver(KERAS_TRAINER, [cluster.address, str(dataset)], env, 360)
    hist = out["history"]
    assert len(hist["loss"]) == len(hist["data_wait"]) == len(hist["input_img_s"]) == 2
    assert all(0.0 <= w <= 1.0 for w in hist["data_wait"])
    assert all(r > 0 for r in hist["input_img_s"])
    assert len(out["meter"]) == out["len"] // 2  # one report every 2 steps of the third epoch
    assert all(0.0 <= f["data_wait"] <= 1.0 and f["input_img_s"] > 0 for f in out["meter"])
    assert out["cluster_batches"] >= 3 * out["len"]  # the nodes made the batches


@pytest.mark.timeout(240)
def test_a_node_with_another_stoker_version_is_refused(ray_cluster, dataset, monkeypatch):
    class OtherStoker(actor_mod.Decoder):
        """A node's actor that says it runs another stoker (a local class: Ray sends it by
        value, so the node needs nothing of this test module)."""

        def hello(self, index: int) -> dict:
            said = super().hello(index)
            return {**said, "identity": {**said["identity"], "stoker": "0.0.0-other"}}

    monkeypatch.setattr(actor_mod, "Decoder", OtherStoker)  # what nodestart starts per node
    loader = _cluster_loader(dataset, cluster_workers=1)
    with pytest.raises(
        cluster_mod.ClusterError,
        match=r"runs stoker 0\.0\.0-other, this "
        r"trainer " + stoker.__version__.replace(".", r"\."),
    ):
        next(iter(loader))
    loader.close()


def test_cluster_arguments_are_checked_before_anything_starts(dataset):
    with pytest.raises(stoker.ConfigError, match="cluster_workers"):
        stoker.Loader(dataset, cluster="ray", cluster_workers=0)
    with pytest.raises(stoker.ConfigError, match="cluster_transport"):
        stoker.Loader(dataset, cluster="ray", cluster_transport="pigeon")
    with pytest.raises(stoker.ConfigError, match="need cluster="):
        stoker.Loader(dataset, cluster_workers=4)
    with pytest.raises(stoker.ConfigError, match="cluster="):
        stoker.Loader(dataset, cluster=3)


class _Attack:
    """Silent, slow (slowloris), garbage and flooding connections to the trainer's data port,
    all queued the moment the port opens: before any node is asked to connect."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address, self.stop = address, threading.Event()
        self.silent = [socket.create_connection(address, timeout=30) for _ in range(3)]
        self.slow = [socket.create_connection(address, timeout=30) for _ in range(2)]
        self.garbage = [socket.create_connection(address, timeout=60) for _ in range(2)]
        for sock in self.garbage:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: stoker\r\n\r\n" + b"x" * 64)
        self.flood = [socket.socket() for _ in range(150)]
        for sock in self.flood:  # a burst that never waits for the backlog to take it
            sock.setblocking(False)
            sock.connect_ex(address)
        self.threads = [
            threading.Thread(target=self._dribble, daemon=True),
            threading.Thread(target=self._churn, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _dribble(self) -> None:
        """A valid greeting, one byte at a time, never finished."""
        greeting = wire.MAGIC + os.urandom(wire.CHALLENGE_BYTES)
        for byte in greeting[:-1]:
            for sock in self.slow:
                with contextlib.suppress(OSError):
                    sock.sendall(bytes([byte]))
            if self.stop.wait(0.25):
                return

    def _churn(self) -> None:
        """More connections as fast as they go, each dropped at once, until told to stop."""
        while not self.stop.is_set():
            with contextlib.suppress(OSError):
                socket.create_connection(self.address, timeout=5).close()

    def refused_garbage(self) -> None:
        """Wait until the trainer closed both garbage connections (each counted first)."""
        for sock in self.garbage:
            with contextlib.suppress(ConnectionError):
                while sock.recv(4096):
                    pass

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        for sock in self.silent + self.slow + self.garbage + self.flood:
            sock.close()


@pytest.mark.timeout(300)
def test_silent_slow_and_flooding_connections_hold_up_no_node(ray_cluster, dataset, monkeypatch):
    from stoker.workers import door as door_mod

    want, _ = _reference(dataset)
    attacks: list[_Attack] = []
    listen = door_mod.listen

    def listen_and_attack(host: str) -> socket.socket:
        listener = listen(host)
        attacks.append(_Attack(listener.getsockname()[:2]))  # queued ahead of every node
        return listener

    monkeypatch.setattr(door_mod, "listen", listen_and_attack)
    try:
        with _quiet():
            with _cluster_loader(dataset) as loader:
                got = _digests(loader)
                attacks[0].refused_garbage()
                report = loader.stats().cluster
    finally:
        for attack in attacks:
            attack.close()
    assert len(attacks) == 1
    assert [n["transport"] for n in report["nodes"]] == ["tcp", "tcp"], report["nodes"]
    assert got == want  # every batch once, bit-identical
    assert report["refused"] >= 2


INTRUDER = """
import json, os, select, socket, sys, ray
from stoker.workers import wire
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
found = [a for a in ray.util.list_named_actors(all_namespaces=True)
         if a["name"].startswith("stoker-") and a["name"].endswith("-0")]
actor = ray.get_actor(found[0]["name"], namespace=found[0]["namespace"])
server = socket.create_server(("127.0.0.1", 0))
secret = os.urandom(32)
ref = actor.connect.remote("127.0.0.1", server.getsockname()[1], secret, 0)
got = 0
while True:
    done, _ = ray.wait([ref], timeout=0.05)
    if select.select([server], [], [], 0)[0]:  # the actor dialled: play its trainer
        sock, _ = server.accept()
        sock.settimeout(60)
        wire.prove(sock, secret, b"trainer", b"node")
        wire.recv_exact(sock, wire.LENGTH.size)
        wire.send_request(sock, 1, (0, 0))
        head = wire.read_header(sock)
        got = head.report_len + sum(head.lengths)
        break
    if done:
        break
try:
    reply = ray.get(ref, timeout=60)
except Exception as exc:
    reply = f"{type(exc).__name__}: {exc}"
others = []
for call in (actor.fill.remote(secret, 1, 0, 0), actor.stop.remote(secret)):
    try:  # the object-store path's batches, and stopping the node
        others.append(repr(ray.get(call, timeout=60))[:200])
    except Exception as exc:
        others.append(f"{type(exc).__name__}: {exc}"[-300:])
server.setblocking(False)
try:
    server.accept()
    dialled = True
except BlockingIOError:
    dialled = False
print("RESULT " + json.dumps({"reply": str(reply)[-800:], "bytes": got, "dialled": dialled,
                              "others": others}))
"""


@pytest.mark.timeout(300)
def test_another_driver_cannot_connect_a_loaders_actor_to_itself(ray_cluster, dataset):
    import ray

    cluster, _ = ray_cluster
    want, _ = _reference(dataset)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with _one_batch_in(dataset, None) as (loader, batches, got, _):
        intruder = _driver(INTRUDER, [cluster.address], env, 240)
        assert "PermissionError" in intruder["reply"] and "secret" in intruder["reply"]
        assert intruder["bytes"] == 0 and not intruder["dialled"]  # no connection, no batch
        assert all("PermissionError" in why for why in intruder["others"]), intruder["others"]
        got += _digests(batches)
        actor = loader._supply.running.pool.nodes.nodes[0].actor  # type: ignore[union-attr]
        counts = ray.get(actor.counts.remote(), timeout=60)
        report = loader.stats().cluster
    assert counts["refused"] == 3  # connect, fill, stop
    assert got == want
    assert [(n["alive"], n["transport"]) for n in report["nodes"]] == [(True, "tcp")] * 2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", ["folder", "shards"])
def test_nodes_read_a_bucket_themselves_and_give_the_batches_of_workers_0(
    ray_cluster, s3_server, image_folder, monkeypatch, tmp_path, layout
):
    """No shared folder: the images (an image folder, or Parquet shards read in spans) are only
    in a bucket of the test S3 server. The nodes started before any AWS variable was set, so
    they reach it through storage_options alone, and they list nothing: the trainer's listing
    travels in the Recipe (LISTs are counted at a proxy: a LIST is a GET of the bucket's own
    path)."""
    from faultproxy import FaultProxy

    bucket = s3_server.bucket()
    local = image_folder
    if layout == "shards":
        from stoker.cli.convert import convert

        local = tmp_path / "shards"
        convert(image_folder, local, progress=False, row_group_bytes=64 << 10)
    s3_server.upload(local, f"s3://{bucket}/folder")
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # the trainer's listing cache: its own
    url = f"s3://{bucket}/folder/"
    with FaultProxy(s3_server.endpoint) as proxy:
        options = {"endpoint_url": proxy.endpoint, "key": "testing", "secret": "testing-secret"}
        with stoker.Loader(url, workers=0, storage_options=options, **COMMON) as loader:
            want = _digests(loader)
        listed = proxy.requests[("GET", f"/{bucket}")]
        with _cluster_loader(url, storage_options=options) as loader:
            got = _digests(loader)
            report = loader.stats()
        assert proxy.requests[("GET", f"/{bucket}")] == listed == 1  # the trainer's, cached
    assert got == want
    assert report.cluster["cores"] == 2 and all(n["batches"] > 0 for n in report.cluster["nodes"])
