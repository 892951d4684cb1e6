"""The import rules of the layout, read from the source (``ast``), not by importing: every module
has a layer and imports only its own layer and those below, at run time and for type hints alike
(``TYPE_CHECKING`` blocks and imports inside functions count); no module imports itself through
others (no circle); ``stoker.shm`` is a leaf. And, by running one: a worker process never loads
the loader it works for."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import numpy as np
import pytest

import stoker

SRC = Path(stoker.__file__).parent
#: Every part of the package, lowest layer first. A module imports only its own layer and the
#: layers below; a new module or package of ``src/stoker`` gets a place here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("stoker._compat", "stoker._version", "stoker.errors", "stoker.importhook"),
    ("stoker.shm",),
    (  # the stages: what a batch is made of, and the Recipe that holds them
        "stoker.assemble",
        "stoker.autoaugment",
        "stoker.batch",
        "stoker.batchfn",
        "stoker.crops",
        "stoker.decode",
        "stoker.imageops",
        "stoker.ops",
        "stoker.order",
        "stoker.pixels",
        "stoker.recipe",
        "stoker.requeststats",
        "stoker.schema",
        "stoker.seeding",
        "stoker.sources",
        "stoker.stats",
        "stoker.transforms",
        "stoker.userops",
    ),
    ("stoker.workers",),  # they receive a Recipe; they never see the Loader
    ("stoker.adapters",),  # typed against ``adapters.feed.Feed``, never against the Loader
    ("stoker.loader",),
    ("stoker", "stoker.__main__", "stoker.cli", "stoker.datasets"),  # the faces
)
#: Parts that may not import each other although their layers would allow it.
APART = (("stoker.adapters", "stoker.workers"),)
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


def _part(module: str) -> str:
    """The part of the package a module belongs to: ``stoker.x`` for ``stoker.x.y``."""
    return ".".join(module.split(".")[:2])


def _layer(module: str) -> int | None:
    part = _part(module)
    return next((k for k, layer in enumerate(LAYERS) if part in layer), None)


def _graph() -> dict[str, set[str]]:
    """Every module of the package -> the modules of the package it imports."""
    return {
        _name(path): {m for m in _imports(path) if _under(m, ("stoker",))}
        for path in sorted(SRC.rglob("*.py"))
    }


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(group) > 1:
                found.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_parser_sees_relative_absolute_and_nested_imports():
    pool = _imports(SRC / "workers" / "pool.py")
    assert {"stoker.shm.ownerlock", "stoker.errors", "numpy"} <= pool  # from ..shm import x
    assert "stoker.recipe" in pool  # under TYPE_CHECKING
    assert "stoker.decode.jpegcrop" in _imports(SRC / "workers" / "actor.py")  # in a function
    assert "stoker.loader" in _imports(SRC / "__init__.py")  # the face's first-use import


def test_every_module_has_a_layer():
    graph = _graph()
    assert len(graph) > 100  # the modules were found
    assert not [m for m in graph if _layer(m) is None], "add them to LAYERS"


def test_no_module_imports_a_layer_above_it_even_for_type_hints():
    graph = _graph()
    bad = []
    for module, imported in sorted(graph.items()):
        for m in sorted(imported):
            if _layer(m) is None or _layer(m) > _layer(module):  # type: ignore[operator]
                bad.append(f"{module} imports {m}")
            elif any({_part(module), _part(m)} == set(pair) for pair in APART):
                bad.append(f"{module} imports {m}")
    assert not bad, "\n".join(bad)


def test_the_layers_put_the_workers_and_the_adapters_below_the_loader():
    # the rule the layout exists for: a worker process or a framework view never loads the
    # Loader (workers receive a Recipe; adapters are typed against Feed)
    loader = _layer("stoker.loader")
    assert _layer("stoker.workers") < loader and _layer("stoker.adapters") < loader  # type: ignore[operator]
    assert _layer("stoker.recipe") < _layer("stoker.workers")  # type: ignore[operator]


def test_no_module_imports_itself_through_others():
    circles = _circles(_graph())
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert [sorted(c) for c in _circles(graph)] == [["a", "b", "c"]]


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


def _loaded_in(workers: int) -> set[int]:
    """Whether ``stoker.loader`` is imported where the augment runs (1) or not (0), read off the
    pixels of one batch made with ``workers`` processes."""

    def probe(image: np.ndarray, rng: object) -> np.ndarray:  # nested: it travels by value
        import sys

        return np.full_like(image, "stoker.loader" in sys.modules)

    images = np.full((4, 8, 8, 3), 7, np.uint8)
    with stoker.Loader(
        images, labels=np.arange(4), batch_size=4, image_size=8, augment=probe, workers=workers
    ) as loader:
        batch, _ = next(iter(loader))
    return set(np.unique(batch).tolist())


@pytest.mark.timeout(120)
def test_a_worker_process_never_loads_the_loader():
    assert _loaded_in(0) == {1}  # in this process the probe sees the loader
    assert _loaded_in(1) == {0}
