"""Paired A/B of stoker's single-core rate: two variants run AT THE SAME TIME, one per core.

On a VM whose speed drifts by ~10% over tens of seconds, two variants timed one after the other
differ by the drift as much as by the change. Here, every round starts variant A pinned to one
core and variant B pinned to the other, together, and swaps the cores next round; the figure is
the median of the per-round ratios B / A. Each side is a fresh process running
`stoker.cli.bench.single_core_rate` of a `Loader(workers=0)` over the dataset (train augment, batch
256, 224 px).

A side is given as environment assignments plus Loader keyword arguments as JSON, e.g.:

    # the previous commit's code (a worktree with its extension built) vs this checkout
    git worktree add /tmp/base HEAD~1 && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/paired_ab.py --a-env PYTHONPATH=/tmp/base/src --rounds 8

    # an option
    python benchmarks/paired_ab.py --a-kwargs '{"fast_decode": false}' \
        --b-kwargs '{"fast_decode": true}' --rounds 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ONE = (
    "import json, os, sys, stoker; from stoker.cli.bench import single_core_rate; "
    "os.sched_setaffinity(0, {int(sys.argv[1])}); "
    "L = stoker.Loader(sys.argv[2], batch_size=256, image_size=224, workers=0, "
    "**json.loads(sys.argv[4])); single_core_rate(L, 1.0); "
    "print(single_core_rate(L, float(sys.argv[3]))); L.close()"
)


def _env(assignments: str) -> dict[str, str]:
    env = dict(os.environ)
    for item in assignments.split():
        key, _, value = item.partition("=")
        env[key] = value
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="/data/imagenet_like")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0, help="timed seconds per side")
    for side in ("a", "b"):
        ap.add_argument(f"--{side}-env", default="", help="KEY=VALUE ... for this side")
        ap.add_argument(f"--{side}-kwargs", default="{}", help="Loader kwargs as JSON")
    args = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        sys.exit("paired_ab.py needs two usable cores")
    sides = [(_env(args.a_env), args.a_kwargs), (_env(args.b_env), args.b_kwargs)]
    ratios, rates = [], []
    for r in range(args.rounds):
        order = cores if r % 2 == 0 else cores[::-1]
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", ONE, str(core), args.data, str(args.seconds), kwargs],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for core, (env, kwargs) in zip(order, sides, strict=True)
        ]
        a, b = (float(p.communicate()[0].strip().splitlines()[-1]) for p in procs)
        rates.append((a, b))
        ratios.append(b / a)
        print(
            f"round {r + 1}: A {a:,.0f} img/s on CPU {order[0]}, B {b:,.0f} on CPU {order[1]}, "
            f"B/A {b / a:.3f}",
            flush=True,
        )
    print(
        f"A median {statistics.median(x for x, _ in rates):,.0f} img/s, "
        f"B median {statistics.median(y for _, y in rates):,.0f} img/s; "
        f"B/A median of {args.rounds} paired rounds: {statistics.median(ratios):.3f}"
    )
    print(json.dumps({"a": [x for x, _ in rates], "b": [y for _, y in rates]}))


if __name__ == "__main__":
    main()
