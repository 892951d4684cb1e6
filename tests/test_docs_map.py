"""docs/contributing.md against the tree, so the module map cannot drift: every module under
``src/stoker`` is in the map and every module the map names exists; every name the map cites
in code is defined in the module of its line (or is a ``Loader`` keyword); and across the page
every cited path exists and every class-like or private name is defined somewhere in the
package. Read from the sources (``ast``), nothing imported but ``stoker.Loader``'s signature.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "stoker"
PAGE = ROOT / "docs" / "contributing.md"

SPAN = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^### `src/stoker/(?P<folder>[\w/]*)`", re.M)
BULLET = re.compile(r"^- (?P<body>.*(?:\n  .*)*)", re.M)
MODULE = re.compile(r"^[\w]+\.(?:py|c)$")
# a code name: `Name`, `Name.attr`, `name()`, `name=`
CODE = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?=?$")
CLASSLIKE = re.compile(r"^[A-Z][a-z0-9]+\w*$")


def _modules() -> set[str]:
    """Every module of the package, as a path under src/stoker (``loader/core.py``); a
    subpackage's ``__init__.py`` is its folder's heading, not a module of its own."""
    found = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    found |= {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.c")}
    return {m for m in found if "/" not in m or not m.endswith("/__init__.py")}


def _defined(path: Path) -> set[str]:
    """The names a module defines: its top-level functions, classes and assignments, and the
    members of its classes (``Recipe.assembler`` is both ``Recipe`` and ``assembler``)."""
    if path.suffix != ".py":
        return set()
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _all_defined() -> set[str]:
    return set().union(*(_defined(PACKAGE / m) for m in _modules()))


@dataclass(frozen=True)
class Entry:
    """One line of the map: the modules it names (under src/stoker) and its other spans."""

    line: int
    modules: tuple[str, ...]
    spans: tuple[str, ...]


def _map_section(text: str) -> tuple[int, str]:
    start = text.index("## The module map")
    end = text.find("\n## ", start + 1)
    return text.count("\n", 0, start) + 1, text[start : None if end < 0 else end]


def map_entries(text: str) -> list[Entry]:
    """The map's bullets, each under its ``### `src/stoker/FOLDER/` `` heading: the module
    spans before the first ``:`` (``- `png.py`, `webp.py`: ...``), the spans after it."""
    first_line, section = _map_section(text)
    headings = list(HEADING.finditer(section))
    entries = []
    for k, heading in enumerate(headings):
        end = headings[k + 1].start() if k + 1 < len(headings) else len(section)
        block = section[heading.end() : end]
        folder = heading.group("folder")
        for bullet in BULLET.finditer(block):
            head, _, rest = bullet.group("body").partition(":")
            line = first_line + section.count("\n", 0, heading.end() + bullet.start())
            mods = tuple(folder + m for m in SPAN.findall(head))
            entries.append(Entry(line, mods, tuple(SPAN.findall(rest))))
    return entries


def _loader_keywords() -> set[str]:
    import stoker

    return set(inspect.signature(stoker.Loader).parameters)


def map_problems(text: str) -> list[str]:
    """What in the map does not match the tree, one line each."""
    entries = map_entries(text)
    modules, keywords = _modules(), _loader_keywords()
    listed = [m for e in entries for m in e.modules]
    problems = [f"not in the map: src/stoker/{m}" for m in sorted(modules - set(listed))]
    problems += [f"listed twice: {m}" for m in sorted({m for m in listed if listed.count(m) > 1})]
    for e in entries:
        if not e.modules:
            problems.append(f"line {e.line}: a bullet that names no module before its ':'")
        for m in e.modules:
            if not MODULE.match(m.rsplit("/", 1)[-1]) or m not in modules:
                problems.append(f"line {e.line}: no module src/stoker/{m}")
        here = set().union(*(_defined(PACKAGE / m) for m in e.modules if m in modules))
        for span in e.spans:
            problems += _span_problem(e.line, span, here, keywords)
    return problems


def _span_problem(line: int, span: str, here: set[str], keywords: set[str]) -> list[str]:
    """A span of a map line: a module or folder that exists, a Loader keyword, a name
    defined in the line's module, or a literal (it has a space, a quote, a slash...)."""
    if re.match(r"^[\w/]+/$", span):
        exists = (PACKAGE / span).is_dir()
        return [] if exists else [f"line {line}: no folder src/stoker/{span}"]
    if MODULE.match(span):
        exists = any(m.rsplit("/", 1)[-1] == span for m in _modules())
        return [] if exists else [f"line {line}: no module named {span}"]
    m = CODE.match(span)
    if m is None or span.startswith("__"):
        return []  # a literal, or a Python protocol name (__getitem__)
    name = m.group("name")
    if span.endswith("=") or "." not in name and name in keywords:
        if name in keywords:
            return []
        return [f"line {line}: `{span}` is no Loader keyword"]
    missing = [part for part in name.split(".") if part not in here]
    if missing:
        return [f"line {line}: `{span}` is not defined in the line's module ({missing[0]})"]
    return []


def page_problems(text: str) -> list[str]:
    """Across the page: each cited path exists, each class-like or private name is defined
    in the package."""
    defined = _all_defined()
    problems = []
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in sorted(set(SPAN.findall(prose))):
        if " " in span:
            continue
        if re.match(r"^(src|tests|scripts|benchmarks|docs)/[\w./-]*$", span):
            if not (ROOT / span.rstrip("/")).exists():
                problems.append(f"no path {span}")
            continue
        if MODULE.match(span):
            if not any(ROOT.glob(f"*/**/{span}")):
                problems.append(f"no file named {span}")
            continue
        m = CODE.match(span)
        if m is None or span.startswith("__"):
            continue
        first = m.group("name").split(".")
        if (CLASSLIKE.match(first[0]) or first[0].startswith("_")) and not all(
            part in defined for part in first
        ):
            problems.append(f"`{span}` is defined nowhere in src/stoker")
    return problems


def test_the_module_map_lists_every_module_and_only_modules_that_exist() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert len(map_entries(text)) >= 100
    problems = map_problems(text)
    assert not problems, "docs/contributing.md's module map:\n" + "\n".join(problems)


def test_every_name_and_path_the_page_cites_exists() -> None:
    problems = page_problems(PAGE.read_text(encoding="utf-8"))
    assert not problems, "docs/contributing.md:\n" + "\n".join(problems)


MAP = """## The module map

### `src/stoker/loader/`: the Loader

- `core.py`: the `Loader` (`peek`, `{name}`) and `subset=`.
- `options.py`: the groups (`Options`); `path,label` is a literal.
"""


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"name": "peek"}, "not in the map: src/stoker/loader/state.py"),
        ({"name": "no_such_thing"}, "`no_such_thing` is not defined in the line's module"),
        ({"name": "Recipe"}, "`Recipe` is not defined in the line's module"),
    ],
)
def test_a_drifted_map_is_caught(change: dict[str, str], problem: str) -> None:
    problems = map_problems(MAP.format(**change))
    assert any(problem in p for p in problems), problems
    assert not any("core.py" in p and "no module" in p for p in problems)


def test_a_module_that_is_gone_and_a_name_that_moved_are_caught() -> None:
    text = MAP.format(name="peek") + "- `gone.py`: was here.\n"
    assert any("no module src/stoker/loader/gone.py" in p for p in map_problems(text))
    assert set(page_problems("see `_flag` and `src/stoker/loader/nothing.py`")) == {
        "no path src/stoker/loader/nothing.py",
        "`_flag` is defined nowhere in src/stoker",
    }
    assert page_problems("`LoaderKwargs`, `RunSpec.of`, `python -m stoker`") == []
