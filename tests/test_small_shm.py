"""A 64 MB /dev/shm (Docker's default) is detected and worked around, never a bus error."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

SCRIPT = textwrap.dedent(
    """
    import os, sys, tempfile, warnings
    sys.path.insert(0, {src!r})
    import numpy as np, stoker
    if __name__ == "__main__":
        images = np.random.default_rng(0).integers(0, 255, (300, 128, 128, 3), dtype=np.uint8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with stoker.Loader(images, labels=np.arange(300), batch_size=64, image_size=320,
                               workers=2, augment=None, shuffle=False) as loader:
                got = [x.copy() for x, _ in loader]
                print("FOLDER", loader.stats().memory_folder)
        assert len(got) == 5 and got[0].shape == (64, 320, 320, 3)
        said = [str(w.message) for w in caught if "/dev/shm has" in str(w.message)]
        print("WARNED", bool(said))
        print("NAMES TMP", all(f"memory in {{tempfile.gettempdir()}} " in m for m in said))
        left = [n for d in ("/dev/shm", tempfile.gettempdir()) for n in os.listdir(d)
                if n.startswith(f"stoker_{{os.getpid()}}_")]
        print("LEFT", left)
    """
)


def _can_unshare() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


@pytest.mark.timeout(120)
@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare for a private /dev/shm")
def test_small_dev_shm_falls_back_to_file_backed_memory(tmp_path):
    script = tmp_path / "small_shm.py"
    script.write_text(SCRIPT.format(src=SRC))
    shell = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script}"
    out = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", shell],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FOLDER /dev/shm" not in out.stdout
    assert "WARNED True" in out.stdout
    assert "NAMES TMP True" in out.stdout  # the folder itself, not a "{...}" placeholder
    assert "LEFT []" in out.stdout
