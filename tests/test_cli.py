"""The stoker command: bench, inspect and doctor print what they promise; errors are one
plain line and a non-zero exit, never a traceback (unless --debug)."""

import subprocess
import sys
from pathlib import Path

import pytest

from stoker.cli import main
from stoker.errors import SourceError

SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.mark.timeout(120)
def test_bench_reports_throughput_ceiling_ratio_and_bottleneck_with_progress(image_folder, capsys):
    assert (
        main(
            [
                "bench",
                str(image_folder),
                "--batch-size",
                "6",
                "--image-size",
                "32",
                "--workers",
                "2",
                "--epochs",
                "1",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    for part in (
        "throughput:",
        "busy cores decode",
        "ratio",
        "CPU per image",
        "peak PSS",
        "JPEG decoder:",
        "slowest:",
    ):
        assert part in captured.out, captured.out
    progress = captured.err.splitlines()  # progress goes to stderr, the report to stdout
    assert [ln.split(":")[1].split(",")[0].strip() for ln in progress] == [
        "one core's rate",
        "warm-up epoch (6 batches; workers start)",
        "epoch 1/1",
        "ceiling",
    ], progress


@pytest.mark.parametrize(
    "argv,code,says",
    [
        (["inspect", "/no/such/folder"], 1, "stoker inspect: error: /no/such/folder: no such"),
        (["convert", "/no/such/folder", "OUT"], 1, "stoker convert: error: /no/such/folder"),
        (["bench", ".", "--workers", "many"], 2, "--workers: use 'auto' or a count"),
        (["inspect"], 2, "the following arguments are required: source"),
        (["doctor", "--frobnicate"], 2, "unrecognized arguments: --frobnicate"),
    ],
)
@pytest.mark.timeout(60)
def test_bad_command_lines_and_paths_give_one_plain_line(argv, code, says, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "stoker", *argv],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "OUT").exists()


def test_debug_shows_the_real_exception(tmp_path):
    with pytest.raises(SourceError, match="no such file or folder"):
        main(["inspect", str(tmp_path / "missing"), "--debug"])


def test_inspect_counts_classes_sizes_and_bad_files(image_folder, capsys):
    main(["inspect", str(image_folder), "--decode"])
    out = capsys.readouterr().out
    assert "36 samples" in out and "classes (3)" in out and "bad files: 0" in out
    assert "formats: jpeg 36" in out


def test_doctor_reports_shared_memory_and_decoders(capsys):
    main(["doctor"])
    out = capsys.readouterr().out
    assert "/dev/shm" in out and "decoders:" in out and "stale stoker segments" in out
    assert "file reads ahead of decoding: native threads" in out
