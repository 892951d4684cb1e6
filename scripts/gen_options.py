"""Write docs/options.md from the option groups in src/stoker/loader/options.py.

python scripts/gen_options.py           # rewrite the page
python scripts/gen_options.py --check   # exit 1 if the committed page is out of date
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "options.md"


def page() -> str:
    """The page's text, generated from the option groups."""
    sys.path.insert(0, str(ROOT / "src"))
    from stoker.loader import optiondocs

    return optiondocs.markdown_page()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the page is current")
    args = parser.parse_args()
    text = page()
    if args.check:
        if PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python scripts/gen_options.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
