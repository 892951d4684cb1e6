"""First batch after ``Loader()`` in a user's own script, with and without ``import keras`` at
its top: what worker start-up costs the person who runs ``python train.py``.

Each measurement is a FRESH ``python train.py`` (a generated script, run from a temporary
folder) that imports keras first (or not), then times ``stoker.Loader(folder, batch_size=64,
image_size=224, workers=2)`` up to its first batch in hand; `import keras` itself comes before
the clock starts. The script has an ``if __name__ == "__main__":`` guard only with ``--guard``
(stoker before the own-entry-point launch needed it: its spawned workers re-ran the script,
``import keras`` and all).

``--src`` picks the stoker to measure (a ``src`` folder; default: the one importable here), so
the same command measures an older checkout:

    python benchmarks/first_batch.py --repeats 5                        # this stoker, no guard
    git worktree add /tmp/stoker-old <commit> && \\
      (cd /tmp/stoker-old && python setup.py build_ext --inplace -q)
    python benchmarks/first_batch.py --repeats 5 --guard --src /tmp/stoker-old/src

The dataset (default /tmp/stoker_first_batch: 4 classes x 64 photo crops, shorter side
300-500 px, made with ``stoker.datasets.make_image_folder``) is made once and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default="/tmp/stoker_first_batch")
    ap.add_argument("--src", default=None, help="the stoker src folder to measure")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--guard", action="store_true", help="put the code under a __main__ guard")
    args = ap.parse_args(argv)

    from stoker.datasets import make_image_folder

    folder = str(make_image_folder(args.root, classes=4, per_class=64, seed=0))
    print(
        f"stoker from {args.src or 'this environment'}; {folder}; 2 workers, batch 64 at "
        f"224 px; {'guarded' if args.guard else 'no guard'}; load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for keras in (False, True):
        runs = [run_once(args.src, script(folder, keras, args.guard)) for _ in range(args.repeats)]
        good = [r["first_batch_s"] for r in runs if "error" not in r]
        label = "import keras at the top" if keras else "no keras import       "
        if len(good) < len(runs):
            print(
                f"  {label}: {len(runs) - len(good)} of {len(runs)} runs failed; last error:\n"
                + next(r["error"] for r in runs if "error" in r)
            )
        if good:
            print(
                f"  {label}: first batch after Loader() median {statistics.median(good):.2f} s"
                f" (min {min(good):.2f}, max {max(good):.2f}; "
                + ", ".join(f"{g:.2f}" for g in good)
                + ")"
            )
            last = [r for r in runs if "error" not in r][-1]
            if last.get("startup"):
                print(f"    {last['startup']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
