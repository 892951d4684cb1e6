"""First-batch time of ``Loader(dataset)`` with 2 workers, against PyTorch's DataLoader (2
forked workers) on the same dataset object, for a torchvision-like dataset (a map-style class in
a module that imports torch and PIL) and a Hugging Face ``datasets`` image dataset (an
``Image()`` column over the JPEG paths, resized by ``with_transform``).

Each measurement runs in a FRESH Python process, as a training script does: it imports the
dataset's module (torch or datasets: the trainer pays this in every pipeline), builds the
dataset, constructs the loader, optionally does ``--setup-s`` seconds of its own CPU work (the
model being built: a numpy loop on one core), then takes the first batch. Reported:

    import              the dataset's module and the loader's package (stoker; torch for the
                        DataLoader)
    constructor         the Loader / DataLoader constructor
    first batch         from the end of the trainer's own set-up (or of the constructor, with
                        no set-up) to the first batch in hand: what the trainer waits
    constructor + first the two together: the start-up the trainer sees on top of its own work

stoker's workers are fresh interpreters (never forked from the trainer), so each imports the
dataset's modules itself; they are launched by the constructor, and the batches asked for while
they are still starting are made in the trainer's process (which has the modules loaded), so
neither the imports nor a set-up between the constructor and the first batch delay the first
batch. The DataLoader forks its workers at the first ``iter()`` from a trainer that already
imported everything. Medians of --repeats, the pipelines interleaved. The last stats() line of
each says who made the first batches and what the workers' start cost (Python, importing
stoker, importing the dataset's modules).

Usage
    python /work/shared/make_dataset.py --out /tmp/stoker-bench/jpeg2k --classes 10 --per-class 200
    python benchmarks/dataset_startup.py --data /tmp/stoker-bench/jpeg2k
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

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

CHILD = r"""
import json, sys, time
kind, loader_kind, root, setup_s, limit = sys.argv[1:6]
setup_s, limit = float(setup_s), int(limit)
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
    loader = DataLoader(ds, batch_size=32, num_workers=2, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
t3 = time.perf_counter()
a = np.ones((256, 256))
while time.perf_counter() - t3 < setup_s:  # the trainer's own set-up (building its model)
    a = np.tanh(a @ a / 256)
t4 = time.perf_counter()
stream = loader.stream() if loader_kind == "stoker" else iter(loader)
batch = next(stream)
t5 = time.perf_counter()
startup = workers = ""
if loader_kind == "stoker":
    startup = loader.stats().startup
    for _ in range(400):  # on, until the workers took over: what their start cost, and why
        if "workers started in" in loader.stats().startup:
            break
        next(stream)
    workers = loader.stats().startup
    loader.close()
print(json.dumps({"import_s": t1 - t0, "dataset_s": t2 - t1, "construct_s": t3 - t2,
                  "first_s": t5 - t4, "total_s": (t3 - t2) + (t5 - t4), "startup": startup,
                  "workers": workers}))
"""


def run_child(folder: str, kind: str, loader: str, data: str, setup_s: float, limit: int) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH", "")) if p),
    )
    out = subprocess.run(
        [sys.executable, "-c", CHILD, kind, loader, data, str(setup_s), str(limit)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind}/{loader} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/tmp/stoker-bench/jpeg2k")
    ap.add_argument("--kinds", default="tv,hf")
    ap.add_argument("--setup-s", default="0,4", help="trainer set-up seconds to try, comma list")
    ap.add_argument("--limit", type=int, default=512, help="samples in the dataset")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    common.print_facts()
    setups = [float(s) for s in args.setup_s.split(",")]
    with tempfile.TemporaryDirectory(prefix="stoker-startup-") as folder:
        Path(folder, "tv_startup_module.py").write_text(TV_MODULE)
        Path(folder, "hf_startup_module.py").write_text(HF_MODULE)
        rows, notes = [], []
        for kind in args.kinds.split(","):
            for setup in setups:
                runs: dict[str, list[dict]] = {"stoker": [], "DataLoader": []}
                for _ in range(args.repeats):
                    for loader in runs:
                        r = run_child(folder, kind, loader, args.data, setup, args.limit)
                        runs[loader].append(r)
                        print(
                            f"  {kind} set-up {setup:.0f} s {loader}: import "
                            f"{r['import_s']:.2f} s, constructor {r['construct_s']:.2f} s, "
                            f"first batch {r['first_s']:.2f} s",
                            flush=True,
                        )
                for loader, rs in runs.items():
                    med = {
                        k: common.median([r[k] for r in rs])
                        for k in ("import_s", "construct_s", "first_s", "total_s")
                    }
                    rows.append(
                        [
                            kind,
                            f"{setup:.0f}",
                            loader,
                            f"{med['import_s']:.2f}",
                            f"{med['construct_s']:.2f}",
                            f"{med['first_s']:.2f}",
                            f"{med['total_s']:.2f}",
                        ]
                    )
                last = runs["stoker"][-1]
                notes.append(f"{kind}, set-up {setup:.0f} s, first batch: {last['startup']}")
                notes.append(
                    f"{kind}, set-up {setup:.0f} s, once they took over: {last['workers']}"
                )
    print(
        f"\nLoader(dataset) start-up, 2 workers, batch 32, {args.limit} samples, median of "
        f"{args.repeats} fresh processes (seconds)"
    )
    print(
        common.table(
            rows,
            [
                "dataset",
                "set-up",
                "loader",
                "import",
                "constructor",
                "first batch",
                "constructor + first",
            ],
        )
    )
    print("\nstoker's stats() on start-up (last run of each), at the first batch and later:")
    for note in notes:
        print(f"  {note}")


if __name__ == "__main__":
    main()
