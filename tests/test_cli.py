"""The stoker command: bench, inspect and doctor print what they promise."""

import pytest

from stoker.cli import main
from stoker.cli.bench import run_bench


@pytest.mark.timeout(120)
def test_bench_reports_throughput_ceiling_ratio_and_bottleneck(image_folder):
    text = run_bench(str(image_folder), batch_size=6, image_size=32, workers=2, epochs=1)
    for part in ("throughput:", "busy cores decode", "ratio", "CPU per image", "peak PSS",
                 "slowest:"):
        assert part in text, text


def test_inspect_counts_classes_sizes_and_bad_files(image_folder, capsys):
    main(["inspect", str(image_folder), "--decode"])
    out = capsys.readouterr().out
    assert "36 samples" in out and "classes (3)" in out and "bad files: 0" in out
    assert "formats: jpeg 36" in out


def test_doctor_reports_shared_memory_and_decoders(capsys):
    main(["doctor"])
    out = capsys.readouterr().out
    assert "/dev/shm" in out and "decoders:" in out and "stale stoker segments" in out
