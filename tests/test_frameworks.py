"""Lightning and Accelerate as they are, on 2 CPU processes (gloo), over stoker's torch views:
the rank read once the group exists (data made in ``__init__`` or before ``Accelerator()``),
exact mid-epoch resume, ``skip_first_batches``, and validation gathered across ranks equal to a
single-process evaluation (``rank_split="pad"``, the padding dropped by ``index``). The runs
are ``tests/lightning_ddp.py`` and ``tests/accelerate_ddp.py``; each rank reports in JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import free_port

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parent / "src")


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path, **extra}


def _reports(
    out: Path, procs: list[subprocess.Popen], timeout: float, names=("rank0", "rank1")
) -> list[dict]:
    errs = [p.communicate(timeout=timeout)[1] for p in procs]  # every rank's, for a failure
    told = "\n".join(f"rank {r}:\n{e[-3000:]}" for r, e in enumerate(errs))
    assert all(p.returncode == 0 for p in procs), told
    return [json.loads((out / f"{name}.json").read_text()) for name in names]


def _training_split(reports: list[dict], per_rank: int) -> None:
    """The two ranks' epochs are disjoint halves of the data, as many batches each."""
    for epoch in range(len(reports[0]["expected"])):
        halves = [{i for b in r["expected"][epoch] for i in b} for r in reports]
        assert not halves[0] & halves[1] and len(halves[0]) == len(halves[1]) == per_rank


def _resumed_on_one_process(out: Path, ranks: list[dict]) -> None:
    """1 x 8 after 2 ranks x 4: each later global batch is the 2 ranks' step, sample for
    sample, pixels included, in global order; 1 x 5: the 20 samples not yet consumed (after
    global sample 16), each once, in the epoch's global order."""
    same, other = (json.loads((out / f"resumed{b}.json").read_text()) for b in (8, 5))
    order = same["order"]
    assert same["rest"] == [  # global step k: the samples at positions [8k, 8k + 8)
        sorted(ranks[0]["rest"][k] + ranks[1]["rest"][k], key=lambda s: order.index(s[0], 8 * k))
        for k in range(2)
    ]
    assert [[i for i, _ in b] for b in same["rest"]] == [order[16:24], order[24:32]]
    assert [i for b in other["rest"] for i, _ in b] == order[16:]
    assert "world_size 2 -> 1" in other["note"] and "unchanged" in same["note"]


@pytest.mark.needs("lightning")
@pytest.mark.timeout(600)
def test_lightning_ddp_data_in_init_and_setup_resume_and_validation(tmp_path, image_folder):
    env = _env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    script = [sys.executable, str(HERE / "lightning_ddp.py"), str(image_folder), str(tmp_path)]
    run = subprocess.Popen(script, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    reports = _reports(tmp_path, [run], timeout=540)  # Lightning starts rank 1 itself
    later = subprocess.Popen(
        [*script, "8"], stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path
    )
    (resumed,) = _reports(tmp_path, [later], timeout=300, names=["resumed"])
    order = resumed["order"]  # 2 devices x 4 stopped at step 3, resumed on 1 device x 8:
    assert resumed["resumed"] == [order[24:32]] + resumed["epoch1"]  # global step 3, epoch 1
    assert "world_size 2 -> 1" in resumed["note"] and "unchanged" in resumed["note"]
    assert sorted(order[24:32]) == sorted(
        reports[0]["expected"][0][3] + reports[1]["expected"][0][3]
    )
    assert sorted(r["rank"] for r in reports) == [0, 1]
    _training_split(reports, per_rank=16)  # 18 samples a rank: 4 full batches of 4
    for r in reports:
        assert r["len"] == 4  # made in __init__, before the group: the group's split
        assert r["first"] == r["expected"][0][:3]  # stopped at max_steps=3, mid-epoch
        assert r["resumed"] == r["expected"][0][3:] + r["expected"][1]  # data made in setup()
        assert len(r["scores"]) == 2  # after the sanity check, validation at each epoch's end
        for score in r["scores"]:  # every sample once, the metric of one process over all
            assert score["count"] == 36 and score["gathered"] == score["whole"]


@pytest.mark.needs("accelerate")
@pytest.mark.timeout(600)
def test_accelerate_prepare_resume_skip_and_gather_for_metrics(tmp_path, image_folder):
    port = str(free_port())
    script = [sys.executable, str(HERE / "accelerate_ddp.py"), str(image_folder), str(tmp_path)]
    procs = [
        subprocess.Popen(
            script,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=_env(
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
        )
        for r in range(2)
    ]
    reports = _reports(tmp_path, procs, timeout=540)
    one = [  # the state saved by 2 ranks x 4, resumed on 1 process x 8 (the same global batch)
        subprocess.Popen(
            [*script, str(size)], stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=_env()
        )  # and x 5 (another one)
        for size in (8, 5)
    ]
    _reports(tmp_path, one, timeout=300, names=["resumed8", "resumed5"])
    _resumed_on_one_process(tmp_path, reports)
    assert [r["split"] for r in reports] == [[0, 2, 4], [1, 2, 4]]  # made before the group
    halves = [{i for b in r["seen"] + r["unbroken"] for i in b} for r in reports]
    assert not halves[0] & halves[1] and len(halves[0]) == len(halves[1]) == 16
    for r in reports:
        assert r["passed_through"]  # prepare() gives the view back
        assert r["resumed"] == r["unbroken"]  # load_state() put the view back at batch 2
        assert r["skipped"] == r["unbroken"]  # skip_first_batches(view, 2): exactly batch 2 on
        assert r["val_batches"] == 4  # rank_split="pad": 18 samples a rank, batches of 5
        assert r["count"] == 36 and r["gathered"] == r["whole"]  # the single-process metric
