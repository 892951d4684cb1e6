"""One loader, one consumer: the checks that keep a loader from being iterated by two threads at
once or used by a forked child of the process that made it.

Two threads iterating one loader would split its batches between them, deliver one twice and
wait on each other's replies; a forked child shares the parent's pipes and memory names, so
anything it did would break the parent's loader. Both get a clear error at once instead.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import StokerError


class Guard:
    """The process a loader belongs to and the thread taking a batch from it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.taking_lock = threading.Lock()  # held while a batch is being taken
        self.holder: threading.Thread | None = None

    def check_process(self) -> None:
        """A forked child sees a closed loader, with the reason."""
        if os.getpid() != self.pid:
            raise StokerError(
                f"this Loader belongs to process {self.pid}; this process ({os.getpid()}) was "
                "forked from it, and a forked child cannot use it (its workers and shared "
                "memory are the parent's). Create a new Loader in the child"
            )

    @contextmanager
    def taking(self) -> Iterator[None]:
        """Around taking one batch (choosing it, waiting for it, moving the position): two
        threads at this point at once are two consumers, and the second gets an error at
        once instead of waiting on the first one's batch. Threads that take turns (one
        consumer at a time, as tf.data's generator threads do) each get the next batch, once."""
        self.check_process()
        if not self.taking_lock.acquire(blocking=False):
            raise _second_consumer(self.holder)
        self.holder = threading.current_thread()
        try:
            yield
        finally:
            self.holder = None
            self.taking_lock.release()


def _second_consumer(thread: threading.Thread | None) -> StokerError:
    who = f"thread {thread.name!r}" if thread is not None else "another thread"
    return StokerError(
        f"this Loader is already being iterated by {who}; a loader has one consumer. Iterate "
        "it from one thread (hand batches to others through a queue), or make one Loader per "
        "thread (with rank=/world_size= to split the data)"
    )
