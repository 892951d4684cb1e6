"""Chaos: the training process is killed (SIGKILL, SIGTERM, and SIGSEGV/SIGABRT as a crash in
native code would) at random moments (start-up, mid-epoch, epoch end, inside ``close()``);
within a few seconds no segment and no process of it may remain. Every moment but start-up is
reached by a handshake (the trainer stops there and says so), never by a delay, so each kill
lands where it is meant to on any machine. Each trial runs in a private
mount namespace with a fresh tmpfs on /dev/shm (``unshare -m``), so other tests' segments
neither hide nor fake a leak."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import chaos_env

pytestmark = pytest.mark.chaos

TRIAL = str(Path(__file__).with_name("chaos_trial.py"))
LAST_EPOCH = 2  # chaos_trial.py closes its loader in this epoch
MOUNTED = ["sh", "-c", 'mount -t tmpfs -o size=256m tmpfs /dev/shm && exec "$@"', "sh"]


def _schedule(signame: str, counts: dict[str, int], seed: int) -> list[tuple]:
    rng = random.Random(seed)
    plan = []
    for moment, n in counts.items():
        for _ in range(n):
            delay = rng.uniform(0.0, 2.0 if moment == "startup" else 0.1)
            if moment == "close":
                moment = rng.choice(["close-pool", "close-ring"])
            epoch = LAST_EPOCH if moment.startswith("close") else rng.randrange(LAST_EPOCH + 1)
            plan.append((moment, round(delay, 3), signame, epoch))
    return plan


def _run(plan: list[tuple], data: Path) -> list[dict]:
    results = []
    for moment, delay, signame, epoch in plan:
        trial = [sys.executable, TRIAL, "trial", str(data), moment, str(delay), signame, str(epoch)]
        cmd = chaos_env.NAMESPACE[:4] + MOUNTED + trial
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=chaos_env.env())
        assert out.returncode == 0, out.stderr
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def _check(results: list[dict], signame: str) -> None:
    clean = [r for r in results if not r["segments_left"] and not r["processes_left"]]
    summary = f"{signame}: {len(clean)}/{len(results)} trials left nothing"
    print(summary)
    bad = [r for r in results if r not in clean]
    assert not bad, summary + "\n" + "\n".join(json.dumps(r) for r in bad)
    for r in results:
        assert r["reached"], r
        if r["moment"] != "startup":  # the trainer stopped there: the loader owns its ring
            assert r["at_kill"]["segments"] > 0, r
        if r["moment"] in ("mid", "end", "close-pool"):  # ... and its workers
            assert r["at_kill"]["processes"] > 0, r
    expected = -getattr(signal, signame)  # each died of its signal, as the default would
    assert all(r["exit"] == expected for r in results), [r["exit"] for r in results]


@pytest.fixture(scope="module")
def namespace() -> None:
    why = chaos_env.namespace_reason()
    if why is not None:
        pytest.skip(f"chaos kill trials need a private mount namespace: {why}")


@pytest.mark.timeout(900)
def test_sigkill_at_random_moments_leaves_nothing(namespace, image_folder):
    plan = _schedule("SIGKILL", {"startup": 6, "mid": 8, "end": 8, "close": 8}, seed=1)
    _check(_run(plan, image_folder), "SIGKILL")


@pytest.mark.timeout(900)
def test_sigterm_at_random_moments_closes_in_order_and_dies_of_sigterm(namespace, image_folder):
    plan = _schedule("SIGTERM", {"startup": 5, "mid": 5, "end": 5, "close": 5}, seed=2)
    _check(_run(plan, image_folder), "SIGTERM")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("signame", ["SIGSEGV", "SIGABRT"])
def test_a_crash_in_native_code_leaves_nothing(namespace, image_folder, signame):
    plan = _schedule(signame, {"mid": 2, "end": 1}, seed=3)
    _check(_run(plan, image_folder), signame)
