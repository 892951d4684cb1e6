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

from collections.abc import Callable
from types import ModuleType

from ..importhook import after_import

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
        return (
            "worker threads: left to each library (worker_threads=None): torch, OpenMP/BLAS "
            "and OpenCV may start one thread per core in every worker"
        )
    each = "1 per pool" if threads == 1 else f"{threads} per pool"
    return (
        f"worker threads: {each} (torch intra/inter-op, OpenMP/BLAS, OpenCV, TensorFlow"
        f"{', XLA' if threads == 1 else ''}); Loader(worker_threads=) changes it"
    )


def limit(threads: int | None) -> None:
    """In a worker, before any user code is loaded: size OpenCV's pool and torch's and
    TensorFlow's pools now (if imported) or when they are imported."""
    if threads is None:
        return
    import cv2

    cv2.setNumThreads(threads)
    after_import("torch", _torch_setter(threads))
    after_import("tensorflow", _tf_setter(threads))


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
