"""Every Loader argument is documented once (loader/options.py), and help(), inspect.signature
and docs/options.md all show it; every public object of the curated API has a docstring."""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import pydoc
import sys

import pytest

import stoker
from stoker.loader import Loader, options

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _init_arguments() -> list[str]:
    return [p.name for p in options.arguments(Loader.__init__)]


def test_every_loader_argument_has_one_entry_and_every_entry_an_argument() -> None:
    names = [o.name for o in options.OPTIONS]
    assert len(names) == len(set(names)), "an argument is documented twice in loader/options.py"
    args = _init_arguments()
    missing = [a for a in args if a not in names]
    extra = [n for n in names if n not in args]
    assert not missing, (
        f"Loader arguments with no entry in src/stoker/loader/options.py: {missing}; add one "
        "Option(name, type, doc) line each, then run python scripts/gen_options.py"
    )
    assert not extra, f"entries in loader/options.py that name no Loader argument: {extra}"


def test_entries_are_one_plain_line_with_a_type() -> None:
    for o in options.OPTIONS:
        assert o.type.strip() and o.doc.strip(), o.name
        assert "\n" not in o.doc and o.doc.rstrip().endswith((".", ")")), o.name


def test_the_signature_shows_the_real_arguments() -> None:
    sig = inspect.signature(stoker.Loader)
    params = list(sig.parameters.values())
    assert [p.name for p in params] == _init_arguments()
    init = inspect.signature(Loader.__init__).parameters
    for p in params:
        assert p.default == init[p.name].default and p.kind == init[p.name].kind, p.name
    assert params[0].name == "source" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert sig.parameters["batch_size"].default == 64
    # the signature binds what Loader accepts, and refuses what it does not
    sig.bind("data/train", batch_size=8, subset="both", validation_split=0.2)
    with pytest.raises(TypeError):
        sig.bind("data/train", batch_sise=8)


def test_help_documents_every_argument_with_its_type_and_default() -> None:
    text = pydoc.render_doc(stoker.Loader, renderer=pydoc.plaintext)
    init = inspect.signature(Loader.__init__).parameters
    for o in options.OPTIONS:
        entry = f"{o.name} ({o.type}):"
        assert entry in text, f"help(stoker.Loader) does not document {o.name}"
    flat = " ".join(text.split())
    assert f"Default: `{options.default_text(init['batch_size'])}`." in flat
    assert "Default: `'auto'`." in flat


def test_docs_options_page_is_generated_from_the_table() -> None:
    page = (ROOT / "docs" / "options.md").read_text()
    assert page == options.markdown_page(Loader.__init__), (
        "docs/options.md is out of date: run python scripts/gen_options.py"
    )
    for name in _init_arguments():
        assert f"| `{name}` |" in page


def test_gen_options_check_mode_agrees(tmp_path: pathlib.Path) -> None:
    script = ROOT / "scripts" / "gen_options.py"
    spec = importlib.util.spec_from_file_location("gen_options", script)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.page() == (ROOT / "docs" / "options.md").read_text()
    gen.PAGE = tmp_path / "options.md"
    gen.PAGE.write_text("# stale\n")
    argv = sys.argv
    try:
        sys.argv = ["gen_options.py", "--check"]
        assert gen.main() == 1
        sys.argv = ["gen_options.py"]
        assert gen.main() == 0
        sys.argv = ["gen_options.py", "--check"]
        assert gen.main() == 0
    finally:
        sys.argv = argv


# --------------------------------------------------------------------------- docstrings


def _public_members(cls: type) -> list[tuple[str, object]]:
    """Public methods and properties a class defines itself (not inherited from a framework)."""
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            found.append((f"{cls.__qualname__}.{name}", value))
    return found


def _curated_api() -> list[tuple[str, object]]:
    """stoker's public names, their public methods, the adapters' public classes and methods."""
    objects: list[tuple[str, object]] = []
    for name in stoker.__all__:
        if name.startswith("__"):
            continue
        obj = getattr(stoker, name)
        objects.append((name, obj))
        if inspect.isclass(obj):
            objects += _public_members(obj)
    objects += [(f"ops.{n}", getattr(stoker.ops, n)) for n in stoker.ops.__all__]
    for n in stoker.ops.__all__:
        objects += _public_members(getattr(stoker.ops, n))
    adapters = []
    for module, framework in (
        ("torch", "torch"),
        ("jax", "jax"),
        ("keras", "keras"),
        ("tf", "tensorflow"),
    ):
        if importlib.util.find_spec(framework) is not None:
            adapters.append(importlib.import_module(f"stoker.adapters.{module}"))
    import stoker.adapters.base as base

    adapters.append(base)
    for module in adapters:
        for name in getattr(module, "__all__", None) or dir(module):
            obj = getattr(module, name)
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                objects.append((f"{module.__name__}.{name}", obj))
                if inspect.isclass(obj):
                    objects += _public_members(obj)
    return objects


def test_every_public_object_of_the_api_has_a_docstring() -> None:
    bare = [name for name, obj in _curated_api() if not (inspect.getdoc(obj) or "").strip()]
    assert not bare, f"public objects without a docstring: {bare}"
