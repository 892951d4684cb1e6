"""The conformance runner (scripts/check_decode.py), ``stoker inspect --decode`` classes, and
the JPEG decoder named everywhere (doctor, stats, and a one-time warning when the fast one is
not built)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np

import stoker
from reference import encode, run_without_extension
from stoker.cli import main
from stoker.cli.doctor import doctor
from stoker.decode import decoder_name, jpegcrop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "corpus", "jpeg")


def _folder(tmp_path):
    """A class folder with corpus JPEGs, a truncated one, a 16-bit-ish BMP and a PNG."""
    folder = tmp_path / "data" / "a"
    folder.mkdir(parents=True)
    for name in ("s441.jpg", "s420.jpg", "progressive.jpg"):
        shutil.copy(os.path.join(CORPUS, name), folder / name)
    data = (folder / "s420.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(data[: len(data) * 7 // 10])
    (folder / "p.png").write_bytes(encode(np.full((8, 9, 3), 40, np.uint8), "PNG"))
    return tmp_path / "data"


def test_runner_and_inspect_report_the_same_classes(tmp_path, capsys) -> None:
    data = _folder(tmp_path)
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "check_decode.py"), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = [
        line.split(maxsplit=1) for line in out.stdout.splitlines() if line[:8].strip().isdigit()
    ]
    runner = {tuple(rest.split(" | ")): int(n) for n, rest in rows}
    assert runner[("jpeg baseline 4:4:1 ycbcr", "ok", "same pixels as Pillow")] == 1
    assert runner[("jpeg baseline 4:2:0 ycbcr", "refused: truncated", "both refuse")] == 1
    assert runner[("png RGB", "ok", "same pixels as Pillow")] == 1
    assert "decoded 5 files" in out.stdout

    main(["inspect", str(data), "--decode"])
    text = capsys.readouterr().out
    listed = text.split("classes (kind | outcome):\n")[1].splitlines()
    inspect = {
        tuple(r.split(maxsplit=1)[1].split(" | ")): int(r.split()[0])
        for r in listed
        if r[:8].strip().isdigit()
    }
    assert inspect == {key[:2]: n for key, n in runner.items()}
    assert "bad files: 1" in text and "cut.jpg" in text


def test_decoder_is_named_in_doctor_and_stats() -> None:
    name = decoder_name()
    assert name.startswith("stoker crop-window" if jpegcrop.AVAILABLE else "simplejpeg")
    assert f"JPEG decoder in use: {name}" in doctor()
    images = np.zeros((4, 8, 8, 3), np.uint8)
    with stoker.Loader(images, labels=np.zeros(4, np.int64), batch_size=2, workers=0) as loader:
        next(iter(loader))
        assert f"JPEG decoder: {name}" in str(loader.stats())


def test_missing_extension_warns_once_with_the_cost_and_fix() -> None:
    code = (
        "import warnings\n"
        "import numpy as np, stoker\n"
        "from stoker.cli.doctor import doctor\n"
        "from stoker.decode.jpegcrop import install_hint\n"
        "images = np.zeros((4, 8, 8, 3), np.uint8)\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2):\n"
        "        with stoker.Loader(images, labels=np.zeros(4), batch_size=2, workers=0) as l:\n"
        "            next(iter(l))\n"
        "            report = str(l.stats())\n"
        "slow = [w for w in seen if 'fast JPEG decoder' in str(w.message)]\n"
        "assert len(slow) == 1, [str(w.message) for w in seen]\n"
        "message = str(slow[0].message)\n"
        "assert '20-25%' in message and 'libjpeg-turbo' in message\n"
        "assert install_hint() in message and 'reinstall' in message\n"
        "assert 'JPEG decoder: simplejpeg' in report, report\n"
        "assert 'simplejpeg' in doctor() and install_hint() in doctor()\n"
        "print('ok')\n"
    )
    run_without_extension(code)
