"""The core suite (no ML framework installed) on every supported CPython: ``nox -s core``.

Each session makes a fresh virtual environment, installs stoker with its ``test`` extra under
``constraints.txt`` (which pins per Python version where a release dropped 3.10), builds the C
extensions for that interpreter and runs every test that needs no framework. Tests that need
Keras, PyTorch, TensorFlow, JAX or Ray skip with the missing package named; the full suite
(``python -m pytest`` after the README's dev install) runs them on the default Python.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
nox.options.sessions = ["core"]
nox.options.default_venv_backend = "venv"


def _pyenv_versions() -> None:
    """Where pyenv manages the interpreters, let its shims answer for every installed 3.x
    (a shim that started nox sets PYENV_VERSION to its own version alone)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if not root.is_dir():
        return
    active = [v for v in os.environ.get("PYENV_VERSION", "").split(":") if v]
    found = sorted(p.name for p in root.iterdir() if p.name.startswith("3."))
    os.environ["PYENV_VERSION"] = ":".join(active + [v for v in found if v not in active])


_pyenv_versions()


@nox.session(python=PYTHONS)
def core(session: nox.Session) -> None:
    """Install with the test extra and run the suite minus the framework tests."""
    session.install("-c", "constraints.txt", "-e", ".[test]")
    session.run(
        "python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not ray", *session.posargs
    )
