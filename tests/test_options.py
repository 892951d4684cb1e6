"""Every Loader argument is declared once, as a field of an option group (loader/options.py),
and help(), inspect.signature and docs/options.md are all generated from the groups; every
public object of the curated API has a docstring."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import inspect
import pathlib
import pickle
import pydoc
import sys
import typing

import numpy as np
import pytest

import stoker
from stoker.errors import ConfigError
from stoker.loader import kwargs as loader_kwargs
from stoker.loader import optiondocs, options
from stoker.loader.options import Options

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _fields() -> list[dataclasses.Field]:
    return [f for _, f in options.entries()]


def test_every_argument_is_one_field_of_one_group_with_a_type_and_a_one_line_doc() -> None:
    names = [f.name for f in _fields()]
    assert len(names) == len(set(names)), "an argument is declared in two groups"
    assert [key for key, _ in options.GROUPS] == [f.name for f in dataclasses.fields(Options)]
    for f in _fields():
        meta = f.metadata
        assert meta["doc"].strip(), f.name
        assert "\n" not in meta["doc"] and meta["doc"].rstrip().endswith((".", ")")), f.name


def test_each_argument_has_one_type_its_annotation_and_it_is_a_real_type() -> None:
    # the annotation is the type the signature, help(), the docs and LoaderKwargs show: no
    # second spelling of it in the field, and never Any beside a type written as a string
    for _, group in options.GROUPS:
        hints = typing.get_type_hints(group)
        for f in dataclasses.fields(group):
            assert "type" not in f.metadata, f"{f.name}: the annotation is its only type"
            assert hints[f.name] is not typing.Any, f"{f.name} is annotated Any"
            assert typing.Any not in typing.get_args(hints[f.name]), f"{f.name}: Any in a union"


def test_the_groups_and_the_whole_are_frozen() -> None:
    opts = Options.from_kwargs(source="data/train")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.image.color_mode = "rgb"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.image = opts.image  # type: ignore[misc]


def test_parse_checks_every_argument_and_keeps_the_typed_values() -> None:
    opts = options.parse(source="x", batch_size=np.int64(8), seed=np.int64(3), timeout=5)
    assert opts.batch.batch_size == 8 and type(opts.batch.batch_size) is int
    assert opts.order.seed == 3 and type(opts.order.seed) is int
    assert opts.run.timeout == 5.0 and type(opts.run.timeout) is float
    assert opts.image.color_mode is None and opts.run.workers == "auto"
    assert Options.from_kwargs(**opts.kwargs()) == opts
    with pytest.raises(TypeError, match="unexpected keyword argument 'batch_sise'"):
        options.parse(batch_sise=8)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size=0: must be a positive integer"),
        ({"color_mode": "cmyk"}, "color_mode='cmyk': use 'grayscale', 'rgb', 'rgba' or None"),
        ({"interpolation": "fancy"}, "interpolation='fancy': use 'auto'"),
        ({"fast_decode": "yes"}, "fast_decode='yes': use True, False or 'auto'"),
        ({"max_errors": -1}, "max_errors=-1: give a count (10) or a fraction"),
        ({"image_size": 0}, "image_size=0: give a positive int"),
        ({"stratify": 1}, "stratify=1: give True or False"),
        ({"drop_last": "no"}, "drop_last='no': give True, False or None"),
        ({"rank": 0}, "give both rank= and world_size=, or neither"),
        ({"rank_split": "even"}, "rank_split='even': use 'pad'"),
        ({"subset": "training"}, "subset='training' needs validation_split="),
        ({"read_ahead": -1}, "read_ahead=-1: give 'auto'"),
        ({"page_cache": "evict"}, "page_cache='evict': give 'auto'"),
        (
            {"cluster_workers": 4},
            "cluster_workers, cluster_transport, cluster_listen and cluster_connect_timeout need",
        ),
        (
            {"crop_to_aspect_ratio": True, "pad_to_aspect_ratio": True},
            "pass crop_to_aspect_ratio=True or pad_to_aspect_ratio=True, not both",
        ),
    ],
)
def test_a_wrong_argument_is_refused_before_the_source_is_opened(kwargs, message) -> None:
    # the source does not exist: the argument's own message comes first
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stoker.Loader("no/such/folder", **kwargs)


def test_a_warning_about_an_argument_points_at_the_callers_line() -> None:
    cpus = stoker.loader.config.usable_cpus()
    images = np.zeros((8, 8, 8, 3), np.uint8)
    with pytest.warns(stoker.StokerWarning, match="usable CPU cores") as caught:
        stoker.Loader(images, batch_size=2, workers=cpus + 1).close()
    assert [w.filename for w in caught] == [__file__]


def test_the_signature_is_the_groups_with_their_defaults() -> None:
    sig = inspect.signature(stoker.Loader)
    params = list(sig.parameters.values())
    assert [p.name for p in params] == [f.name for f in _fields()]
    for p, f in zip(params, _fields(), strict=True):
        assert p.default == f.default and p.annotation == f.type, p.name
    assert params[0].name == "source" and params[0].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params[1:])
    assert sig.parameters["batch_size"].default == 64
    # the signature binds what Loader accepts, and refuses what it does not
    sig.bind("data/train", batch_size=8, subset="both", validation_split=0.2)
    with pytest.raises(TypeError):
        sig.bind("data/train", batch_sise=8)


def test_a_loader_keeps_its_options_through_copy_and_pickle() -> None:
    images = np.zeros((8, 8, 8, 3), np.uint8)
    with stoker.Loader(images, batch_size=4, workers=0, seed=5) as loader:
        for clone in (copy.copy(loader), pickle.loads(pickle.dumps(loader))):
            with clone:
                assert clone.options.order.seed == 5 and clone.options.batch.batch_size == 4
                assert clone.options.image == loader.options.image


def test_help_documents_every_argument_with_its_type_and_default() -> None:
    text = pydoc.render_doc(stoker.Loader, renderer=pydoc.plaintext)
    for f in _fields():
        entry = f"{f.name} ({f.type}):"
        assert entry in text, f"help(stoker.Loader) does not document {f.name}"
    flat = " ".join(text.split())
    assert "batch_size (int): Samples per batch. Default: `64`." in flat
    assert "Default: `'auto'`." in flat


def test_docs_options_page_is_generated_from_the_groups() -> None:
    page = (ROOT / "docs" / "options.md").read_text()
    assert page == optiondocs.markdown_page(), (
        "docs/options.md is out of date: run python scripts/gen_options.py"
    )
    for key, _ in options.GROUPS:
        assert f"\n## {key}\n" in page
    for f in _fields():
        assert f"| `{f.name}` | `{f.type.replace('|', chr(92) + '|')}` | " in page


def test_type_checkers_see_every_keyword_argument_with_its_groups_type() -> None:
    kwargs = loader_kwargs.LoaderKwargs.__annotations__
    typed = {k: getattr(v, "__forward_arg__", v) for k, v in kwargs.items()}
    assert typed == {f.name: f.type for f in _fields() if f.name != "source"}, (
        "LoaderKwargs (loader/kwargs.py) is out of date: run python scripts/gen_options.py"
    )
    hints = inspect.signature(stoker.Loader.__init__).parameters
    assert list(hints) == ["self", "source", "kwargs"]
    assert "Unpack[LoaderKwargs]" in str(hints["kwargs"].annotation)


def test_gen_options_check_mode_agrees(tmp_path: pathlib.Path) -> None:
    script = ROOT / "scripts" / "gen_options.py"
    spec = importlib.util.spec_from_file_location("gen_options", script)
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.page() == (ROOT / "docs" / "options.md").read_text()
    assert gen.module() == (ROOT / "src" / "stoker" / "loader" / "kwargs.py").read_text()
    gen.PAGE = tmp_path / "options.md"
    gen.PAGE.write_text("# stale\n")
    stale_module = gen.module().replace("    follow_links: bool\n", "")
    gen.MODULE = tmp_path / "kwargs.py"
    gen.MODULE.write_text(stale_module)
    argv = sys.argv
    try:
        sys.argv = ["gen_options.py", "--check"]
        assert gen.main() == 1
        sys.argv = ["gen_options.py"]
        assert gen.main() == 0
        assert "    follow_links: bool\n" in gen.MODULE.read_text()
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
