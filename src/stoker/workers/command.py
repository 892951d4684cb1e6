"""A worker's command line and what it loads: shared by :mod:`.launch` (a fresh worker per
process) and :mod:`.zygote` (one start-up process that forks them), below both."""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import Any


# A worker's command: ``python -c BOOT N PATH_1 .. PATH_N ARGS..``. Its first statement sets
# sys.path (only the builtin sys is imported before), so no folder the trainer does not import
# from can supply stoker or anything it imports; it must stay free of any import before that.
def boot(module: str) -> str:
    """The ``-c`` statement that sets ``sys.path``, then runs ``module``'s ``main``."""
    return (
        "import sys; n = int(sys.argv[1]); sys.path[:] = sys.argv[2:2 + n]; "
        "del sys.argv[1:2 + n]; import time; sys.argv.append(repr(time.time())); "
        f"from {module} import main; main(sys.argv[1:])"
    )


BOOT = boot("stoker.workers.launch")
# Python 3.11+: no folder is put first on sys.path even before BOOT runs (site's own imports).
SAFE_PATH = ("-P",) if sys.version_info >= (3, 11) else ()


def worker_env() -> dict[str, str]:
    """This process's environment, with only the absolute ``PYTHONPATH`` entries kept: an empty
    or relative one names a folder relative to where the worker starts (the worker's
    ``sys.path`` is this process's anyway, with those entries resolved where it started)."""
    env = dict(os.environ)
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def worker_argv(
    path: list[str], fd: int, segment: str, size: int, wid: int, threads: int | None
) -> list[str]:
    """The command of a fresh worker: ``path`` its ``sys.path``, ``fd`` its socket, the
    payload in the file ``segment`` (``size`` bytes)."""
    return [
        sys.executable,
        *SAFE_PATH,
        "-c",
        BOOT,
        str(len(path)),
        *path,
        str(fd),
        segment,
        str(size),
        str(wid),
        repr(time.time()),
        str(threads),
    ]


def load_payload(path: str, size: int) -> tuple[Any, tuple, list[str], float]:
    """The target and its arguments from the launch file, the modules loading them imported."""
    with open(path, "rb") as f:
        data = f.read(size)
    before = set(sys.modules)
    t0 = time.perf_counter()
    target, args = pickle.loads(data)  # cloudpickle's own helpers load only if used
    seconds = time.perf_counter() - t0
    new = sorted({m.split(".")[0] for m in set(sys.modules) - before} - {"stoker", "cloudpickle"})
    return target, args, new, seconds
