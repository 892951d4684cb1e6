"""A real second user for the hostile tests: ``nobody`` (uid 65534), through ``setpriv``, with
only the system Python, working in a shared sticky folder (mode 1777, like /tmp) that the test
makes under /tmp and removes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"


def second_user_reason() -> str | None:
    """None when a second user can be run here, else the true reason why not."""
    if os.geteuid() != 0:
        return "needs root to run a second user (setpriv --reuid); run the suite as root"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is not installed"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} (a Python the second user can run) is missing"
    return None


Nobody = Callable[[str], subprocess.CompletedProcess]


@pytest.fixture
def nobody() -> Nobody:
    """Run Python code as uid/gid 65534 with no supplementary groups; fails on a non-zero exit."""
    reason = second_user_reason()
    if reason:
        pytest.skip(reason)

    def run(code: str) -> subprocess.CompletedProcess:
        argv = [
            "setpriv",
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            SYSTEM_PYTHON,
            "-I",
            "-c",
            code,
        ]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
        assert out.returncode == 0, f"as nobody: {out.stderr}"
        return out

    return run


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder anyone may write in, sticky (mode 1777), reachable by the second user."""
    folder = Path(tempfile.mkdtemp(prefix="stoker-shared-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
