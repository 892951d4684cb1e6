"""The Ray engine of ``stoker convert``: each planned shard is written by one Ray task.

Used through ``convert(..., engine="ray", ray_address=None)`` or ``stoker convert --engine ray``.
Everything except the running of shard jobs is the local engine's (:mod:`stoker.cli.convert`):
the same plan, the same shard writer (:func:`stoker.cli.shard_writer.write_shard`), the same
resume rules and the same manifest, so the shards are byte-identical to a local conversion of the
same source.

* Ray is imported only here, and only when this engine runs (``import stoker`` never imports it).
* If Ray is not initialised yet, :func:`run_shards` calls ``ray.init(address=ray_address)``, with
  a local cluster of ``num_cpus=workers`` when no address is given, and shuts Ray down again when
  the conversion ends. A Ray session the caller started is used as it is and left running.
* The source travels by value: it is put once in the object store and every task gets a
  reference (sources pickle cheaply: paths, offsets and labels, not images). For local
  workers a path index or an in-memory array pickles as a handle to a shared-memory segment
  of this machine, which a task on another node could not open; while the Ray engine runs,
  those two types are serialised for Ray by value instead (their numpy arrays go to the object
  store zero-copy), and no shared-memory segment is made at all.
* On a multi-node cluster, ``dst`` must be a folder every node sees at the same path (NFS, a
  FUSE mount, ...) and the source must be readable from every node; stoker (with the same
  pyarrow) must be installed on the nodes. Each task writes its shard under a temporary name,
  records it in ``DST/.stoker-convert`` and renames it, exactly as a local worker does.
* A failing task is retried by Ray (``MAX_RETRIES`` times, on worker crashes and on exceptions).
  A shard that still fails does not stop the others: every other shard is finished, then
  :class:`~stoker.errors.StokerError` names the failed shards. The finished shards stay, and a
  rerun (with either engine) rebuilds only the missing ones. No manifest is written then.
* Progress advances by whole shards, as their tasks complete.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, StokerError

__all__ = ["run_shards", "MAX_RETRIES"]

MAX_RETRIES = 3  # Ray retries of one shard's task (crashes and exceptions) before giving up


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "engine='ray' needs Ray: pip install 'stoker[ray]' (or pip install 'ray>=2.9')"
        ) from exc
    return ray


def _shard_task(source: Any, job: dict[str, Any], number: int, samples: list[int]) -> dict:
    """Body of the Ray task: write shard ``number`` as the local engine would; return its record."""
    import cv2

    from .shard_writer import write_shard

    cv2.setNumThreads(1)  # one task per CPU Ray schedules; cv2's own threads would contend
    source.open_in_worker()
    return write_shard(source, job, number, samples, _no_tick)


def _no_tick(count: int) -> None:
    """Progress inside a task is not reported: the driver counts whole shards."""


def _index_state(index: Any) -> tuple[str, np.ndarray, np.ndarray]:
    return index.root, np.asarray(index.blob), np.asarray(index.offsets)


def _index_from(state: tuple[str, np.ndarray, np.ndarray]) -> Any:
    from ..sources.base import PathIndex

    root, blob, offsets = state
    return PathIndex.from_arrays(Path(root), blob, offsets)


def _array_state(source: Any) -> tuple[type, dict[str, Any], np.ndarray]:
    fields = {k: v for k, v in vars(source).items() if k not in ("_array", "_shared")}
    return type(source), fields, np.asarray(source._array)


def _array_from(state: tuple[Any, dict[str, Any], np.ndarray]) -> Any:
    cls, fields, array = state
    source = cls.__new__(cls)
    source.__dict__.update(fields)
    source._array, source._shared = array, None
    return source


@contextlib.contextmanager
def by_value(ray: Any) -> Iterator[None]:
    """While inside, Ray serialises path indexes and array sources by value (not as handles
    to this machine's shared memory), so a task on any node can use them."""
    from ..sources.arrays import ArraySource
    from ..sources.base import PathIndex

    ray.util.register_serializer(PathIndex, serializer=_index_state, deserializer=_index_from)
    ray.util.register_serializer(ArraySource, serializer=_array_state, deserializer=_array_from)
    try:
        yield
    finally:
        for cls in (PathIndex, ArraySource):
            with contextlib.suppress(Exception):
                ray.util.deregister_serializer(cls)


def run_shards(
    source: Any,
    job: dict[str, Any],
    plan: dict[str, Any],
    todo: list[int],
    workers: int,
    bar: Any,
    ray_address: str | None = None,
):
    """Write the shards in ``todo`` as Ray tasks; yield each one's record as it completes.

    Same contract as :func:`stoker.cli.convert_local.run_shards`. Raises
    :class:`StokerError` naming the shards whose tasks failed after all retries, once every
    other shard is done.
    """
    if not todo:
        return
    from .shard_writer import shard_name

    ray = _ray()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {
            "address": ray_address,
            "include_dashboard": False,
            "logging_level": "warning",
            "log_to_driver": True,
        }
        if ray_address is None:
            kwargs["num_cpus"] = workers
        ray.init(**kwargs)
        started = True
    try:
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=True)(_shard_task)
        with by_value(ray):
            source_ref = ray.put(source)
        refs = {task.remote(source_ref, job, n, plan["shards"][n]): n for n in todo}
        pending = list(refs)
        failed: list[str] = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.25)
            for ref in done:
                number = refs[ref]
                try:
                    record = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    failed.append(f"{shard_name(number)}: {_cause(exc)}")
                    continue
                bar.add(len(plan["shards"][number]))
                yield record
        if failed:
            raise StokerError(
                f"{len(failed)} shard(s) failed after {MAX_RETRIES} Ray retries; the other "
                f"shards are written and a rerun rebuilds only these:\n  " + "\n  ".join(failed)
            )
    finally:
        if started:
            ray.shutdown()


def _cause(exc: BaseException) -> str:
    """The original error of a failed Ray task, in one line."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1]}" if text else type(exc).__name__
