"""Check every file of a folder (recursively) against Pillow and print a summary by class.

    python scripts/check_decode.py FOLDER [--max-mb 50] [--list]

Each file is decoded by stoker (``stoker.decode.decode``, whole image) and by Pillow (first
frame, EXIF/XMP-oriented, RGB). The summary has one line per class: the file's kind (JPEG
process, sampling and colour space; other formats by Pillow's mode), stoker's outcome (ok,
decoded with warnings, refused: reason) and the comparison (same pixels, within a level,
differs, refused where Pillow decodes ...). ``stoker inspect --decode`` reports the same
kinds and outcomes for a dataset. Files are never modified.
"""

from __future__ import annotations

import argparse
import os
import sys

from stoker.decode.survey import Survey


def files(folder: str, max_bytes: int) -> list[str]:
    """Every regular file under ``folder`` no larger than ``max_bytes``, sorted."""
    found = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                if os.path.getsize(path) <= max_bytes:
                    found.append(path)
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder")
    p.add_argument("--max-mb", type=float, default=50.0, help="skip files larger than this")
    p.add_argument("--list", action="store_true", help="print each file's class as it goes")
    args = p.parse_args()
    if not os.path.isdir(args.folder):
        print(f"check_decode: {args.folder} is not a folder", file=sys.stderr)
        return 2
    survey = Survey()
    for path in files(args.folder, int(args.max_mb * 2**20)):
        with open(path, "rb") as f:
            data = f.read()
        key = survey.add(os.path.relpath(path, args.folder), data, against_pillow=True)
        if args.list:
            print(f"{path}: {' | '.join(key)}", flush=True)
    print("\n".join(survey.lines()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
