"""benchmarks/gpu_check.py runs on CPU with --dry-run: small sizes, every CUDA part skipped with a
message, the training runs (a small model) and the scaling curve measured, JSON and table
written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_dry_run(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "--dry-run",
            "--out",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped: no CUDA" in proc.stdout
    out = json.loads((tmp_path / "gpu_check.json").read_text())
    assert out["dry_run"] and out["data"]["images"] == 36
    assert out["cuda_tests"].startswith("skipped")
    assert [r["feeder"] for r in out["train"]] == ["stoker", "dataloader_pil"]
    for r in out["train"]:
        assert r["images"] > 0 and r["img_s"] > 0 and r["peak_pss_mib"] > 0
        assert 0.0 <= r["host_wait_share"] <= 1.0 and r["cpu_ms_per_img"] > 0
    assert [r["workers"] for r in out["scale"]] == [1, 2]
    assert all(r["img_s"] > 0 for r in out["scale"])
    assert [r["cores"] for r in out["cluster_scale"]] == [1]  # one 1-core Ray node
    assert all(r.get("img_s", 0) > 0 or "skipped" in r for r in out["cluster_scale"])
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| stoker |" in table and "| dataloader_pil |" in table
