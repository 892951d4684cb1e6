"""Memory: the loader's process-tree PSS over epochs, and in-memory arrays / per-sample datasets.

Cases (one per former script; `python benchmarks/memory.py CASE --help` for each one's options):

    loader       (was memory.py) Is stoker's memory flat over many epochs? PSS of the whole process
                 tree after each epoch.
    arrays       (was arrays.py) In-memory arrays and per-sample datasets: stoker against its peers,
                 side by side, one run.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse
import json
import shutil
import subprocess
import tempfile
import time

import common
import numpy as np
import psutil
from common import PeakPss, table

# ---------------------------------------------------------------------------- loader

LOADER_DOC = """\
Is stoker's memory flat over many epochs? PSS of the whole process tree after each epoch.

A stoker Loader (augment="train", batch 256, 2 workers) runs N epochs back to back; after
each, `stoker.cli.bench.tree_pss` (proportional set size of this process and all its workers; the
shared-memory batch ring counted once) is recorded. Epoch 1 includes start-up (worker
imports, the ring being touched for the first time), so drift is measured against epoch 2:
drift = (PSS after the last epoch - PSS after epoch 2) / PSS after epoch 2, and the spread
max - min over epochs 2..N. Flat means |drift| and spread under --tolerance (default 5 %).

One pipeline measured epoch after epoch (the figure is the PSS sequence, not rounds of peers),
so this case has no `common.interleave` rounds.

Usage
    python benchmarks/memory.py loader                       # 10 epochs over /data/imagenet_like
    python benchmarks/memory.py loader --epochs 30 --json memory.json
    python benchmarks/memory.py loader --epochs 3 --max-images 1024          # smoke
"""


def loader_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=LOADER_DOC.split("\n\n")[0])
    common.add_data_options(ap, epochs=10)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.epochs < 3:
        ap.error("--epochs must be >= 3 (drift is measured from epoch 2)")

    import stoker

    facts = common.print_facts()
    items, data = common.data_items(args)
    subset = {"paths": [p for p, _ in items], "labels": [y for _, y in items]}
    src = {"source": data} if data else subset
    rows, pss = [], []
    with stoker.Loader(
        **src, batch_size=args.batch_size, image_size=224, augment="train", workers=args.workers
    ) as loader:
        print(f"{loader!r}; {len(loader)} batches/epoch")
        for epoch in range(1, args.epochs + 1):
            ep = common.time_epoch(loader)
            p = common.tree_pss()
            procs = 1 + len(psutil.Process().children(recursive=True))
            pss.append(p)
            rows.append([epoch, f"{ep.rate:,.0f}", f"{p / 2**20:,.1f}", procs])
            print(
                f"  epoch {epoch:>3}: {ep.images} images, {ep.rate:,.0f} img/s, "
                f"tree PSS {p / 2**20:,.1f} MiB ({procs} processes)",
                flush=True,
            )
        print(loader.stats())
    base = pss[1]
    tail = pss[1:]
    drift = (pss[-1] - base) / base
    spread = (max(tail) - min(tail)) / base
    flat = abs(drift) <= args.tolerance and spread <= args.tolerance
    print()
    print(common.table(rows, ["epoch", "img/s", "tree PSS MiB", "processes"]))
    print(
        f"\nPSS epochs 2..{args.epochs}: min {min(tail) / 2**20:,.1f} MiB, max "
        f"{max(tail) / 2**20:,.1f} MiB, spread {spread:+.1%} of epoch 2; drift last vs "
        f"epoch 2: {drift:+.1%} ({(pss[-1] - base) / 2**20:+,.1f} MiB) -> "
        f"{'FLAT' if flat else 'NOT FLAT'} (tolerance {args.tolerance:.0%})"
    )
    common.write_json(
        args.json,
        {
            "facts": facts,
            "images": len(items),
            "pss_bytes": pss,
            "drift": drift,
            "spread": spread,
            "flat": flat,
        },
    )
    return 0 if flat else 1


# ---------------------------------------------------------------------------- arrays

ARRAYS_DOC = """\
In-memory arrays and per-sample datasets: stoker against its peers, side by side, one run.

``arrays``: images ``(N, 224, 224, 3)`` uint8 with ``(N, K)`` float32 targets, batch 256, no
augmentation, shuffled: stoker (``Loader(images, labels=targets)``, its defaults) against
plain numpy (a shuffled take per batch, and contiguous slices copied), ``tf.data
.Dataset.from_tensor_slices(...).batch(256).prefetch(AUTOTUNE)`` and the torch ``DataLoader``
over a ``TensorDataset``.

``dataset``: the same ``__getitem__`` (a random 224 crop + flip of a 256x256 image memory-mapped
from a ``.npy``, and a ``(K,)`` float32 target) through ``stoker.Loader(dataset, workers=2)``
and ``torch.utils.data.DataLoader(dataset, num_workers=2)``.

Each pipeline runs in its own process (so imports and memory do not mix); the controller
samples its process tree's PSS (peak reported) and the pipeline reports images/s over
``--epochs`` timed epochs after one untimed warm-up epoch. The pipelines are the peers of
`common.interleave` (``--rounds`` rounds, the same order each round): the table gives each
one's median, interval and range and its ratio to the baseline (numpy's shuffled take, or the
DataLoader) round by round; the goals compare the best round of each pipeline (on a shared
machine the worst rounds measure the neighbours). Ratios are of figures measured in this same
run. Usage::

    python benchmarks/memory.py arrays --mode arrays --n 2048 --epochs 3
    python benchmarks/memory.py arrays --mode dataset --n 1024 --epochs 2
"""

BATCH, K = 256, 8


def _arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8), rng.random((n, K), np.float32)


class Crops:
    """The per-sample dataset both loaders run: crop + flip from a memory-mapped .npy."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n, self._images = path, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self._images is None:
            self._images = np.load(self.path, mmap_mode="r")
        try:
            import stoker

            rng = stoker.sample_rng()
        except RuntimeError:  # in the DataLoader: a generator per index
            rng = np.random.default_rng(i)
        top, left = rng.integers(0, 33, 2)
        crop = self._images[i, top : top + 224, left : left + 224]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        target = np.full(K, i / self.n, np.float32)
        return np.ascontiguousarray(crop), target


def _timed(make_epoch, epochs: int) -> float:
    """Images/s over ``epochs`` epochs after a warm-up one; each batch is touched once."""
    for _batch in make_epoch():
        pass
    images, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for batch in make_epoch():
            images += int(batch[0].shape[0])
    return images / (time.perf_counter() - t0)


def peer(name: str, n: int, epochs: int, data: str) -> float:
    """Run one pipeline (in this process) and return its images/s."""
    if name.startswith("numpy"):
        images, targets = _arrays(n)
        if name == "numpy-take":

            def epoch():
                order = np.random.default_rng().permutation(n)
                for s in range(0, n - BATCH + 1, BATCH):
                    idx = order[s : s + BATCH]
                    yield images[idx], targets[idx]
        else:

            def epoch():
                for s in range(0, n - BATCH + 1, BATCH):
                    yield images[s : s + BATCH].copy(), targets[s : s + BATCH].copy()

        return _timed(epoch, epochs)
    if name == "stoker":
        import stoker

        images, targets = _arrays(n)
        loader = stoker.Loader(images, labels=targets, batch_size=BATCH)  # its defaults
        return _timed(lambda: loader, epochs)
    if name == "tf.data":
        import tensorflow as tf

        images, targets = _arrays(n)
        ds = tf.data.Dataset.from_tensor_slices((images, targets)).shuffle(n)
        ds = ds.batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
        del images
        return _timed(lambda: ds, epochs)
    if name == "torch":
        import torch

        images, targets = _arrays(n)
        ds = torch.utils.data.TensorDataset(torch.from_numpy(images), torch.from_numpy(targets))
        dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, drop_last=True)
        return _timed(lambda: dl, epochs)
    if name == "stoker-dataset":
        import stoker

        loader = stoker.Loader(Crops(data, n), batch_size=BATCH, workers=2)
        return _timed(lambda: loader, epochs)
    if name == "torch-dataset":
        import torch

        dl = torch.utils.data.DataLoader(
            Crops(data, n),
            batch_size=BATCH,
            shuffle=True,
            drop_last=True,
            num_workers=2,
            persistent_workers=True,
        )
        return _timed(lambda: dl, epochs)
    raise SystemExit(f"unknown peer {name}")


def _run(name: str, n: int, epochs: int, data: str) -> tuple[float, int]:
    """Run ``name`` in a subprocess; its images/s and the peak PSS of its process tree."""
    cmd = [sys.executable, __file__, "arrays", "--peer", name, "--n", str(n)]
    cmd += ["--epochs", str(epochs), "--data", data]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    with PeakPss(proc.pid, interval=0.2) as pss:
        out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])["rate"], pss.peak


ARRAY_GOALS = [  # (label, numerator, denominator, goal) on the best rounds
    ("stoker / numpy shuffled take", "stoker", "numpy-take", ">= 0.9"),
    ("stoker / numpy slice copy", "stoker", "numpy-slice", ">= 0.9"),
    ("stoker / tf.data", "stoker", "tf.data", ">= 1.0"),
    ("stoker / torch DataLoader", "stoker", "torch", ">= 1.0"),
]
DATASET_GOALS = [("stoker / DataLoader (2 workers)", "stoker-dataset", "torch-dataset", ">= 1.2")]


def arrays_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=ARRAYS_DOC.split("\n\n")[0])
    ap.add_argument("--mode", choices=["arrays", "dataset"], default="arrays")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds per pipeline")
    ap.add_argument(
        "--warmup", type=int, default=0, help="untimed rounds first (each run warms up already)"
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    ap.add_argument("--peer")
    ap.add_argument("--data", default="")
    args = ap.parse_args(argv)
    if args.peer:
        print(json.dumps({"rate": peer(args.peer, args.n, args.epochs, args.data)}))
        return 0
    tmp = tempfile.mkdtemp(prefix="stoker-arrays-")
    data = os.path.join(tmp, "images.npy")
    if args.mode == "dataset":
        rng = np.random.default_rng(1)
        np.save(data, rng.integers(0, 256, (args.n, 256, 256, 3), dtype=np.uint8))
        names, base, goals = ["stoker-dataset", "torch-dataset"], "torch-dataset", DATASET_GOALS
    else:
        names, base = ["stoker", "numpy-take", "numpy-slice", "tf.data", "torch"], "numpy-take"
        goals = ARRAY_GOALS
    peak: dict[str, int] = dict.fromkeys(names, 0)

    def measure(name: str) -> float:
        rate, pss = _run(name, args.n, args.epochs, data)
        peak[name] = max(peak[name], pss)
        return rate

    peers = [common.Peer(name, lambda name=name: measure(name)) for name in names]
    result = common.interleave(peers, args.rounds, args.warmup, progress="{:,.0f}")
    shutil.rmtree(tmp, ignore_errors=True)  # the data file and its folder
    common.report(result, base, args.json)
    best = {name: result.stats(name)["max"] for name in names}
    rows = [common.ratio_line(label, best[a], best[b], goal) for label, a, b, goal in goals]
    if args.mode == "dataset":
        pss_goal = ("PSS stoker / DataLoader", peak[names[0]], peak[base], "<= 1.0")
        rows.append(common.ratio_line(*pss_goal))
    print("\npeak PSS MiB: " + ", ".join(f"{k} {v / 2**20:,.0f}" for k, v in peak.items()))
    print(table(rows, ["ratio (best rounds)", "value", "goal", "verdict"]))
    return 0


# ---------------------------------------------------------------------------- cases

CASES = common.cases(loader_main, arrays_main)


if __name__ == "__main__":
    sys.exit(common.run_cases(__doc__, CASES))
