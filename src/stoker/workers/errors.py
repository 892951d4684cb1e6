"""Carry a worker's exception to the parent and re-raise it there as the same type."""

from __future__ import annotations

import pickle
import signal
import traceback
from typing import Any

from .._compat import add_note
from ..errors import RemoteTraceback, StokerError


def pack_exception(exc: BaseException, wid: int, sample: str | None) -> dict[str, Any]:
    """Everything the parent needs to re-raise ``exc``: the object if it pickles, its traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    blob: bytes | None = None
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)  # some exceptions pickle but cannot be rebuilt
        blob = data
    except Exception:
        pass
    return {
        "blob": blob,
        "type": type(exc).__name__,
        "text": str(exc),
        "tb": tb,
        "wid": wid,
        "sample": sample,
    }


def unpack_exception(payload: dict[str, Any], where: str) -> BaseException:
    """The worker's exception, with its traceback as ``__cause__`` and a note naming the sample."""
    exc: BaseException | None = None
    if payload["blob"] is not None:
        try:
            exc = pickle.loads(payload["blob"])
        except Exception:
            exc = None
    if exc is None:
        exc = StokerError(f"{payload['type']}: {payload['text']}")
    exc.__cause__ = RemoteTraceback(f'\n"""\n{payload["tb"]}"""')
    sample = payload.get("sample")
    note = f"stoker: raised in worker {payload['wid']} {where}"
    if sample:
        note += f" while loading {sample}"
    add_note(exc, note)
    return exc


def describe_exit(exitcode: int | None) -> str:
    """'killed by SIGKILL' or 'exited with code 3'."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"
