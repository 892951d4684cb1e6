"""Start worker processes from stoker's own entry point, never from the user's script.

A worker is a fresh interpreter running stoker's own entry point (:data:`.command.BOOT`, then
:func:`main`): it imports stoker (numpy, the decoders) and nothing of the user's ``__main__``, so
a top-level script without an ``if __name__ == "__main__":`` guard, ``python -c``, ``python - <
script``, ``python -i`` and a Jupyter kernel all work, and ``import keras`` at the top of a script
costs the workers nothing.

A worker imports from the folders the trainer imports from, less those another user could
plant a module in (:mod:`.importpath`): its first statement, before any import, replaces
``sys.path`` with that list (stoker's own folder first). So a ``stoker/`` package or a
``numpy.py`` planted in the folder the trainer runs in is never imported: ``python -m`` would
have put that folder first on the path (``-P``, which stops it, needs Python 3.11), and a
``PYTHONPATH`` entry that is empty or relative (``:`` at its end, ``.``) would name the folder
the worker starts in, not the one the trainer started in.

What the worker runs (a target function and its arguments) is serialized once with
cloudpickle: stoker's own objects and functions of importable modules travel by reference
(the worker imports them), functions and classes of ``__main__`` or a notebook cell and lambdas
travel by value. The bytes go into a parent-owned shared-memory file, not through a pipe, so no
start-up write can block on a worker that died; the worker maps it, loads it, and says
``started`` (with its timings) or ``failed`` (with the exception) on its own socket. The parent
waits for that with a timeout and a liveness check, and unlinks the file once all started.

A loader's pool (``Launch(zygote=True)``) starts one such interpreter, the zygote
(:mod:`.zygote`), which loads the payload once and forks each worker from itself, so the
payload's imports (torch for a torchvision-like dataset) are paid once, not once per worker;
one-off jobs (:mod:`.jobs`) start a fresh interpreter each.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any, NoReturn

from ..errors import ConfigError, WorkerDied, WorkerHung, limit_error
from ..shm.folder import pick_folder
from ..shm.segments import Segment
from . import threads as threads_mod
from .command import load_payload, worker_argv, worker_env
from .errors import describe_exit, pack_exception, unpack_exception
from .importpath import worker_path
from .packing import pack
from .zygote import ForkedProcess, Zygote

POLL_S = 0.1
START_TIMEOUT_S = 120.0  # a worker alive but not started by then is hung (a death shows at once)
SLOW_START_S = 2.0  # a start-up longer than this gets its reason in stats()
SLOW_PART_S = 1.0  # a part of it that took this long is named as a reason
_HEAVY = (
    "tensorflow",
    "keras",
    "torch",
    "jax",
    "flax",
    "transformers",
    "ray",
    "sklearn",
    "datasets",
    "pyarrow",
    "pandas",
    "scipy",
    "PIL",
)


# ---------------------------------------------------------------------------- parent side


@dataclass
class StartReport:
    """How one worker's start went, in seconds: launch to ``started``, and its parts."""

    total_s: float = 0.0  # by the worker's clock: not when the parent got round to reading it
    python_s: float = 0.0  # the interpreter starting and importing stoker
    stoker_s: float = 0.0  # of which importing stoker (numpy, the decoders)
    settings_s: float = 0.0  # loading the pickled settings (imports the user's modules)
    imported: list[str] = field(default_factory=list)  # top-level modules that load imported
    forked: bool = False  # forked by the pool's zygote, which paid the parts above once


#: What loading the settings imports the user's modules for, as ``describe`` names it.
CAUSES = {
    "dataset": "importing the dataset's modules",
    "augment": "loading your augment",
    "settings": "loading the loader's settings",
}
_FIXES = {
    "dataset": "the workers start when the Loader is made, so set-up done after Loader() (building "
    "the model) overlaps it; a module that defines the dataset and imports less "
    "starts faster",
    "augment": "define it in your script or notebook (it then travels by value) or in a module "
    "that imports less",
    "settings": "a module your source or options come from imports that much",
}


_MADE_HERE_FIX = (
    "meanwhile this process made the batches, at one process's speed; a module that defines "
    "the dataset and imports less starts the workers sooner"
)


def describe(
    reports: list[StartReport],
    cause: str = "settings",
    waited_s: float | None = None,
    here: tuple[int, float, bool] = (0, 0.0, False),
) -> tuple[float, str]:
    """``(seconds, text)``: how long the slowest worker took to start, its parts, and, when it
    was slow, why. ``cause`` says what loading the settings imported the user's modules for
    (a key of :data:`CAUSES`); ``waited_s``, for workers started ahead of the first batch, how
    much of the start the first batch still waited for; ``here``, ``(batches, seconds, still
    starting)``: the batches the calling process filled itself while the workers started."""
    batches, seconds, starting = here
    which = f"first {batches} batches were" if batches > 1 else "first batch was"
    made_here = (
        f"the {which} made in this process ({seconds:.2f} s) while the workers started"
        if batches
        else ""
    )
    if starting:
        return 0.0, f"{made_here}; they have not all started yet" if made_here else ""
    if not reports:
        return 0.0, ""
    slow = max(reports, key=lambda r: r.total_s)
    forked = "one start-up process, forked for each: " if slow.forked else ""
    text = (
        f"workers started in {slow.total_s:.2f} s ({forked}Python "
        f"{slow.python_s - slow.stoker_s:.2f} s, importing stoker {slow.stoker_s:.2f} s, "
        f"{CAUSES[cause]} {slow.settings_s:.2f} s)"
    )
    if made_here:
        text += f", from Loader(); {made_here}, so the first batch did not wait for them"
    elif waited_s is not None:
        text += f", from Loader(); the first batch waited {waited_s:.2f} s for them"
        if waited_s < 0.9 * slow.total_s:
            text += " (the rest overlapped your own code)"
    if slow.total_s < SLOW_START_S or (
        not made_here and waited_s is not None and waited_s < SLOW_PART_S
    ):
        return slow.total_s, text
    why = []
    public = [m for m in slow.imported if not m.startswith("_")]
    heavy = [m for m in public if m in _HEAVY] or public[:5]
    if slow.settings_s >= SLOW_PART_S:
        what = f" ({', '.join(heavy)})" if heavy else ""
        fix = _MADE_HERE_FIX if made_here else _FIXES[cause]
        where = "once, in the start-up process" if slow.forked else "in each worker"
        why.append(f"{CAUSES[cause]}{what} {where}: {slow.settings_s:.1f} s; {fix}")
    if slow.python_s >= SLOW_PART_S or not why:
        cores, load = os.cpu_count() or 1, os.getloadavg()[0]
        why.append(
            f"starting Python and importing stoker took {slow.python_s:.1f} s: the "
            f"machine is busy (load average {load:.1f} on {cores} cores) or its disk is "
            "slow"
        )
    return slow.total_s, f"{text}; slow because " + "; and ".join(why)


class Process:
    """A started worker: the subset of ``multiprocessing.Process`` the pool uses."""

    def __init__(self, popen: subprocess.Popen, name: str) -> None:
        self.popen, self.name, self.pid = popen, name, popen.pid

    @property
    def exitcode(self) -> int | None:
        """None while running; the exit code, or minus the signal that ended it."""
        return self.popen.poll()

    def is_alive(self) -> bool:
        """True while the process runs."""
        return self.popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for the process to end (and reap it)."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def terminate(self) -> None:
        """SIGTERM."""
        if self.is_alive():
            self.popen.terminate()

    def kill(self) -> None:
        """SIGKILL."""
        if self.is_alive():
            self.popen.kill()


class Launch:
    """Workers being started: one shared copy of the payload, a process and socket each;
    ``threads`` sizes each worker's thread pools (None: left alone, see :mod:`.threads`).
    With ``zygote``, one start-up process loads the payload at once and forks each worker
    (:mod:`.zygote`); it outlives the launch (its owner closes it after the workers)."""

    def __init__(self, blob: bytes, threads: int | None = 1, zygote: bool = False) -> None:
        folder = pick_folder(len(blob), "the workers' settings")
        self.segment = Segment.create(len(blob), "launch", folder)
        self.segment.map[: len(blob)] = blob
        self.size, self.threads = len(blob), threads
        self.reports: dict[int, StartReport] = {}
        self.zygote: Zygote | None = None
        if zygote:
            try:
                self.zygote = Zygote(self.segment.path, self.size, threads)
            except BaseException as exc:
                self.close()
                if not isinstance(exc, OSError):
                    raise
                limit = limit_error(exc, "start worker processes (their start-up process)")
                if limit is exc:
                    raise
                raise limit from exc

    def start(self, wid: int) -> tuple[Process | ForkedProcess, Connection]:
        """Start worker ``wid``; it loads the payload and then calls ``target(wid, conn, ...)``.
        An operating-system limit (open files, processes, memory) is a ResourceLimitError
        naming it."""
        try:
            return self._start(wid)
        except OSError as exc:
            limit = limit_error(exc, f"start worker process {wid}")
            if limit is exc:
                raise
            raise limit from exc

    def _start(self, wid: int) -> tuple[Process | ForkedProcess, Connection]:
        if not sys.executable:
            raise ConfigError(
                "cannot start worker processes: this Python does not know its own "
                "executable (sys.executable is empty); use workers=0"
            )
        if self.zygote is not None:
            return self.zygote.fork(wid)
        ours, theirs = Pipe(duplex=True)
        fd = theirs.fileno()
        argv = worker_argv(worker_path(), fd, self.segment.path, self.size, wid, self.threads)
        try:
            env = threads_mod.environment(self.threads, worker_env())
            popen = subprocess.Popen(argv, pass_fds=(fd,), env=env, stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return Process(popen, f"stoker-worker-{wid}"), ours

    def wait_started(
        self, procs: Sequence[Process | ForkedProcess], conns: list[Connection], timeout: float
    ) -> list[StartReport]:
        """Wait until every worker said ``started``; raise if one failed, died or hung."""
        deadline = time.monotonic() + timeout
        while not self._collect(procs, conns, POLL_S):
            if time.monotonic() > deadline:
                late = [w for w in range(len(procs)) if w not in self.reports]
                raise WorkerHung(
                    f"worker(s) {late} did not start within {timeout:.0f} s (still starting Python "
                    "or loading the loader's settings: a module your augment comes from may "
                    "import something slow); raise Loader(timeout=...) if that is expected"
                )
        self.close()
        return [self.reports[w] for w in range(len(procs))]

    def poll(self, procs: Sequence[Process | ForkedProcess], conns: list[Connection]) -> bool:
        """Without waiting: True once every worker has said ``started``; raise if one failed
        or died (the reports that arrived are kept for :meth:`wait_started`)."""
        return self._collect(procs, conns, 0.0)

    def _collect(
        self, procs: Sequence[Process | ForkedProcess], conns: list[Connection], timeout: float
    ) -> bool:
        """Take the start reports that arrive within ``timeout``; True once all are in."""
        pending = [c for w, c in enumerate(conns) if w not in self.reports]
        for ready in wait(pending, timeout) if pending else ():
            wid = conns.index(ready)  # type: ignore[arg-type]
            self.reports[wid] = self._reply(wid, procs[wid], conns[wid])
        for wid, proc in enumerate(procs):
            if wid not in self.reports and proc.exitcode is not None:
                self._raise_died(wid, proc)
        return len(self.reports) == len(procs)

    def _reply(self, wid: int, proc: Process | ForkedProcess, conn: Connection) -> StartReport:
        """The ``started`` report of worker ``wid``, or its start-up exception raised here."""
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            self._raise_died(wid, proc)
        if kind == "failed":
            raise unpack_exception(payload, "while starting")
        if isinstance(proc, ForkedProcess):
            proc.wait_forked()  # its pid and pidfd, which the zygote sends after the fork
        return StartReport(**payload)

    def _raise_died(self, wid: int, proc: Process | ForkedProcess) -> NoReturn:
        proc.join(2.0)
        raise WorkerDied(
            f"worker {wid} (pid {proc.pid}) {describe_exit(proc.exitcode)} while starting, "
            "before it could report (its error, if any, is printed above)"
        )

    def close(self) -> None:
        """Remove the shared copy of the payload (workers that loaded it keep what they read)."""
        self.segment.unlink()
        self.segment.close()


# ---------------------------------------------------------------------------- worker side


def main(argv: list[str]) -> None:
    """Entry point of a worker process: load the payload, say ``started``, run the target."""
    started = time.time()
    fd, path, size, wid, launched = int(argv[0]), argv[1], int(argv[2]), int(argv[3]), argv[4]
    booted = float(argv[6])  # when BOOT began importing stoker
    conn = Connection(fd)
    try:
        threads_mod.limit(None if argv[5] == "None" else int(argv[5]))  # before any user code
        target, args, imported, settings_s = load_payload(path, size)
    except BaseException as exc:  # noqa: BLE001 - every start failure goes to the parent
        conn.send(("failed", pack_exception(exc, wid, None)))
        sys.exit(1)
    conn.send(
        (
            "started",
            {
                "python_s": max(0.0, started - float(launched)),
                "stoker_s": max(0.0, started - booted),
                "settings_s": settings_s,
                "imported": imported,
                "total_s": max(0.0, time.time() - float(launched)),
            },
        )
    )
    target(wid, conn, *args)


def payload_bytes(target: Any, args: tuple, parts: dict[str, Any]) -> bytes:
    """What :class:`Launch` sends: the cloudpickled ``(target, args)`` (the worker's
    ``sys.path``, this process's, travels on its command line: :func:`worker_path`)."""
    return pack((target, args), parts)
