"""The import rules of the layout, read from the source (``ast``), not by importing: a lower
stage never imports a higher one, and ``stoker.shm`` is a leaf."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import stoker

SRC = Path(stoker.__file__).parent
#: The stages below the workers and the loader: none of them may import either.
LOWER = (
    "stoker.sources",
    "stoker.assemble",
    "stoker.batchfn",
    "stoker.schema",
    "stoker.order",
    "stoker.decode",
    "stoker.transforms",
    "stoker.crops",
    "stoker.userops",
    "stoker.ops",
)
HIGHER = ("stoker.workers", "stoker.loader")
#: What the shared-memory leaf may import besides the standard library and itself.
SHM_ALLOWED = ("stoker.errors", "stoker.shm", "numpy")


def _name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _exists(module: str) -> bool:
    """True when ``module`` (``stoker.x.y``) is a module or package under src/."""
    base = SRC.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (top level, functions, TYPE_CHECKING),
    relative imports resolved; ``from pkg import mod`` counts as ``pkg.mod``."""
    module = _name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if base.startswith("stoker") and _exists(sub) else base)
    return found


def _modules(prefix: str) -> list[Path]:
    base = SRC.parent.joinpath(*prefix.split("."))
    if base.is_dir():
        return sorted(base.rglob("*.py"))
    return [base.with_suffix(".py")] if base.with_suffix(".py").is_file() else []


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_parser_sees_relative_absolute_and_nested_imports():
    pool = _imports(SRC / "workers" / "pool.py")
    assert {"stoker.shm.ownerlock", "stoker.errors", "numpy"} <= pool  # from ..shm import x
    assert "stoker.loader.recipe" in pool  # under TYPE_CHECKING
    assert "stoker.decode.jpegcrop" in _imports(SRC / "workers" / "actor.py")  # in a function


def test_no_lower_stage_imports_the_workers_or_the_loader():
    bad = []
    files = [f for prefix in LOWER for f in _modules(prefix)]
    assert len(files) > 30  # the stages were found
    for path in files:
        bad += [f"{_name(path)} imports {m}" for m in sorted(_imports(path)) if _under(m, HIGHER)]
    assert not bad, "\n".join(bad)


def test_shm_is_a_leaf_importing_only_errors_the_standard_library_and_numpy():
    bad = []
    files = _modules("stoker.shm")
    assert {p.stem for p in files} >= {"segments", "folder", "stale", "ownerlock", "reaper"}
    for path in files:
        for m in sorted(_imports(path)):
            top = m.split(".")[0]
            if not (_under(m, SHM_ALLOWED) or (top in sys.stdlib_module_names and top != "stoker")):
                bad.append(f"{_name(path)} imports {m}")
    assert not bad, "\n".join(bad)
