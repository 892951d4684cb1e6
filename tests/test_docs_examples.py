"""Every ```python block of README.md and docs/*.md runs, so no example can rot.

A page's blocks run in page order in one fresh interpreter (later blocks see earlier blocks'
names), with the current folder a temp folder holding ``data/train`` and ``data/val``
(ImageFolder layouts of small real-photo JPEGs, 3 classes). A block whose first line is
``# not run: <reason>`` is skipped; the reason is required, and the skipped blocks are listed in
the test's output. A failure's traceback names the page and the line in it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from helpers import OPTIONAL

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"#\s*not run:\s*(?P<reason>.*)$")
FENCE = re.compile(r"^```(?P<lang>[\w+-]*)\s*$")
IMPORT = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.MULTILINE)
ADAPTER = re.compile(r"\.(keras|torch|jax|tf)\(")  # an adapter imports its framework
FRAMEWORK = {"keras": "keras", "torch": "torch", "jax": "jax", "tf": "tensorflow"}

# exec's each block with the page's line numbers, so a traceback points into the page itself
DRIVER = """
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for page, line, code in blocks:
    print(f"--- {page}:{line}", flush=True)
    exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
"""


@dataclass(frozen=True)
class Block:
    """One fenced ```python block: the line of its first code line, its code."""

    line: int
    code: str

    @property
    def skip_reason(self) -> str | None:
        """The reason of a ``# not run: <reason>`` first line, else None."""
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        m = NOT_RUN.match(first)
        return None if m is None else m.group("reason").strip()


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text (top-level fences only), in order."""
    blocks, lang, start, body = [], None, 0, []
    for number, raw in enumerate(text.splitlines(), start=1):
        m = FENCE.match(raw)
        if lang is None:
            if m is not None:
                lang, start, body = m.group("lang"), number + 1, []
        elif m is not None and not m.group("lang"):
            if lang == "python":
                blocks.append(Block(start, "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(raw)
    assert lang is None, f"a ``` fence opened at line {start - 1} is never closed"
    return blocks


def _rel(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def test_fences_are_found_and_closed() -> None:
    text = "a\n```python\nx = 1\n```\n```bash\nls\n```\n```python\n# not run: a GPU\ny\n```\n"
    blocks = python_blocks(text)
    assert [(b.line, b.code) for b in blocks] == [(3, "x = 1\n"), (9, "# not run: a GPU\ny\n")]
    assert [b.skip_reason for b in blocks] == [None, "a GPU"]
    with pytest.raises(AssertionError, match="never closed"):
        python_blocks("```python\nx = 1\n")


def _skipped() -> list[tuple[str, Block]]:
    return [
        (_rel(page), b)
        for page in PAGES
        for b in python_blocks(page.read_text())
        if b.skip_reason is not None
    ]


@pytest.mark.parametrize("where,block", _skipped(), ids=[f"{p}:{b.line}" for p, b in _skipped()])
def test_block_not_run(where: str, block: Block) -> None:
    """Each ``# not run:`` block, reported as a skip with its reason (pytest -ra lists them)."""
    assert block.skip_reason, f"{where}:{block.line}: '# not run:' needs a reason"
    compile(block.code, where, "exec")  # still valid Python, even if it cannot run here
    pytest.skip(f"{where}:{block.line} not run: {block.skip_reason}")


def test_readme_first_screen_has_both_setup_commands() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:30])
    for command in (
        'pip install -c constraints.txt -e ".[demo]" && stoker demo',
        'pip install -c constraints.txt -e ".[dev]" && python -m pytest',
    ):
        assert command in first_screen, command


@pytest.fixture(scope="module")
def photo_data(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``data/train`` (3 classes x 12 JPEGs) and ``data/val`` (3 x 6), real-photo crops."""
    from stoker.datasets import make_image_folder

    root = tmp_path_factory.mktemp("docs_data")
    make_image_folder(
        root / "data" / "train", classes=3, per_class=12, min_side=64, max_side=120, seed=0
    )
    make_image_folder(
        root / "data" / "val", classes=3, per_class=6, min_side=64, max_side=120, seed=1
    )
    return root / "data"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("KERAS_BACKEND", "tensorflow")
    env["PYTHONUNBUFFERED"] = "1"
    return env


PAGES_WITH_CODE = [
    p for p in PAGES if any(b.skip_reason is None for b in python_blocks(p.read_text()))
]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_rel)
def test_page_examples_run(
    page: pathlib.Path, photo_data: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    blocks = [b for b in python_blocks(page.read_text()) if b.skip_reason is None]
    needed = {n for b in blocks for n in IMPORT.findall(b.code)} | {
        FRAMEWORK[a] for b in blocks for a in ADAPTER.findall(b.code)
    }
    missing = sorted(n for n in needed if n in OPTIONAL and importlib.util.find_spec(n) is None)
    if missing:  # the core suite on another Python, without the framework extras
        pytest.skip(f"{_rel(page)} imports {', '.join(missing)}, not installed here")
    shutil.copytree(photo_data, tmp_path / "data")
    (tmp_path / "blocks.json").write_text(json.dumps([[str(page), b.line, b.code] for b in blocks]))
    (tmp_path / "driver.py").write_text(DRIVER)
    proc = subprocess.run(
        [sys.executable, "driver.py", "blocks.json"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, (
        f"an example of {_rel(page)} failed (exit {proc.returncode}):\n"
        f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    )
