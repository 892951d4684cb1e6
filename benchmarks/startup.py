"""Start-up: import, scan, index and first batch.

Cases (one per former script; `python benchmarks/startup.py CASE --help` for each one's options):

    files        (was startup.py) Start-up cost over a 100,000-file ImageFolder: index build (scan)
                 and first-batch latency.
    first-batch  (was first_batch.py) First batch after ``Loader()`` in a user's own script, with
                 and without ``import keras`` at its top: what worker start-up costs the person who
                 runs ``python train.py``.
    dataset      (was dataset_startup.py) ``Loader(dataset)`` with 2 workers against PyTorch's
                 DataLoader (2 forked workers) on the same dataset object (torchvision-like, and
                 Hugging Face ``datasets`` + ``with_transform``): first batch, time to 90 % of
                 the steady rate, images in the first 10 s.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse
import io
import json
import subprocess
import tempfile
import time
from pathlib import Path

import common

# ---------------------------------------------------------------------------- files

FILES_DOC = """\
Start-up cost over a 100,000-file ImageFolder: index build (scan) and first-batch latency.

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

The two cache states are `common.interleave` peers, --repeats rounds; each step's table row
gives its median, interval, range and ratio to the empty cache.

Usage
    python benchmarks/startup.py files                     # 100,000 files, 5 fresh processes
    python benchmarks/startup.py files --files 5000 --repeats 1 --root /tmp/stoker_5k   # smoke
"""

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


_files_CHILD = r"""
import json, os, sys, time
root = sys.argv[1]
t0 = time.perf_counter()
import stoker
t1 = time.perf_counter()
loader = stoker.Loader(root, batch_size=256, image_size=224, workers=2)
t2 = time.perf_counter()
images, labels = next(iter(loader))
t3 = time.perf_counter()
n = len(loader.recipe.source)
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


STEPS = [
    ("import stoker", "import_s"),
    ("index build (scan)", "index_s"),
    ("first batch after the constructor", "first_batch_s"),
    ("close()", "close_s"),
    ("reference scan (os.walk + sort)", "reference_scan_s"),
    ("constructor + first batch", "total_s"),
]


def files_child(root: Path, home: str, kind: str) -> dict[str, float]:
    """One fresh process over ``root`` with ``HOME=home`` (its scan cache); its figures."""
    env = dict(os.environ, HOME=home)
    cmd = [sys.executable, "-c", _files_CHILD, str(root)]
    r = common.child_json(cmd, "files: the fresh process", env=env)
    r["total_s"] = r["index_s"] + r["first_batch_s"]
    spans = ("import", "index", "first_batch", "close", "reference_scan")
    shown = ", ".join(f"{s.replace('_', ' ')} {r[s + '_s']:.2f} s" for s in spans)
    print(f"  {kind:<11}: {shown} ({r['files']:,} files)", flush=True)
    return r


def files_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=FILES_DOC.split("\n\n")[0])
    ap.add_argument("--root", default="/tmp/stoker_100k")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--data", default=common.DEFAULT_DATA, help="where the tiny JPEGs come from")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)

    common.print_facts()
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
    with tempfile.TemporaryDirectory(prefix="stoker-homes-") as homes:
        home = ""

        def measure(kind: str) -> float:
            nonlocal home
            if kind == "empty cache":  # each round: a new HOME, then the cache its run wrote
                home = tempfile.mkdtemp(dir=homes)
            runs[kind].append(files_child(root, home, kind))
            return runs[kind][-1]["total_s"]

        peers = [common.Peer(kind, lambda kind=kind: measure(kind)) for kind in runs]
        common.interleave(peers, args.repeats, warmup=0)
    steps = {
        label: common.Result({k: [r[key] for r in rs] for k, rs in runs.items()}, args.repeats, 0)
        for label, key in STEPS
    }
    rows = [[label, *row] for label, step in steps.items() for row in step.rows("empty cache")]
    print(
        f"\n{args.files:,} files, batch 256, 2 workers, {args.repeats} fresh processes each "
        "(warm dentry/page cache), seconds"
    )
    header = steps["constructor + first batch"].header("empty cache", unit="s")
    print(common.table(rows, ["step", *header]))
    payload = {label: step.to_json("empty cache") for label, step in steps.items()}
    common.write_json(args.json, {"files": args.files, "runs": runs, "steps": payload})
    return 0


# ---------------------------------------------------------------------------- first-batch

FIRST_BATCH_DOC = """\
First batch after ``Loader()`` in a user's own script, with and without ``import keras`` at
its top: what worker start-up costs the person who runs ``python train.py``.

Each measurement is a FRESH ``python train.py`` (a generated script, run from a temporary
folder) that imports keras first (or not), then times ``stoker.Loader(folder, batch_size=64,
image_size=224, workers=2)`` up to its first batch in hand; `import keras` itself comes before
the clock starts. The two scripts are the peers of `common.interleave`, ``--repeats`` rounds
(without keras, then with, each round); the table gives each one's median first-batch seconds,
interval and range, and the ratio to the script without keras, round by round. The script has
an ``if __name__ == "__main__":`` guard only with ``--guard``
(stoker before the own-entry-point launch needed it: its spawned workers re-ran the script,
``import keras`` and all).

``--src`` picks the stoker to measure (a ``src`` folder; default: the one importable here), so
the same command measures an older checkout:

    python benchmarks/startup.py first-batch --repeats 5            # this stoker, no guard
    git worktree add /tmp/stoker-old <commit> && \
      (cd /tmp/stoker-old && python setup.py build_ext --inplace -q)
    python benchmarks/startup.py first-batch --repeats 5 --guard --src /tmp/stoker-old/src

The dataset (default /tmp/stoker_first_batch: 4 classes x 64 photo crops, shorter side
300-500 px, made with ``stoker.datasets.make_image_folder``) is made once and reused.
"""

HEAD = """\
import json, os, sys, time
{keras}import stoker
"""

BODY = """\
t0 = time.perf_counter()
loader = stoker.Loader({folder!r}, batch_size=64, image_size=224, workers=2)
x, y = next(iter(loader))
t1 = time.perf_counter()
report = loader.stats()
loader.close()
startup = getattr(report, "startup", "")  # older stokers do not report it
print("RESULT " + json.dumps({{"first_batch_s": t1 - t0, "startup": startup,
                              "workers": report.workers, "shape": list(x.shape)}}))
"""


def script(folder: str, keras: bool, guard: bool) -> str:
    """The user's ``train.py``: keras imported first or not, guarded or not."""
    head = HEAD.format(keras="import keras\n" if keras else "")
    body = BODY.format(folder=folder)
    if guard:
        body = "if __name__ == '__main__':\n" + "".join(f"    {ln}\n" for ln in body.splitlines())
    return head + body


def run_once(src: str | None, text: str) -> dict:
    """One fresh ``python train.py``; its RESULT line."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    with tempfile.TemporaryDirectory(prefix="stoker-train-") as tmp:
        path = Path(tmp) / "train.py"
        path.write_text(text)
        out = subprocess.run(
            [sys.executable, str(path)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp,
            env=env,
        )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        return {"error": (out.stdout + out.stderr)[-600:]}
    return json.loads(lines[-1][len("RESULT ") :])


def first_batch_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=FIRST_BATCH_DOC.split("\n\n")[0])
    ap.add_argument("--root", default="/tmp/stoker_first_batch")
    ap.add_argument("--src", default=None, help="the stoker src folder to measure")
    ap.add_argument("--repeats", type=int, default=5, help="fresh runs of each script")
    ap.add_argument("--guard", action="store_true", help="put the code under a __main__ guard")
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = ap.parse_args(argv)

    from stoker.datasets import make_image_folder

    folder = str(make_image_folder(args.root, classes=4, per_class=64, seed=0))
    print(
        f"stoker from {args.src or 'this environment'}; {folder}; 2 workers, batch 64 at "
        f"224 px; {'guarded' if args.guard else 'no guard'}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    startup: dict[str, str] = {}

    def first_batch_s(name: str, keras: bool) -> float:
        run = run_once(args.src, script(folder, keras, args.guard))
        if "error" in run:
            raise SystemExit(f"first-batch: the {name!r} script failed:\n{run['error']}")
        startup[name] = run.get("startup", "")
        return float(run["first_batch_s"])

    peers = [
        common.Peer(name, lambda name=name, keras=keras: first_batch_s(name, keras))
        for name, keras in (("no keras import", False), ("import keras at the top", True))
    ]
    result = common.interleave(peers, args.repeats, warmup=0, progress="{:.2f}")
    print("\nfirst batch after Loader(), seconds (lower is better)")
    common.report(result, "no keras import", args.json, unit="s")
    for name, line in startup.items():
        if line:
            print(f"  {name}, last run: {line}")
    return 0


# ---------------------------------------------------------------------------- dataset

DATASET_DOC = """\
Start-up of ``Loader(dataset)`` with 2 workers, against PyTorch's DataLoader (2 forked
workers, persistent) on the same dataset object, for a torchvision-like dataset (a map-style
class in a module that imports torch and PIL) and a Hugging Face ``datasets`` image dataset
(an ``Image()`` column over the JPEG paths, resized by ``with_transform``): the first batch,
and how soon the batches come at the full rate.

Each measurement runs in a FRESH Python process, as a training script does: it imports the
dataset's module (torch or datasets: the trainer pays this in every pipeline), builds the
dataset, constructs the loader, optionally does ``--setup-s`` seconds of its own CPU work (the
model being built: a numpy loop), then takes batches for ``--run-s`` seconds (epoch after
epoch), noting when each arrives. Reported, times in seconds after the constructor began
(set-up included):

    first batch         from the end of the set-up to the first batch in hand: what the
                        trainer waits
    90 % of steady rate the first batch from which the next 4 batches come at >= 90 % of the
                        steady rate (the rate over the run's last --steady-s seconds); it means
                        something only once the workers took over within the run (the stats()
                        lines printed at the end say whether they did)
    images in 10 s      images in hand 10 s after the constructor began
    steady img/s        the rate over the last --steady-s seconds

stoker's workers are never forked from the trainer: one fresh interpreter (the pool's zygote)
imports the dataset's modules once and forks the workers; it is launched by the constructor,
and the batches asked for while the workers are still starting are made in the trainer's
process (which has the modules loaded). The
DataLoader forks its workers at the first ``iter()`` from a trainer that already imported
everything. Medians of --repeats rounds of `common.interleave` (stoker, then the DataLoader,
then ``--before``'s stoker if given: another source tree, for an A/B of a change in one run).
The stats() lines of stoker's last run say who made the first batches and what the workers'
start cost (Python, importing stoker, importing the dataset's modules).

Usage
    python /work/shared/make_dataset.py --out /tmp/stoker-bench/jpeg2k --classes 10 --per-class 200
    python benchmarks/startup.py dataset --data /tmp/stoker-bench/jpeg2k
"""

TV_MODULE = '''
import os

import numpy as np
import torch
from PIL import Image


class ImageFolderLike:
    """torchvision's ImageFolder + Resize + ToTensor: (float32 CHW tensor, label)."""

    def __init__(self, root, size=64, limit=None):
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))][:limit]
        self.size = size

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with Image.open(path) as im:
            im = im.convert("RGB").resize((self.size, self.size))
        return torch.from_numpy(np.asarray(im).copy()).permute(2, 0, 1).float() / 255, label


def make(root, limit):
    return ImageFolderLike(root, limit=limit)
'''

HF_MODULE = """
import os

import datasets
import numpy as np


def _resize(batch):
    batch["image"] = [np.asarray(im.convert("RGB").resize((64, 64))) for im in batch["image"]]
    return batch


def make(root, limit):
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    rows = [(os.path.join(root, c, f), k) for k, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))][:limit]
    ds = datasets.Dataset.from_dict({"image": [p for p, _ in rows], "label": [k for _, k in rows]})
    return ds.cast_column("image", datasets.Image()).with_transform(_resize)
"""

_dataset_CHILD = r"""
import json, sys, time
kind, loader_kind, root, setup_s, limit, run_s = sys.argv[1:7]
setup_s, limit, run_s = float(setup_s), int(limit), float(run_s)
t0 = time.perf_counter()
import numpy as np
mod = __import__(kind + "_startup_module")
if loader_kind == "stoker":
    import stoker
else:
    import torch
    from torch.utils.data import DataLoader
t1 = time.perf_counter()
ds = mod.make(root, limit)
t2 = time.perf_counter()
if loader_kind == "stoker":
    loader = stoker.Loader(ds, batch_size=32, workers=2, shuffle=True, seed=0)
else:
    loader = DataLoader(ds, batch_size=32, num_workers=2, shuffle=True, persistent_workers=True,
                        generator=torch.Generator().manual_seed(0))
t3 = time.perf_counter()
a = np.ones((256, 256))
while time.perf_counter() - t3 < setup_s:  # the trainer's own set-up (building its model)
    a = np.tanh(a @ a / 256)
t4 = time.perf_counter()


def batches():
    if loader_kind == "stoker":
        yield from loader.stream()
    while True:
        yield from loader


stream = batches()
batch = next(stream)
t5 = time.perf_counter()
startup = loader.stats().startup if loader_kind == "stoker" else ""
ends = [t5 - t2]  # each batch's arrival, seconds after the constructor began
while ends[-1] < run_s:
    next(stream)
    ends.append(time.perf_counter() - t2)
workers = loader.stats().startup if loader_kind == "stoker" else ""
if loader_kind == "stoker":
    loader.close()
print(json.dumps({"import_s": t1 - t0, "dataset_s": t2 - t1, "construct_s": t3 - t2,
                  "first_s": t5 - t4, "total_s": (t3 - t2) + (t5 - t4), "startup": startup,
                  "workers": workers, "ends": ends}))
"""

BATCH = 32
WINDOW = 4  # batches in the sliding window a rate is read over


def rates(ends: list[float], steady_s: float) -> dict[str, float]:
    """From the batch arrival times (seconds after the constructor began): the steady rate
    (img/s over the last ``steady_s`` seconds), the first moment the rate over the next
    ``WINDOW`` batches is at least 90 % of it, and the images in hand at 10 s."""
    last = ends[-1]
    tail = [t for t in ends if t >= last - steady_s]
    steady = BATCH * (len(tail) - 1) / max(tail[-1] - tail[0], 1e-9)
    t90 = last
    for k in range(len(ends) - WINDOW):
        if BATCH * WINDOW / max(ends[k + WINDOW] - ends[k], 1e-9) >= 0.9 * steady:
            t90 = ends[k]
            break
    return {"steady": steady, "t90_s": t90, "images_10s": BATCH * sum(t <= 10 for t in ends)}


BEFORE = "stoker (--before)"


def run_child(folder: str, kind: str, loader: str, args: argparse.Namespace, setup: float) -> dict:
    path = args.before if loader == BEFORE else os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (folder, path) if p))
    kind_arg = "stoker" if loader == BEFORE else loader
    cmd = [sys.executable, "-c", _dataset_CHILD, kind, kind_arg, args.data, str(setup)]
    cmd += [str(args.limit), str(args.run_s)]
    r = common.child_json(cmd, f"{kind}/{loader}", env=env, timeout=600)
    return {**r, **rates(r["ends"], args.steady_s)}


FIGURES = {  # figure -> (column, format); lower is better except where said
    "first_s": ("first batch s", "{:.2f}"),
    "t90_s": ("90 % of steady rate at s", "{:.1f}"),
    "images_10s": ("images in the first 10 s (higher is better)", "{:,.0f}"),
    "steady": ("steady img/s", "{:,.0f}"),
}


def dataset_rounds(
    folder: str, kind: str, setup: float, args: argparse.Namespace
) -> tuple[dict[str, list[dict]], common.Result]:
    """stoker and the DataLoader as `common.interleave` peers: each one's runs, and the
    `Result` of their figures (a series per figure of `FIGURES`)."""
    runs: dict[str, list[dict]] = {"stoker": [], "DataLoader": []}
    if args.before:
        runs[BEFORE] = []

    def measure(loader: str) -> dict[str, float]:
        r = run_child(folder, kind, loader, args, setup)
        runs[loader].append(r)
        print(
            f"  {kind} set-up {setup:.0f} s {loader}: import {r['import_s']:.2f} s, "
            f"first batch {r['first_s']:.2f} s, 90 % at {r['t90_s']:.1f} s, "
            f"{r['images_10s']} images in 10 s, steady {r['steady']:.0f} img/s",
            flush=True,
        )
        return {k: float(r[k]) for k in FIGURES}

    peers = [common.Peer(name, lambda name=name: measure(name)) for name in runs]
    return runs, common.interleave(peers, args.repeats, warmup=0)


def dataset_main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=DATASET_DOC.split("\n")[0])
    ap.add_argument("--data", default="/tmp/stoker-bench/jpeg2k")
    ap.add_argument("--kinds", default="tv,hf")
    ap.add_argument("--setup-s", default="0,4", help="trainer set-up seconds to try, comma list")
    ap.add_argument("--limit", type=int, default=2000, help="samples in the dataset")
    ap.add_argument("--run-s", type=float, default=20.0, help="seconds of batches per run")
    ap.add_argument("--steady-s", type=float, default=5.0, help="the steady rate's last seconds")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--before", default="", help="PYTHONPATH of another stoker (a src folder), a third peer"
    )
    args = ap.parse_args(argv)
    common.print_facts()
    setups = [float(s) for s in args.setup_s.split(",")]
    rows, ratios, notes = [], [], []
    with tempfile.TemporaryDirectory(prefix="stoker-startup-") as folder:
        Path(folder, "tv_startup_module.py").write_text(TV_MODULE)
        Path(folder, "hf_startup_module.py").write_text(HF_MODULE)
        for kind in args.kinds.split(","):
            for setup in setups:
                runs, result = dataset_rounds(folder, kind, setup, args)
                for loader in runs:
                    shown = [
                        fmt.format(result.stats(f"{loader}: {k}")["median"])
                        for k, (_, fmt) in FIGURES.items()
                    ]
                    rows.append([kind, f"{setup:.0f}", loader, *shown])
                for loader in [n for n in runs if n != "DataLoader"]:
                    ratios.append(
                        [kind, f"{setup:.0f}", loader]
                        + [
                            f"{result.ratio(f'{loader}: {k}', f'DataLoader: {k}')['median']:.2f}"
                            for k in FIGURES
                        ]
                    )
                last = runs["stoker"][-1]
                notes.append(f"{kind}, set-up {setup:.0f} s, first batch: {last['startup']}")
                notes.append(f"{kind}, set-up {setup:.0f} s, at the end: {last['workers']}")
    columns = [c for c, _ in FIGURES.values()]
    print(
        f"\nLoader(dataset) start-up, 2 workers, batch 32, {args.limit} samples, "
        f"{args.run_s:.0f} s per run, median of {args.repeats} fresh processes "
        "(times are seconds after the constructor began, set-up included)"
    )
    print(common.table(rows, ["dataset", "set-up", "loader", *columns]))
    print("\n/ DataLoader (median of the rounds' ratios):")
    print(common.table(ratios, ["dataset", "set-up", "loader", *columns]))
    print("\nstoker's stats() on start-up (last run of each), at the first batch and at the end:")
    for note in notes:
        print(f"  {note}")


# ---------------------------------------------------------------------------- cases

CASES = common.cases(files_main, first_batch_main, dataset_main)


if __name__ == "__main__":
    sys.exit(common.run_cases(__doc__, CASES))
