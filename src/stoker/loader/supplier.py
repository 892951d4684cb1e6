"""What fills a started loader's batches, as the loader sees it: one protocol that the
in-process filler (``running.Inline``, and ``running.Warming`` while workers start), the
workers' ``Engine`` and the cluster's engine all implement, so the loader never asks which
one it has."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..schema import Fields

if TYPE_CHECKING:
    from ..adapters.feed import Ring
    from ..assemble import Report


class Supplier(Protocol):
    """What fills the loader's batches: ``Inline`` (``workers=0``), the ``Engine`` over local
    workers, or the cluster's engine. The loader asks it only this, never which one it is."""

    def get(self, key: tuple[int, int]) -> tuple[Fields, Report]:
        """The fields of batch ``key`` (epoch, position) and its report."""
        ...

    def close(self) -> None:
        """Let go of its memory (the workers, if any, are stopped by their pool's owner)."""
        ...

    def prefetch_depth(self) -> int:
        """Batches it keeps ready ahead of the consumer (0: filled when asked)."""
        ...

    @property
    def deepened(self) -> str:
        """For ``stats()``: how (and why) its prefetch grew since the start; "" if not."""
        ...

    @property
    def orphaned(self) -> int:
        """Batches the consumer kept past their reuse, each given memory of its own."""
        ...

    def ring(self) -> Ring | None:
        """The shared-memory ring its batches are views of (a device adapter page-locks it
        and copies straight out of it), or None when they lie in process memory."""
        ...

    def warming(self) -> tuple[int, float] | None:
        """``(batches, seconds)`` filled in this process while the workers launched ahead
        are starting (:class:`Warming`); None when it is not waiting for workers."""
        ...
