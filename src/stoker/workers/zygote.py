"""One start-up process per pool: it loads the workers' payload once and forks every worker.

A fresh interpreter per worker imports the payload's modules once per worker: with a dataset
whose module imports torch, two workers on two cores each pay torch's import (seconds, far
more on a busy machine) while the trainer makes batches on the same cores. The *zygote* is one
fresh interpreter started like a worker (stoker's own entry point, :data:`ZYGOTE_BOOT`, the
``sys.path`` rules of :mod:`.importpath`, never the user's script, never a fork of the user's
process): it loads the payload (which imports the dataset's modules, torch with them) once,
then forks each worker from itself, so a worker is running within milliseconds of the load and
the pages the imports made are shared between the workers.

Rules:

- **Single-threaded at fork.** A fork copies only the calling thread; a lock another thread held
  stays held in the child. The zygote is started with every pool's thread count set (see
  :mod:`.threads`) and with the background thread of pyarrow's jemalloc turned off
  (:data:`NO_ARROW_THREAD`; ``import stoker`` imports pyarrow), and checks its own thread
  count before each fork. If a module the payload imported left a thread running, the zygote
  starts that worker as a fresh interpreter instead (the plain :mod:`.launch` command). With
  ``worker_threads=None`` (torch's import then starts a thread) the pool uses no zygote.
- **Per-process state is the worker's.** The global RNGs are reseeded per sample
  (:mod:`stoker.seeding`), the source is opened in the worker (``open_in_worker``), thread
  pools start lazily in each worker, and each worker's socket is its own (made here, its end
  passed to the zygote). The zygote itself never decodes, opens the source or starts a pool.
- **The guarantees of a worker stay.** The zygote is this process's child and forks the
  workers, so it reaps them and sends each exit status here (``("exit", pid, code)``): a dead
  worker is named with its exit code or signal. It passes each worker's pidfd back on fork, so
  liveness, ``join`` and signals go through the pidfd (never a pid that may be reused). Every
  forked worker is registered with the reaper as soon as its pid is known (the zygote from its
  start), and each one watches this process as a worker from :mod:`.launch` does, so a SIGKILL
  of this process leaves no process and no segment. A payload that fails to load is sent to
  every worker's socket as that worker's start-up failure, as a fresh worker would report it.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection, Pipe
from multiprocessing.reduction import recvfds, sendfds
from typing import Any

from ..shm import reaper
from . import threads as threads_mod
from .command import SAFE_PATH, boot, load_payload, worker_argv, worker_env
from .errors import pack_exception
from .importpath import worker_path

#: The zygote's command: :data:`.command.BOOT` with the zygote's own entry point.
ZYGOTE_BOOT = boot("stoker.workers.zygote")

#: pyarrow's jemalloc starts a background thread at load unless told not to (env variable
#: read by the jemalloc that pyarrow bundles); a thread would rule out every fork.
NO_ARROW_THREAD = ("JE_ARROW_MALLOC_CONF", "background_thread:false")
EXIT_WAIT_S = 2.0  # how long a worker's exit status may take to arrive from the zygote
STOP_WAIT_S = 2.0  # how long the zygote may take to confirm a fork, or that it forks no more
LOST = 1 << 16  # the exit status of a worker whose zygote died before it could send it


def zygote_env(env: dict[str, str]) -> dict[str, str]:
    """The zygote's environment (its workers inherit it): ``env`` with pyarrow's jemalloc
    background thread turned off (added to the user's own jemalloc settings, if any)."""
    name, value = NO_ARROW_THREAD
    return {**env, name: ",".join(p for p in (env.get(name, ""), value) if p)}


# ---------------------------------------------------------------------------- parent side


def _readable(fd: int, timeout: float) -> bool:
    return bool(select.select([fd], [], [], timeout)[0])


class Zygote:
    """This process's side of a zygote: started at once (the payload in the file ``segment``,
    of ``size`` bytes; ``threads`` per thread pool), it forks a worker for each :meth:`fork`
    as soon as it has loaded."""

    def __init__(self, segment: str, size: int, threads: int | None) -> None:

        ours, theirs = Pipe(duplex=True)
        path = worker_path()
        argv = [sys.executable, *SAFE_PATH, "-c", ZYGOTE_BOOT, str(len(path)), *path]
        argv += [str(theirs.fileno()), segment, str(size), repr(time.time()), str(threads)]
        env = zygote_env(threads_mod.environment(threads, worker_env()))
        try:
            self.popen = subprocess.Popen(
                argv, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        reaper.track_process(self.popen.pid)
        self.conn = ours
        self.sock = socket.socket(fileno=os.dup(ours.fileno()))
        self.lock = threading.RLock()
        self.forked: dict[int, tuple[int, int]] = {}  # wid -> (pid, pidfd)
        self.codes: dict[int, int] = {}  # pid -> exit code (minus the signal)
        self.gone = self.stopped = self.loaded = False

    def fork(self, wid: int) -> tuple[ForkedProcess, Connection]:
        """Ask for worker ``wid`` (forked once the zygote has loaded); its process and socket.
        A zygote already dead makes the worker's exit its own (seen by ``exitcode``)."""
        ours, theirs = Pipe(duplex=True)
        try:
            with self.lock:
                self.conn.send(("fork", wid))
                sendfds(self.sock, [theirs.fileno()])
        except OSError:
            pass
        finally:
            theirs.close()
        return ForkedProcess(self, wid), ours

    def pump(self, timeout: float = 0.0) -> None:
        """Take the zygote's messages that arrive within ``timeout`` (forks and exits)."""
        with self.lock:
            while not self.gone:
                try:
                    if not self.conn.poll(timeout):
                        return
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    self.gone = True
                    return
                timeout = 0.0
                if msg[0] == "forked":
                    (pidfd,) = recvfds(self.sock, 1)
                    self.forked[msg[1]] = (msg[2], pidfd)
                    reaper.track_process(msg[2])
                elif msg[0] == "exit":
                    self.codes[msg[1]] = msg[2]
                elif msg[0] == "stopped":
                    self.stopped = True
                elif msg[0] == "loaded":
                    self.loaded = True

    def stop(self) -> None:
        """No more forks; afterwards every fork asked for is known here. A zygote that has
        loaded confirms it (briefly waited for); one still loading has forked nothing and is
        ended at once (the forks it sent before it died are still read)."""
        self.pump()
        if self.stopped:
            return
        if self.loaded:
            with self.lock:
                try:
                    self.conn.send(("stop",))
                except OSError:
                    self.gone = True
            deadline = time.monotonic() + STOP_WAIT_S
            while not (self.stopped or self.gone) and time.monotonic() < deadline:
                self.pump(0.05)
        if not self.stopped:
            self.popen.kill()
            self.popen.wait()
            while not self.gone:  # what it sent before it died (EOF ends it)
                self.pump(0.05)
        self.stopped = True

    def close(self) -> None:
        """End the zygote (after its workers were stopped) and close the pidfds."""
        self.stop()
        self.conn.close()
        self.sock.close()
        try:
            self.popen.wait(1.0)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        reaper.untrack_process(self.popen.pid)
        self.forget()

    def forget(self) -> None:
        """Close this process's descriptors (in a forked child: the parent keeps its own)."""
        for _, pidfd in self.forked.values():
            os.close(pidfd)
        self.forked = {}
        self.gone = self.stopped = True
        for end in (self.conn, self.sock):
            try:
                end.close()
            except OSError:
                pass


class ForkedProcess:
    """A worker forked by a :class:`Zygote`: what the pool uses of a process. Before its fork
    is known, its pid is the zygote's and the zygote's death is its own."""

    def __init__(self, zygote: Zygote, wid: int) -> None:
        self.zygote, self.wid, self.name = zygote, wid, f"stoker-worker-{wid}"

    def _forked(self) -> tuple[int, int] | None:
        self.zygote.pump()
        return self.zygote.forked.get(self.wid)

    def wait_forked(self) -> None:
        """Once the worker said it started: wait (briefly) for its fork to be known here."""
        deadline = time.monotonic() + STOP_WAIT_S
        while self._forked() is None and not self.zygote.gone and time.monotonic() < deadline:
            self.zygote.pump(0.05)

    @property
    def pid(self) -> int:
        """The worker's pid; the zygote's until the fork is known."""
        got = self._forked()
        return got[0] if got else self.zygote.popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while running (or being started); the exit code, or minus the signal."""
        got = self._forked()
        if got is None:  # not forked (yet): the zygote's death is this worker's
            code = self.zygote.popen.poll()
            return 0 if code is None and self.zygote.stopped else code
        pid, pidfd = got
        if not _readable(pidfd, 0.0):
            return None
        deadline = time.monotonic() + EXIT_WAIT_S
        while pid not in self.zygote.codes and not self.zygote.gone:
            if time.monotonic() > deadline:
                break
            self.zygote.pump(0.05)
        return self.zygote.codes.get(pid, LOST)

    def is_alive(self) -> bool:
        """True while the process runs (or is still to be forked)."""
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the process to end (not forked yet: for the
        zygote to end)."""
        got = self._forked()
        if got is not None:
            select.select([got[1]], [], [], timeout)
        elif not self.zygote.stopped:  # its socket closed: the zygote is dying with it
            try:
                self.zygote.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass

    def terminate(self) -> None:
        """SIGTERM."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        got = self._forked()
        if got is None:  # being forked: the zygote is what is running for it
            if not self.zygote.stopped and self.zygote.popen.poll() is None:
                self.zygote.popen.send_signal(sig)
            return
        try:
            signal.pidfd_send_signal(got[1], sig)
        except OSError:  # ended already
            pass


# ---------------------------------------------------------------------------- zygote side


def _threads() -> list[str]:
    """The names of this process's threads other than the calling one."""
    me = threading.get_native_id()
    names = []
    for tid in os.listdir("/proc/self/task"):
        if int(tid) != me:
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
    return names


class _Zygote:
    """The zygote's loop: load once, then fork (or start) a worker per request, reap them."""

    def __init__(self, argv: list[str]) -> None:
        self.started = time.time()
        self.ctrl_fd, self.path, self.size = int(argv[0]), argv[1], int(argv[2])
        self.launched, self.threads, booted = float(argv[3]), argv[4], float(argv[5])
        self.worker_path = list(sys.path)  # set by ZYGOTE_BOOT: the trainer's, for _spawn
        self.ctrl = Connection(self.ctrl_fd)
        self.sock = socket.socket(fileno=os.dup(self.ctrl_fd))
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self.stopped = False
        self.spawned: list[subprocess.Popen] = []
        self.loaded: tuple[Any, tuple] | None = None
        self.failure: dict[str, Any] | None = None
        self.report: dict[str, Any] = {"stoker_s": max(0.0, self.started - booted)}

    def load(self) -> None:
        """Load the payload (imports its modules) once, or keep the failure for each worker."""

        try:
            threads_mod.limit(None if self.threads == "None" else int(self.threads))
            target, args, imported, settings_s = load_payload(self.path, self.size)
        except BaseException as exc:  # noqa: BLE001 - every worker reports it as its own
            self.failure = pack_exception(exc, 0, None)
            return
        self.loaded = (target, args)
        self.report.update(
            python_s=max(0.0, self.started - self.launched),
            settings_s=settings_s,
            imported=imported,
            forked=True,
        )

    def serve(self) -> None:
        """Until this process's parent closes the socket or dies."""
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        parent = os.getppid()
        if not self._send(("loaded",)):
            return
        try:
            watch = [os.pidfd_open(parent)]
        except (AttributeError, OSError):
            watch = []
        while True:
            ready = select.select([self.ctrl_fd, self.wake_r, *watch], [], [], 1.0)[0]
            if self.wake_r in ready:
                os.read(self.wake_r, 4096)
            self._reap()
            if (watch and watch[0] in ready) or os.getppid() != parent:
                return
            if self.ctrl_fd in ready and not self._request():
                return

    def _request(self) -> bool:
        """Handle one request; False once the parent is gone or closed the socket."""
        try:
            msg = self.ctrl.recv()
        except (EOFError, OSError):
            return False
        if msg[0] == "stop":
            self.stopped = True
            return self._send(("stopped",))
        wid = msg[1]
        (fd,) = recvfds(self.sock, 1)
        if self.stopped:
            os.close(fd)
        elif self.failure is not None:
            self._fail(wid, fd)
        else:
            pid = self._fork(wid, fd) if not _threads() else self._spawn(wid, fd)
            pidfd = os.pidfd_open(pid)
            os.close(fd)
            try:
                self.ctrl.send(("forked", wid, pid))
                sendfds(self.sock, [pidfd])
            except OSError:
                return False
            finally:
                os.close(pidfd)
        return True

    def _send(self, msg: tuple) -> bool:
        """Send ``msg`` to the parent; False once it is gone."""
        try:
            self.ctrl.send(msg)
        except OSError:
            return False
        return True

    def _fail(self, wid: int, fd: int) -> None:
        """The payload failed to load: worker ``wid``'s start failed with that error."""
        assert self.failure is not None
        conn = Connection(fd)
        try:
            conn.send(("failed", {**self.failure, "wid": wid}))
        except OSError:
            pass
        conn.close()

    def _reap(self) -> None:
        """Send the exit status of every worker that ended."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._send(("exit", pid, os.waitstatus_to_exitcode(status)))

    def _spawn(self, wid: int, fd: int) -> int:
        """A module loaded here left a thread running: start worker ``wid`` as a fresh
        interpreter (the plain launch command) instead of forking a threaded process."""

        threads = None if self.threads == "None" else int(self.threads)
        argv = worker_argv(self.worker_path, fd, self.path, self.size, wid, threads)
        popen = subprocess.Popen(argv, pass_fds=(fd,), stdin=subprocess.DEVNULL)
        self.spawned.append(popen)  # held: a dropped Popen may reap it before _reap sees it
        return popen.pid

    def _fork(self, wid: int, fd: int) -> int:
        """Fork worker ``wid`` (this process has one thread); in the child, run it."""
        assert self.loaded is not None
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for end in (self.wake_r, self.wake_w):
                os.close(end)
            self.sock.close()
            self.ctrl.close()
            conn = Connection(fd)
            conn.send(("started", {**self.report, "total_s": time.time() - self.launched}))
            target, args = self.loaded
            target(wid, conn, *args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 - printed as a fresh worker's would be
            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError, AttributeError):
                    pass
            os._exit(code)


def main(argv: list[str]) -> None:
    """Entry point of a zygote: load the payload, then serve fork requests until the parent
    closes its socket or dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which stops us
    zygote = _Zygote(argv)
    zygote.load()
    zygote.serve()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)  # never the payload's atexit hooks: this process only started workers
