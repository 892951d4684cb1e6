"""The reaper: a tiny process that outlives its parent and owns the names of its segments.

The parent starts one reaper (lazily, before its first shared-memory segment) and tells it, over
a pipe, every segment path it is about to create (``+S path``), every one it removed (``-S
path``) and every worker it started (``+P pid start-time``). When the pipe reaches end-of-file
(the parent exited, normally or by SIGKILL, SIGTERM, an OOM kill or a crash in native code: the
kernel closes its end either way) or the parent's pid goes away, the reaper unlinks every path
still listed, kills every listed worker that is still the same process, and exits.

The reaper also holds the parent's segment lock files (``+L path``, see :mod:`.ownerlock`)
with a shared ``flock``, so no other process takes the parent's segments for stale until the
reaper itself has removed them (lock files last) and exited.

A path is announced *before* its file is created, so no moment exists where a segment is on
disk and unknown to the reaper. The reaper runs as ``python -I -S reaper.py PARENT`` in a
session of its own: it imports only the standard library, starts in milliseconds, and neither
Ctrl-C at the terminal nor a signal sent to the parent's process group reaches it.

A process whose killer also kills its direct children calls :func:`detach` before its first
segment: its reaper is then started as a grandchild (``reaper.py --detach PARENT``: a
short-lived middle process forks the reaper proper and exits), so it is no child of the parent
and watches it through the pipe and a pidfd instead. A Ray worker is such a process (Ray's kill
of an actor, and its exit at the end of a job, SIGKILL the worker's direct children with it), and
its reaper is detached without being asked (:func:`in_ray_worker`).
"""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import stat
import sys
import threading
import warnings

POLL_S = 1.0  # backup check of the parent's pid, where a pidfd is unavailable


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc``), ``""`` if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


# ----------------------------------------------------------------------- the reaper process


def _parent_gone(parent: int, started: str) -> bool:
    """Whether the parent is gone: no longer our parent, or (for a detached reaper, whose
    parent never was its own) no longer the process that started at ``started``."""
    if not started:
        return os.getppid() != parent
    return start_time(parent) != started


def _wait_readable(fds: list[int], parent: int, started: str) -> list[int]:
    while True:
        ready = select.select(fds, [], [], POLL_S)[0]
        if ready or _parent_gone(parent, started):
            return ready


def _pidfd(pid: int) -> int:
    """A pidfd for ``pid``, or -1 where the kernel or Python has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def _serve(parent: int, pidfd: int, started: str = "") -> tuple[set[str], dict[int, str]]:
    """Read announcements until the parent is gone; what is still listed then."""
    paths: set[str] = set()
    procs: dict[int, str] = {}
    fds = [0] if pidfd < 0 else [0, pidfd]
    pending = b""
    while True:
        ready = _wait_readable(fds, parent, started)
        if 0 not in ready:
            return paths, procs
        chunk = os.read(0, 65536)
        if not chunk:
            return paths, procs
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _apply(line.decode("utf-8", "surrogateescape"), paths, procs)


_held: dict[str, int] = {}  # in the reaper: the parent's lock files it holds too, and their fds


def _apply(line: str, paths: set[str], procs: dict[int, str]) -> None:
    kind, _, rest = line.partition(" ")
    if kind == "+S":
        paths.add(rest)
    elif kind == "-S":
        paths.discard(rest)
    elif kind == "+L":  # hold the parent's segment lock too (see ownerlock): shared, as it does
        paths.add(rest)
        try:
            fd = os.open(rest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            _held[rest] = fd
        except OSError:
            pass
    elif kind == "-L":
        paths.discard(rest)
        fd = _held.pop(rest, -1)
        if fd >= 0:
            os.close(fd)
    elif kind == "+P":
        pid, _, started = rest.partition(" ")
        procs[int(pid)] = started
    elif kind == "-P":
        procs.pop(int(rest), None)


def _reap(paths: set[str], procs: dict[int, str]) -> None:
    for pid, started in procs.items():
        if started and start_time(pid) != started:
            continue  # gone, or the pid now belongs to another process
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for path in sorted(paths, key=lambda p: p.endswith(".lock")):  # the locks last
        remove_path(path)


def remove_path(path: str) -> None:
    """Unlink a segment or lock file, or remove a folder of them (a loader's span cache:
    ``sources.spancache``) with everything in it; a link is unlinked, never followed."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass


def _detach(parent: int) -> tuple[int, str]:
    """In the middle process: fork the reaper proper, tell the parent its pid on stdout, exit.
    The pidfd and start time are taken here, while the parent surely lives (it waits for us),
    so a pid reused later is never taken for the parent."""
    pidfd, started = _pidfd(parent), start_time(parent)
    child = os.fork()  # this process has one thread: the fork is safe
    if child:
        os.write(1, f"{child}\n".encode())
        os._exit(0)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # the parent reads our pid until end-of-file: let it see one
    os.close(null)
    return pidfd, started


def main(argv: list[str]) -> None:
    """Entry point of the reaper process: ``reaper.py [--detach] PARENT_PID``."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    if argv[1] == "--detach":
        parent = int(argv[2])
        _reap(*_serve(parent, *_detach(parent)))
    else:
        parent = int(argv[1])
        _reap(*_serve(parent, _pidfd(parent)))


# ----------------------------------------------------------------------- the parent's side


class _Client:
    """This process's reaper: started on first use, restarted if it was killed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = -1
        self.fd = -1
        self.owner = -1
        self.paths: set[str] = set()
        self.procs: dict[int, str] = {}
        self.locks: set[str] = set()
        self.broken = False
        self.detached = False  # the reaper is started as a grandchild (see detach())
        self.pidfd = -1  # a detached reaper's pidfd: it is no child to wait for

    def _alive(self) -> bool:
        if self.owner != os.getpid() or self.pid < 0:
            return False
        if self.detached:
            return _running(self.pid, self.pidfd)
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def _start(self) -> None:
        """posix_spawn (no fork of this possibly threaded process), stdin from a pipe."""
        if self.fd >= 0 and self.owner == os.getpid():
            os.close(self.fd)
        if self.pidfd >= 0 and self.owner == os.getpid():
            os.close(self.pidfd)
            self.pidfd = -1
        self.detached = self.detached or in_ray_worker()
        read, write = os.pipe()
        try:
            if self.detached:
                self.pid = _spawn_detached(read)
                self.pidfd = _pidfd(self.pid)
            else:
                self.pid = os.posix_spawn(
                    sys.executable,
                    [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                    dict(os.environ),
                    file_actions=[(os.POSIX_SPAWN_DUP2, read, 0)],
                    setsid=True,
                )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self.fd, self.owner = write, os.getpid()
        lines = (
            [f"+S {p}" for p in self.paths]
            + [f"+L {p}" for p in self.locks]
            + [f"+P {k} {v}" for k, v in self.procs.items()]
        )
        if lines:
            self._write("\n".join(lines))

    def _write(self, text: str) -> None:
        data = (text + "\n").encode("utf-8", "surrogateescape")
        while data:
            data = data[os.write(self.fd, data) :]

    def tell(self, line: str) -> None:
        """Send one announcement; a reaper that died is replaced and told everything again."""
        with self.lock:
            if self.broken:
                return
            for _ in range(2):
                try:
                    if not self._alive():
                        self._start()
                    self._write(line)
                    return
                except OSError as exc:
                    self.pid, error = -1, exc
            self.broken = True  # e.g. no Python executable to start (an embedded interpreter)
            warnings.warn(
                f"stoker could not start its reaper process ({error}): if this process is "
                "killed, its shared-memory segments stay until the next stoker start or "
                "`stoker doctor --clean`",
                RuntimeWarning,
                stacklevel=4,
            )

    def revive(self) -> None:
        """Start a new reaper, told everything, if this process's has died while it still has
        segments or workers to watch (checked between batches: a dead reaper is replaced
        before the trainer's own death would need it)."""
        with self.lock:
            if self.broken or not (self.paths or self.procs) or self._alive():
                return
            try:
                self._start()
            except OSError:
                self.pid = -1

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's reaper (its pipe and lists are not ours)."""
        for fd in (self.fd, self.pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.__init__()  # type: ignore[misc]


DETACH_TIMEOUT_S = 30.0  # the middle process only forks and prints a pid


def _spawn_detached(read: int) -> int:
    """Start ``reaper.py --detach``: the middle process forks the reaper (stdin ``read``), prints
    its pid and exits; the reaper's pid."""
    out_r, out_w = os.pipe()
    try:
        middle = os.posix_spawn(
            sys.executable,
            [sys.executable, "-I", "-S", os.path.abspath(__file__), "--detach", str(os.getpid())],
            dict(os.environ),
            file_actions=[(os.POSIX_SPAWN_DUP2, read, 0), (os.POSIX_SPAWN_DUP2, out_w, 1)],
            setsid=True,
        )
    finally:
        os.close(out_w)
    try:
        text = b""
        while select.select([out_r], [], [], DETACH_TIMEOUT_S)[0]:
            chunk = os.read(out_r, 64)
            if not chunk:
                break
            text += chunk
    finally:
        os.close(out_r)
        os.waitpid(middle, 0)
    if not text.strip().isdigit():
        raise OSError(f"the detached reaper did not start (it said {text!r})")
    return int(text)


def in_ray_worker() -> bool:
    """Whether this process is a Ray worker (a task or an actor: a Ray Train loop, a node's
    decode actor), whose kill by Ray takes its direct children with it. Ray is never imported
    here: a process that has not imported it is no Ray worker."""
    ray = sys.modules.get("ray")
    try:
        return bool(
            ray is not None
            and ray.is_initialized()
            and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
        )
    except Exception:  # noqa: BLE001 - a Ray without these names: start the reaper as usual
        return False


def _running(pid: int, pidfd: int) -> bool:
    """Whether process ``pid`` (not a child of ours) still runs."""
    if pidfd >= 0:
        return not select.select([pidfd], [], [], 0)[0]
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


_client = _Client()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_client.forget_after_fork)


def detach() -> None:
    """Start this process's reaper, from now on, as no child of this process: for a process
    whose killer kills its direct children with it (a Ray actor). Call it before the first
    segment; a reaper already running stays as it is."""
    with _client.lock:
        if not _client._alive():
            _client.detached = True


def track_segment(path: str) -> None:
    """Announce a segment path before creating it: the reaper unlinks it if we die."""
    _list(_client.paths, "S", path)


def untrack_segment(path: str) -> None:
    """The segment was unlinked by us; the reaper forgets it."""
    _unlist(_client.paths, "S", path)


def hold_lock(path: str) -> None:
    """This process holds the segment lock ``path`` (see :mod:`.ownerlock`): the reaper holds
    it too, until it has removed every listed segment, and then removes it."""
    _list(_client.locks, "L", path)


def release_lock(path: str) -> None:
    """The segment lock ``path`` was removed by us; the reaper lets it go."""
    _unlist(_client.locks, "L", path)


def _list(kept: set[str], kind: str, path: str) -> None:
    """Add ``path`` to one of the client's lists and tell the reaper (``+S path``)."""
    kept.add(path)
    _client.tell(f"+{kind} {path}")


def _unlist(kept: set[str], kind: str, path: str) -> None:
    """Drop a listed ``path`` and tell the reaper (``-S path``); one never listed tells nothing."""
    if path in kept:
        kept.discard(path)
        _client.tell(f"-{kind} {path}")


def track_process(pid: int) -> None:
    """A worker process we started: the reaper kills it if we die first."""
    _client.procs[pid] = start_time(pid)
    _client.tell(f"+P {pid} {_client.procs[pid]}")


def untrack_process(pid: int) -> None:
    """The worker ended (joined by us)."""
    if _client.procs.pop(pid, None) is not None:
        _client.tell(f"-P {pid}")


def revive() -> None:
    """Replace this process's reaper if it died (see ``_Client.revive``)."""
    _client.revive()


def reaper_pid() -> int | None:
    """Pid of this process's reaper, if one is running."""
    return _client.pid if _client._alive() else None


if __name__ == "__main__":
    main(sys.argv)
