"""The adapter boundary (``stoker.adapters.feed``) and the loader's one supplier protocol.

Adapters see a Loader only as a ``Feed`` and its ring only as a ``Ring``: every adapter's
``loader`` is annotated ``Feed`` (the DataLoader parts, ``adapters/dataloader.py``, with their own
``Sampled`` protocol), no adapter module names ``Any`` or imports from
``workers/``, and a real Loader has every member the protocol lists (mypy proves the types:
``loader/core.py``'s ``_is_a_feed``). The in-process filler and the workers' engine answer the
loader's questions through one ``Supplier`` protocol, never an ``isinstance``.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

import numpy as np
import pytest

import stoker
from stoker.adapters import feed
from stoker.loader import running, supplier

ADAPTERS = pathlib.Path(feed.__file__).parent
KW = {"batch_size": 4, "image_size": 16, "augment": "train", "seed": 1}
#: The protocol a module's ``loader`` is typed against, where it is not ``Feed``.
PROTOCOL = {"dataloader.py": "Sampled"}


def _modules() -> dict[str, ast.Module]:
    return {p.name: ast.parse(p.read_text()) for p in sorted(ADAPTERS.glob("*.py"))}


def _protocol_members(cls: type) -> list[str]:
    own = vars(cls)
    return [n for n in own if not n.startswith("_") or n in ("__len__", "__iter__")]


def _names_any(value: object) -> bool:
    """True for a string annotation or alias (``"dict[str, Any]"``) that names ``Any``."""
    if not isinstance(value, str) or "Any" not in value:
        return False
    try:
        tree = ast.parse(value, mode="eval")
    except SyntaxError:  # prose: a docstring or message
        return False
    return any(isinstance(n, ast.Name) and n.id == "Any" for n in ast.walk(tree))


def test_every_adapter_takes_the_loader_as_a_feed() -> None:
    loose = []
    for name, tree in _modules().items():
        protocol = PROTOCOL.get(name, "Feed")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                for arg in args:
                    if (
                        arg.arg == "loader"
                        and ast.unparse(arg.annotation or ast.Name("")) != protocol
                    ):
                        loose.append(f"{name}:{node.lineno} {node.name}({arg.arg})")
            if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "loader":
                if ast.unparse(node.annotation) != protocol:
                    loose.append(f"{name}:{node.lineno} loader: {ast.unparse(node.annotation)}")
    assert not loose, f"adapter parameters typed otherwise than Feed: {loose}"


def test_no_adapter_module_names_any() -> None:
    found = [
        f"{name}:{node.lineno}"
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "Any")
        or (isinstance(node, ast.Attribute) and node.attr == "Any")
        or (isinstance(node, ast.alias) and node.name == "Any")
        or (isinstance(node, ast.Constant) and _names_any(node.value))
    ]
    assert not found, f"typing.Any in the adapters (type the boundary instead): {found}"


def test_adapters_import_nothing_from_the_workers() -> None:
    found = []
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                if module.lstrip(".").split(".")[0] == "workers" or "stoker.workers" in module:
                    found.append(f"{name}:{node.lineno} from {module}")
            if isinstance(node, ast.Import):
                found += [f"{name}:{node.lineno}" for a in node.names if "workers" in a.name]
    assert not found, f"adapters importing the workers (use adapters.feed): {found}"


@pytest.mark.timeout(120)
def test_a_loader_has_every_member_of_the_feed(image_folder) -> None:
    with stoker.Loader(image_folder, workers=0, **KW) as loader:
        missing = [n for n in _protocol_members(feed.Feed) if not hasattr(loader, n)]
        assert not missing, f"Feed members a Loader lacks: {missing}"
        for n in _protocol_members(feed.FieldList):
            assert hasattr(loader.recipe.schema.slot_layout, n), n
        assert hasattr(loader.recipe.source, "sample_fields")
        state = loader.state_dict()
        assert loader.advance_state(state, 1)["position"] == state["position"] + 1


@pytest.mark.timeout(120)
def test_in_process_batches_have_no_ring_and_no_prefetch(image_folder) -> None:
    with stoker.Loader(image_folder, workers=0, **KW) as loader:
        x, _ = next(iter(loader))
        supplier = loader._supply.running.engine
        assert isinstance(supplier, running.Inline)
        assert supplier.ring() is None and loader._ring() is None
        assert supplier.prefetch_depth() == 0 and supplier.deepened == ""
        report = loader.stats()
        assert report.prefetch == 0 and report.kept_batches == 0
        assert x.shape == (4, 16, 16, 3)


@pytest.mark.timeout(120)
def test_worker_batches_are_views_of_the_ring_the_loader_hands_adapters(image_folder) -> None:
    with stoker.Loader(image_folder, workers=1, prefetch=2, **KW) as loader:
        assert loader._ring() is None  # before the first batch nothing runs
        x, _ = next(iter(loader))
        ring = loader._ring()
        assert ring is loader._supply.running.engine and ring.ring() is ring
        seen: list[str] = []
        ring.watch_segments(lambda seg: seen.append(seg.path), lambda seg: None)
        assert seen and all(isinstance(p, str) for p in seen)

        class Done:
            synced = 0

            def synchronize(self) -> None:
                Done.synced += 1

        assert ring.hold_until(x, Done()) is True
        assert ring.hold_until(np.zeros(3), Done()) is False  # not a handed-out view
        assert loader.stats().prefetch == ring.prefetch_depth() == len(ring.segments) - 2
        del x
        for _ in loader:  # the held slot comes round again: its fence is waited for first
            pass
        assert Done.synced == 1


def test_the_feed_lists_only_what_adapters_use() -> None:
    """Each named Feed member is read by some adapter module: the protocol is what adapters
    depend on, no more."""
    sources = "\n".join(p.read_text() for p in ADAPTERS.glob("*.py") if p.name != "feed.py")
    members = [n for n in _protocol_members(feed.Feed) if not n.startswith("__")]
    unused = [name for name in members if f".{name}" not in sources]
    assert not unused, f"Feed members no adapter uses: {unused}"
    assert inspect.isclass(feed.Ring) and inspect.isclass(supplier.Supplier)
