"""Ranks of a real torch.distributed job (gloo, 2 processes) get disjoint samples, equal counts."""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {src!r})
    import torch.distributed as dist
    import stoker

    dist.init_process_group("gloo", rank=int(sys.argv[2]), world_size=2,
                            init_method="tcp://127.0.0.1:" + sys.argv[3])
    with stoker.Loader(sys.argv[1], batch_size=5, image_size=16, workers=0) as loader:
        order = loader.plan.order(0)
        print("RESULT " + json.dumps({{"rank": loader.plan.rank, "world": loader.plan.world_size,
                                     "batches": len(loader), "samples": order.tolist()}}))
    dist.destroy_process_group()
    """
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_rank_and_world_size_come_from_torch_distributed(tmp_path, image_folder):
    pytest.importorskip("torch.distributed")
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT.format(src=SRC))
    port = str(_free_port())
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    procs = [
        subprocess.Popen([sys.executable, str(script), str(image_folder), str(r), port],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for r in range(2)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)  # two torch imports on a loaded 2-core machine
        assert p.returncode == 0, err[-2000:]
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        outs.append(json.loads(line[len("RESULT "):]))
    assert sorted(o["rank"] for o in outs) == [0, 1] and {o["world"] for o in outs} == {2}
    assert outs[0]["batches"] == outs[1]["batches"] == 3  # 36 samples / 2 ranks, batches of 5
    assert not set(outs[0]["samples"]) & set(outs[1]["samples"])
