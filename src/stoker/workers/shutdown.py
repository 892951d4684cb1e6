"""SIGTERM gets the same orderly close as Ctrl-C: every running loader of this process stops its
workers and removes its shared memory, then the process ends by SIGTERM as the default would.

The handler is installed (from the main thread, at a loader's start) only while SIGTERM has its
default action: a handler of the user's own is never replaced. Whatever the close does not
finish (a second signal, a SIGKILL), the reaper finishes.

At the interpreter's exit the running loaders are closed the same way, by an ``atexit`` hook
registered at the first loader's start, so before any ``weakref.finalize`` callback (those run
after every later ``atexit`` hook): a segment's own finalizer would otherwise unlink it while
a worker still starting goes on to open it.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from typing import Any, Protocol


class Closable(Protocol):
    """What the handler closes: a running loader's workers and memory."""

    def close(self, fast: bool = False) -> None: ...


_running: weakref.WeakSet[Any] = weakref.WeakSet()
_AT_EXIT: list[bool] = []  # appended to once the atexit hook is registered


def _close_all() -> None:
    """Close every running loader quickly (the process is ending)."""
    for run in list(_running):
        try:
            run.close(fast=True)
        except BaseException:  # noqa: BLE001 - the process is ending either way
            pass


def _on_sigterm(signum: int, frame: Any) -> None:
    """Close every running loader, quickly, then die of SIGTERM with the default action."""
    _close_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def register(run: Closable) -> None:
    """Track a started loader; at the first, register the exit hook; install the SIGTERM
    handler if SIGTERM has no handler yet."""
    _running.add(run)
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(_close_all)
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or no signals here
        pass


def _after_fork_in_child() -> None:
    """A forked child forgets the parent's running loaders (never stops or unlinks them)."""
    for run in list(_running):
        try:
            run.close()  # in a child, close() only forgets
        except BaseException:  # noqa: BLE001 - never break the user's fork
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def unregister(run: Closable) -> None:
    """The loader closed: nothing to do for it at SIGTERM."""
    _running.discard(run)
