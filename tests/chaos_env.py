"""Private mount namespaces for the chaos tests: a script runs with its own tmpfs on /dev/shm
(and optionally on its temp folder), of a given size, optionally filled, so that full or small
shared memory can be tested without touching the machine's /dev/shm or other tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import stoker

SRC = str(Path(stoker.__file__).resolve().parents[1])  # the stoker under test (PYTHONPATH)
TESTS = str(Path(__file__).parent)
NAMESPACE = ["unshare", "-m", "--propagation", "private", "sh", "-c"]
MOUNT = "mount -t tmpfs -o size={size} tmpfs {where}"
FILL = "(dd if=/dev/zero of={where}/fill bs=64k 2>/dev/null || true)"


def namespace_reason() -> str | None:
    """None when a private mount namespace with its own /dev/shm can be made, else why not."""
    if shutil.which("unshare") is None:
        return "the unshare command is not installed"
    try:
        out = subprocess.run(
            NAMESPACE + ["mount -t tmpfs tmpfs /dev/shm"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if out.returncode != 0:
        return f"unshare -m is not permitted here (needs root or CAP_SYS_ADMIN): {out.stderr}"
    return None


def env() -> dict[str, str]:
    """The environment for a child: the stoker under test and the tests' helpers importable."""
    path = os.pathsep.join(p for p in (SRC, TESTS, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def run_in_namespace(
    argv: list[str],
    shm: str = "256m",
    fill_shm: bool = False,
    tmp: tuple[str, str] | None = None,
    fill_tmp: bool = False,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run ``argv`` with a fresh tmpfs of size ``shm`` on /dev/shm (filled if asked) and, given
    ``tmp=(folder, size)``, a tmpfs on ``folder`` used as TMPDIR (filled if asked)."""
    steps = [MOUNT.format(size=shm, where="/dev/shm")]
    if fill_shm:
        steps.append(FILL.format(where="/dev/shm"))
    extra = {}
    if tmp is not None:
        steps.append(MOUNT.format(size=tmp[1], where=tmp[0]))
        if fill_tmp:
            steps.append(FILL.format(where=tmp[0]))
        extra["TMPDIR"] = tmp[0]
    script = " && ".join(steps) + ' && exec "$@"'
    return subprocess.run(
        NAMESPACE + [script, "sh", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env(), **extra},
    )


def python(code: str) -> list[str]:
    """argv running ``code`` in a fresh interpreter."""
    return [sys.executable, "-c", code]
