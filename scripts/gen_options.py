"""Write docs/options.md and src/stoker/loader/kwargs.py (LoaderKwargs) from the option groups
in src/stoker/loader/options.py.

python scripts/gen_options.py           # rewrite the page and the module
python scripts/gen_options.py --check   # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "options.md"
MODULE = ROOT / "src" / "stoker" / "loader" / "kwargs.py"


def page() -> str:
    """The page's text, generated from the option groups."""
    sys.path.insert(0, str(ROOT / "src"))
    from stoker.loader import optiondocs

    return optiondocs.markdown_page()


def module() -> str:
    """The text of ``kwargs.py``: the ``LoaderKwargs`` TypedDict."""
    sys.path.insert(0, str(ROOT / "src"))
    from stoker.loader import optiondocs

    return optiondocs.kwargs_module()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check both are current")
    args = parser.parse_args()
    wanted = {PAGE: page(), MODULE: module()}
    if args.check:
        stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
        for path in stale:
            print(f"{path} is out of date: run python scripts/gen_options.py", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
