"""Thread pools inside worker processes: one thread per pool unless ``Loader(worker_threads=)``
says otherwise.

The workers are the parallelism: a worker whose torch, OpenMP/BLAS, OpenCV, TensorFlow or XLA
pool starts one thread per core makes ``workers x cores`` threads fight over the cores, and a
small torch op in a user's ``augment=`` pays a thread hand-off per call. So a worker is
started with the pools' environment variables set (read by OpenMP, OpenBLAS, MKL, BLIS,
numexpr, TensorFlow and XLA when their library loads), sets OpenCV's count itself, and sets
torch's intra- and inter-op counts the moment torch is imported: at once if it already is,
else through an import hook, so a worker that never needs torch never imports it.

``threads=None`` leaves every pool alone: the worker inherits the trainer's environment and
each library picks its own default. The trainer's own process is never changed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

#: Environment variables that size a pool when its library loads.
COUNT_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
)
#: XLA's CPU flags for one thread (XLA has no flag for another count).
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def environment(threads: int | None, env: dict[str, str]) -> dict[str, str]:
    """A worker's environment: ``env`` with every pool's count set to ``threads`` (and XLA's
    single-thread flags added to the user's ``XLA_FLAGS`` for 1); ``env`` itself for None."""
    if threads is None:
        return env
    out = {**env, **{name: str(threads) for name in COUNT_VARS}}
    if threads == 1:
        out["XLA_FLAGS"] = " ".join(p for p in (env.get("XLA_FLAGS", ""), XLA_ONE_THREAD) if p)
    return out


def describe(threads: int | None) -> str:
    """The line ``stats()`` prints about the workers' thread pools."""
    if threads is None:
        return ("worker threads: left to each library (worker_threads=None): torch, OpenMP/BLAS "
                "and OpenCV may start one thread per core in every worker")
    each = "1 per pool" if threads == 1 else f"{threads} per pool"
    return (f"worker threads: {each} (torch intra/inter-op, OpenMP/BLAS, OpenCV, TensorFlow"
            f"{', XLA' if threads == 1 else ''}); Loader(worker_threads=) changes it")


def limit(threads: int | None) -> None:
    """In a worker, before any user code is loaded: size OpenCV's pool and torch's and
    TensorFlow's pools now (if imported) or when they are imported."""
    if threads is None:
        return
    import cv2

    cv2.setNumThreads(threads)
    setters = {"torch": _torch_setter(threads), "tensorflow": _tf_setter(threads)}
    for name, setter in list(setters.items()):
        if name in sys.modules:
            setter(sys.modules[name])
            del setters[name]
    if setters:
        sys.meta_path.insert(0, _AfterImport(setters))


def _torch_setter(threads: int) -> Callable[[ModuleType], None]:
    def set_torch(torch: ModuleType) -> None:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # inter-op work already started (torch imported by a .pth file)
            pass

    return set_torch


def _tf_setter(threads: int) -> Callable[[ModuleType], None]:
    def set_tf(tf: ModuleType) -> None:
        config = getattr(getattr(tf, "config", None), "threading", None)
        if config is None:
            return
        try:
            config.set_intra_op_parallelism_threads(threads)
            config.set_inter_op_parallelism_threads(threads)
        except RuntimeError:  # its runtime already started: the environment variables hold
            pass

    return set_tf


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``setters[name](module)`` right after top-level module ``name`` is imported (its
    ``__init__`` has run, before the importing code goes on); otherwise finds nothing."""

    def __init__(self, setters: dict[str, Callable[[ModuleType], None]]) -> None:
        self.setters = setters

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        """The real spec of a watched module, its loader wrapped; None for any other."""
        if fullname not in self.setters:
            return None
        setter = self.setters.pop(fullname)
        if not self.setters and self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = _real_spec(fullname, path, target, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenSet(spec.loader, setter)
        return spec


def _real_spec(fullname: str, path: Sequence[str] | None, target: Any, skip: Any
               ) -> importlib.machinery.ModuleSpec | None:
    """The spec the other finders on ``sys.meta_path`` give for ``fullname``."""
    for finder in [f for f in sys.meta_path if f is not skip]:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            return spec
    return None


class _ThenSet(importlib.abc.Loader):
    """A loader that runs the real one, then the setter on the loaded module."""

    def __init__(self, loader: Any, setter: Callable[[ModuleType], None]) -> None:
        self.loader, self.setter = loader, setter

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        """As the real loader."""
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        """Run the module (which sees its real loader), then size its pools."""
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.setter(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
