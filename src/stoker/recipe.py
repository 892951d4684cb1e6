"""The Recipe: what a loader is made of, built once from its arguments and sent whole to every
worker process and every cluster node (what they receive is exactly this object)."""

from __future__ import annotations

from dataclasses import dataclass

from .assemble import Assembler
from .batchfn import BatchTransform
from .order import Plan
from .schema import BatchSchema
from .sources.base import Source
from .sources.readahead import ReadSettings
from .transforms import PipelineSpec


@dataclass(frozen=True)
class Recipe:
    """The opened ``source``, the decode + transform ``pipeline`` (a frozen ``PipelineSpec``:
    each process builds its live pipeline from it), the epoch ``plan`` (which samples batch k
    of epoch e holds), the batch ``schema`` (slot layout, columns, form), the
    ``read_settings`` (``read_ahead``, ``page_cache``) and the optional ``batch_fn``: everything
    a batch is made from.

    Batch k of epoch e is a pure function of it, so every process that fills batches (the
    loader for ``workers=0`` or ``peek()``, each worker, each node's workers) builds its
    filler from the same Recipe with :meth:`assembler`."""

    source: Source
    pipeline: PipelineSpec
    plan: Plan
    schema: BatchSchema
    read_settings: ReadSettings | None = None
    batch_fn: BatchTransform | None = None

    def assembler(self) -> Assembler:
        """A batch filler for this process (with its own live pipeline)."""
        return Assembler(
            self.source,
            self.pipeline,
            self.plan,
            self.schema.columns,
            self.read_settings,
            self.batch_fn,
        )

    def close(self) -> None:
        """Release what the parent owns for it: the shared copy of the columns, the source's
        open files (never called in a worker: the parent owns both)."""
        self.schema.columns.close()
        self.source.close()
