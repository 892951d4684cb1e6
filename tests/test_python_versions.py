"""Python 3.10 is supported (requires-python): no stoker module may call what 3.10 lacks except
through ``stoker._compat``. The core suite runs on every supported CPython (``nox -s core``);
this check catches a 3.11-only call on a path that suite does not reach."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import stoker

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli on 3.10
    import tomli as tomllib

SRC = Path(stoker.__file__).parent
ROOT = SRC.parents[1]
# 3.11+ calls and the _compat helper that replaces each
NEWER = {
    r"\.add_note\(": "stoker._compat.add_note(exc, note)",
    r"hashlib\.file_digest\(": "stoker._compat.file_sha256(f)",
    r"^\s*import tomllib|^\s*from tomllib": "no replacement: read TOML only in tests",
    r"\bexcept\*": "no replacement: except* is 3.11 syntax",
    r"\bdatetime\.UTC\b": "datetime.timezone.utc",
    r"from typing import .*\bSelf\b": "a string annotation or a TypeVar",
}


def test_no_module_calls_what_python_3_10_lacks():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "_compat.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for pattern, fix in NEWER.items():
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}  -> use {fix}")
    assert not found, "3.11-only calls (Python 3.10 is supported):\n" + "\n".join(found)


def test_the_floor_the_constraints_and_nox_agree():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == ">=3.10"
    noxfile = (ROOT / "noxfile.py").read_text()
    for version in ("3.10", "3.11", "3.12", "3.13"):
        assert f'"{version}"' in noxfile, f"noxfile.py does not run the core suite on {version}"
    # a pin that needs 3.11 has a 3.10 twin behind a marker, so the README's install resolves
    constraints = (ROOT / "constraints.txt").read_text()
    assert 'numpy==2.2.6; python_version < "3.11"' in constraints
