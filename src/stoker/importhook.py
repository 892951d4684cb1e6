"""Run a function right after a module is imported, in this process (a leaf: standard library only).

A worker must size torch's thread pools and seed torch's generator, yet never import torch
itself (a worker that does not need it would pay its start-up). So stoker watches the import:
``after_import("torch", fn)`` calls ``fn(torch)`` the moment torch's ``__init__`` has run,
before the code that imported it goes on, or at once if it is already imported. One finder on
``sys.meta_path`` serves every watched name; it finds nothing itself (the other finders find
the module, whose real loader runs as it would) and leaves ``sys.meta_path`` once nothing is
watched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


def after_import(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once top-level module ``name`` is imported (now if it is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    finder = next((f for f in sys.meta_path if isinstance(f, AfterImport)), None)
    if finder is None:
        finder = AfterImport()
        sys.meta_path.insert(0, finder)
    finder.callbacks.setdefault(name, []).append(callback)


class AfterImport(importlib.abc.MetaPathFinder):
    """Wraps the real loader of each watched module so its callbacks run after it loads."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        """The real spec of a watched module, its loader wrapped; None for any other."""
        if fullname not in self.callbacks:
            return None
        callbacks = self.callbacks.pop(fullname)
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = _real_spec(fullname, path, target, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenCall(spec.loader, callbacks)
        return spec


def _real_spec(
    fullname: str, path: Sequence[str] | None, target: Any, skip: Any
) -> importlib.machinery.ModuleSpec | None:
    """The spec the other finders on ``sys.meta_path`` give for ``fullname``."""
    for finder in [f for f in sys.meta_path if f is not skip]:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None


class _ThenCall(importlib.abc.Loader):
    """A loader that runs the real one (the module sees its real loader), then the callbacks."""

    def __init__(self, loader: Any, callbacks: list[Callback]) -> None:
        self.loader, self.callbacks = loader, callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """As the real loader."""
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Run the module, then each callback on it."""
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        for callback in self.callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
