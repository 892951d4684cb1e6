"""What goes to a worker, as bytes: the payload cloudpickled, and where it does not pickle, a
ConfigError that names the innermost culprit (``augment -> global 'log' (a TextIOWrapper ...)``)
and the fix."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError


def pack(payload: Any, parts: dict[str, Any]) -> bytes:
    """``payload`` as cloudpickle bytes; a ConfigError names what cannot be sent, and the fix.

    ``parts`` maps readable names ("augment", "source") to the pieces of ``payload`` the user
    gave, searched in order for the object that fails to pickle.
    """
    import cloudpickle  # the parent's side only: a worker loads the bytes with plain pickle

    try:
        return cloudpickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - pickling raises many types; all mean the same
        where = _culprit_in(parts) or _culprit(payload, "the loader's settings", 0, set())
        raise ConfigError(
            f"cannot send {where} to the worker processes: "
            f"{type(exc).__name__}: {exc}. Workers are separate processes; an open file, a "
            "lock, a socket or a thread cannot travel to them. Create it inside the function "
            "(open the file on first use), pass a path or plain data instead, or use workers=0"
        ) from exc


def _culprit_in(parts: dict[str, Any]) -> str | None:
    for name, value in parts.items():
        found = _culprit(value, name, 0, set())
        if found:
            return found
    return None


def _culprit(obj: Any, name: str, depth: int, seen: set[int]) -> str | None:
    """The path to the innermost part of ``obj`` that does not pickle, or None if it does."""
    import cloudpickle

    if id(obj) in seen:
        return None
    seen.add(id(obj))
    try:
        cloudpickle.dumps(obj)
        return None
    except Exception:  # noqa: BLE001
        pass
    if depth < 6:
        for label, child in _children(obj):
            found = _culprit(child, f"{name}{label}", depth + 1, seen)
            if found:
                return found
    return f"{name} ({_short(obj)})"


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """The parts pickling ``obj`` pickles too, each with a readable label."""
    code = getattr(obj, "__code__", None)
    if code is not None:  # a function: its closure, the globals it uses, its defaults
        cells = getattr(obj, "__closure__", None) or ()
        for var, cell in zip(code.co_freevars, cells, strict=False):
            yield f" -> closure variable {var!r}", cell.cell_contents
        glob = getattr(obj, "__globals__", {})
        for var in code.co_names:
            if var in glob:
                yield f" -> global {var!r}", glob[var]
        for i, value in enumerate(getattr(obj, "__defaults__", None) or ()):
            yield f" -> default argument {i}", value
        return
    if hasattr(obj, "__self__") and hasattr(obj, "__func__"):  # a bound method
        yield f".{obj.__func__.__name__}'s object", obj.__self__
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
        return
    for attr in ("func", "args", "keywords"):  # functools.partial
        if hasattr(obj, attr) and type(obj).__name__ == "partial":
            yield f".{attr}", getattr(obj, attr)
    for key, value in getattr(obj, "__dict__", {}).items():
        yield f".{key}", value


def _short(obj: Any) -> str:
    text = repr(obj)
    return f"a {type(obj).__name__}: {text[:80]}" if len(text) <= 80 else f"a {type(obj).__name__}"
