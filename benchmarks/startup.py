"""Start-up cost over a 100,000-file ImageFolder: index build (scan) and first-batch latency.

The folder (default /tmp/stoker_100k: 100 classes x 1,000 tiny JPEGs, bytes copied from a
few small JPEGs cut from the benchmark dataset) is made once and reused (a marker file
records how it was made). Each measurement runs in a FRESH Python process (so imports and
worker start-up are paid as a user pays them), with a warm dentry/page cache (the parent
walks the tree once first):

    import stoker           time to import the package
    index build (scan)      stoker.Loader(folder, batch_size=256, workers=2) constructor:
                            listing classes and files and building the index. stoker caches
                            big folder scans on disk (~/.cache/stoker/scan): each repeat runs
                            twice, with an empty cache (HOME set to a new temporary folder: a
                            first-time scan, which also writes the cache) and then with the
                            cache that run wrote (a later start on an unchanged folder)
    first batch             from the constructor's return to the first batch in hand (worker
                            processes start, read, decode, resize 256 images)
    reference scan          os.scandir + os.walk + sort of the same tree in the same process
                            (what torchvision's ImageFolder does), to put the scan in context

Medians of --repeats fresh processes.

Usage
    python benchmarks/startup.py                     # 100,000 files, 5 fresh processes
    python benchmarks/startup.py --files 5000 --repeats 1 --root /tmp/stoker_5k   # smoke
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

CLASSES = 100
MARKER = ".stoker-benchmark-100k.json"


def make_folder(root: Path, files: int, data: str) -> float:
    """Write ``files`` tiny JPEGs into ``root/class_XXX/``; reuse a complete folder."""
    meta = {"files": files, "classes": CLASSES, "version": 1}
    marker = root / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == meta:
        return 0.0
    from PIL import Image

    t0 = time.perf_counter()
    sources = [p for p, _ in common.list_items(data)[::997]][:8]
    blobs = []
    for p in sources:
        with Image.open(p) as im:
            im = im.convert("RGB")
            im.thumbnail((96, 96))
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=85)
            blobs.append(buf.getvalue())
    root.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    per_class = files // CLASSES
    for c in range(CLASSES):
        folder = root / f"class_{c:03d}"
        folder.mkdir(exist_ok=True)
        count = per_class + (1 if c < files % CLASSES else 0)
        for i in range(count):
            (folder / f"img_{i:05d}.jpg").write_bytes(blobs[(c + i) % len(blobs)])
    marker.write_text(json.dumps(meta))
    return time.perf_counter() - t0


CHILD = r"""
import json, os, sys, time
root = sys.argv[1]
t0 = time.perf_counter()
import stoker
t1 = time.perf_counter()
loader = stoker.Loader(root, batch_size=256, image_size=224, workers=2)
t2 = time.perf_counter()
images, labels = next(iter(loader))
t3 = time.perf_counter()
n = len(loader.source)
loader.close()
t4 = time.perf_counter()
classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
found = []
for c in classes:
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, c)):
        dirnames.sort()
        found.extend(os.path.join(dirpath, f) for f in sorted(filenames))
t5 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "index_s": t2 - t1, "first_batch_s": t3 - t2,
                  "close_s": t4 - t3, "reference_scan_s": t5 - t4, "files": n,
                  "reference_files": len(found), "batch_shape": list(images.shape)}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="/tmp/stoker_100k")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--data", default=common.DEFAULT_DATA, help="where the tiny JPEGs come from")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    facts = common.print_facts()
    root = Path(args.root)
    made = make_folder(root, args.files, args.data)
    print(
        f"folder: {root}, {args.files:,} files in {CLASSES} classes"
        + (f" (written in {made:.1f} s)" if made else " (reused)")
    )
    t0 = time.perf_counter()
    walked = sum(len(f) for _, _, f in os.walk(root))  # warm the dentry cache
    print(f"warm-up walk: {walked:,} entries in {time.perf_counter() - t0:.2f} s")
    runs: dict[str, list[dict[str, float]]] = {"empty cache": [], "cached": []}
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="stoker-home-") as home:
            for kind in runs:
                env = dict(os.environ, HOME=home)
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(root)],
                    capture_output=True,
                    text=True,
                    check=False,
                    env=env,
                )
                if out.returncode != 0:
                    print(out.stderr[-3000:])
                    return 1
                r = json.loads(out.stdout.strip().splitlines()[-1])
                runs[kind].append(r)
                print(
                    f"  run {i + 1}, {kind:<11}: import {r['import_s']:.2f} s, index "
                    f"{r['index_s']:.2f} s, first batch {r['first_batch_s']:.2f} s, close "
                    f"{r['close_s']:.2f} s; reference scan {r['reference_scan_s']:.2f} s "
                    f"({r['files']:,} files)",
                    flush=True,
                )
    keys = [
        ("import stoker", "import_s"),
        ("index build (scan)", "index_s"),
        ("first batch after the constructor", "first_batch_s"),
        ("close()", "close_s"),
        ("reference scan (os.walk + sort)", "reference_scan_s"),
    ]
    rows = []
    for kind, rs in runs.items():
        for label, k in keys:
            v = [r[k] for r in rs]
            rows.append([kind, label, f"{common.median(v):.3f}", f"{min(v):.3f}", f"{max(v):.3f}"])
        total = [r["index_s"] + r["first_batch_s"] for r in rs]
        rows.append(
            [
                kind,
                "constructor + first batch",
                f"{common.median(total):.3f}",
                f"{min(total):.3f}",
                f"{max(total):.3f}",
            ]
        )
    print(
        f"\n{args.files:,} files, batch 256, 2 workers, median of {args.repeats} fresh "
        "processes (warm dentry/page cache)"
    )
    print(common.table(rows, ["scan cache", "step", "seconds", "min", "max"]))
    common.write_json(args.json, {"facts": facts, "files": args.files, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
