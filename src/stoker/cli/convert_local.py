"""The local engine of ``stoker convert``: shards written by worker processes on this machine.

The workers start from stoker's own entry point (:func:`stoker.workers.jobs.map_jobs`), as the
loader's do, so ``convert(..., workers=4)`` works from a script without a ``__main__`` guard,
from ``python -c`` and from a notebook. Each worker gets the source once, then one shard at a
time; it reports progress every few samples. A shard that raises stops the conversion with that
exception (the finished shards stay, and a rerun rebuilds only the others).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..sources.base import Source
from ..workers.jobs import map_jobs
from .shard_writer import write_shard

__all__ = ["run_shards"]


class _ShardJob:
    """Writes one shard ``(number, samples)`` of ``source``; opens the source once per worker."""

    def __init__(self, source: Source, job: dict[str, Any]) -> None:
        self.source, self.job, self.opened = source, job, False

    def __call__(self, task: tuple[int, list[int]], tick: Any) -> dict[str, Any]:
        if not self.opened:
            self.source.open_in_worker()
            self.opened = True
        number, samples = task
        return write_shard(self.source, self.job, number, samples, tick)


def run_shards(
    source: Source,
    job: dict[str, Any],
    plan: dict[str, Any],
    todo: list[int],
    workers: int,
    bar: Any,
) -> Iterator[dict[str, Any]]:
    """Write the shards in ``todo``; yield each one's record as it completes."""
    if workers == 1 or len(todo) <= 1:
        for number in todo:
            yield write_shard(source, job, number, plan["shards"][number], bar.add)
        return
    tasks = [(number, plan["shards"][number]) for number in todo]
    for _, record in map_jobs(_ShardJob(source, job), tasks, workers, on_tick=bar.add):
        yield record
