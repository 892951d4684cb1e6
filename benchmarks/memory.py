"""Is stoker's memory flat over many epochs? PSS of the whole process tree after each epoch.

A stoker Loader (augment="train", batch 256, 2 workers) runs N epochs back to back; after
each, `stoker.cli.bench.tree_pss` (proportional set size of this process and all its workers; the
shared-memory batch ring counted once) is recorded. Epoch 1 includes start-up (worker
imports, the ring being touched for the first time), so drift is measured against epoch 2:
drift = (PSS after the last epoch - PSS after epoch 2) / PSS after epoch 2, and the spread
max - min over epochs 2..N. Flat means |drift| and spread under --tolerance (default 5 %).

Usage
    python benchmarks/memory.py                       # 10 epochs over /data/imagenet_like
    python benchmarks/memory.py --epochs 30 --json memory.json
    python benchmarks/memory.py --epochs 3 --max-images 1024          # smoke
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import psutil  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=common.DEFAULT_DATA)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--max-images", type=int, default=0, help="random subset (smoke runs)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    if args.epochs < 3:
        ap.error("--epochs must be >= 3 (drift is measured from epoch 2)")

    import stoker

    facts = common.print_facts()
    all_items = common.list_items(args.data)
    items = common.subset(all_items, args.max_images)
    common.warm_page_cache(p for p, _ in items)
    src = (
        {"source": args.data}
        if len(items) == len(all_items)
        else {"paths": [p for p, _ in items], "labels": [y for _, y in items]}
    )
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


if __name__ == "__main__":
    sys.exit(main())
