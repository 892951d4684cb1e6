"""The RunSpec: how a loader's batches are made (worker processes and why that many, prefetch,
timeout, threads per pool, the cluster), resolved once when the Loader is made and handed whole
to the code that reads it: the local ``WorkerPool`` (and, in its ``WorkerSpec``, every worker
process) and the cluster's nodes (``Nodes``, ``nodestart``, each node's ``Decoder`` and
``NodeRing``). Nobody in between relays its values one by one.

A leaf of ``workers/`` (it imports only ``clusteroptions``, itself a leaf), so the loader, the
pool and the nodes read one frozen object without importing each other.

A run option that reaches the workers is a field of the ``run`` group
(``loader/options.py``), a field of the same name here (:meth:`RunSpec.of` copies it), and the
line that reads it (``spec.run.<name>`` in a worker, ``run.<name>`` in the pool or a node)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .clusteroptions import ClusterOptions

__all__ = ["RunSpec"]


@dataclass(frozen=True)
class RunSpec:
    """How the batches of one loader are made (``Loader(workers=..., worker_threads=...,
    prefetch=..., timeout=..., cluster=...)``, resolved)."""

    #: Worker processes on this machine (0: batches are made in the calling process).
    workers: int = 0
    #: Why that many (``stats()`` shows it).
    workers_reason: str = "in the calling process (workers=0)"
    #: ``workers="auto"`` not settled yet: the first batch measures a sample and settles it.
    auto_workers: bool = False
    #: Batches in flight as given: ``"auto"`` or a depth (the ring is sized from it and the
    #: worker count when it starts, ``config.prefetch``).
    prefetch: int | str = "auto"
    #: Seconds without progress before ``WorkerHung``.
    timeout: float = 300.0
    #: Threads per pool in each worker (None: each library's own default; ``threads``).
    worker_threads: int | None = 1
    #: Decode on a Ray cluster's nodes as well (None: this machine only).
    cluster: ClusterOptions | None = None

    @classmethod
    def of(cls, given: object, **resolved: object) -> RunSpec:
        """The spec from the checked ``run`` option group ``given``: each field taken from
        the group's attribute of the same name, unless ``resolved`` gives its value."""
        names = [f.name for f in dataclasses.fields(cls)]
        taken = {n: getattr(given, n) for n in names if n not in resolved and hasattr(given, n)}
        return cls(**taken, **resolved)  # type: ignore[arg-type]

    def settled(self, workers: int, reason: str) -> RunSpec:
        """This spec with ``workers="auto"`` settled to ``workers`` processes, for ``reason``."""
        return dataclasses.replace(self, workers=workers, workers_reason=reason, auto_workers=False)
