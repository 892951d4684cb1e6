"""Page-cache citizenship on a dataset that fits in RAM: does ``page_cache="auto"`` cost the
second epoch anything?

For each policy (``auto``, ``keep``, ``drop``), alternating, in a fresh process each: the
folder's pages are dropped (``posix_fadvise(DONTNEED)``), then a Loader (shuffled,
RandomResizedCrop 224 + flip, batch 256, 2 workers) runs two epochs. Reported per policy: epoch 1
(cold) and epoch 2 img/s, and how much the page cache grew over the run. ``auto`` must equal
``keep`` on epoch 2 (it drops pages only for data larger than RAM); ``drop`` shows what dropping
would have cost.

    python benchmarks/page_cache.py --data /work/data-cold/base --rounds 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import common
import psutil
from cold import drop_cache

POLICIES = ("auto", "keep", "drop")
GB = 1e9


def run_one(policy: str, data: str) -> dict[str, float]:
    """Two epochs under ``policy`` in this (fresh) process."""
    import stoker

    cached0 = psutil.virtual_memory().cached
    with stoker.Loader(
        data, batch_size=256, image_size=224, augment="train", workers=2, page_cache=policy
    ) as loader:
        first = common.time_epoch(loader)
        second = common.time_epoch(loader)
        dropped = loader.stats().pages_dropped
    return {
        "policy": policy,
        "epoch1_img_s": first.rate,
        "epoch2_img_s": second.rate,
        "cache_growth_gb": (psutil.virtual_memory().cached - cached0) / GB,
        "pages_dropped": dropped,
    }


def measure(policy: str, data: Path) -> dict[str, float]:
    """One fresh-process run of ``policy`` with the folder's pages dropped first."""
    drop_cache(data)
    cmd = [sys.executable, __file__, "--one", policy, "--data", str(data)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"  {policy:5s} epoch 1 {result['epoch1_img_s']:7,.0f} img/s  epoch 2 "
        f"{result['epoch2_img_s']:7,.0f} img/s  cache {result['cache_growth_gb']:+.2f} GB  "
        f"dropped {result['pages_dropped']:,}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=common.DEFAULT_DATA, help="an ImageFolder that fits in RAM")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.data)))
        return 0
    facts = common.print_facts()
    results = []
    for k in range(args.rounds):
        print(f"round {k + 1} of {args.rounds}", flush=True)
        for policy in POLICIES[k % 3 :] + POLICIES[: k % 3]:
            results.append(measure(policy, Path(args.data)))
    rows = []
    for policy in POLICIES:
        runs = [r for r in results if r["policy"] == policy]
        rows.append(
            [policy]
            + [
                f"{common.median([r[key] for r in runs]):,.{digits}f}"
                for key, digits in (
                    ("epoch1_img_s", 0),
                    ("epoch2_img_s", 0),
                    ("cache_growth_gb", 2),
                )
            ]
        )
    print(common.table(rows, ["page_cache", "epoch 1 img/s", "epoch 2 img/s", "cache growth GB"]))
    common.write_json(args.json, {"facts": facts, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
