"""The stoker command: bench, inspect and doctor print what they promise; errors are one
plain line and a non-zero exit, never a traceback (unless --debug)."""

import os
import re
import shutil
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
    # progress goes to stderr, the report to stdout; a line every 5 s of a long epoch aside
    progress = [ln for ln in captured.err.splitlines() if "img/s so far" not in ln]
    assert [ln.split(":")[1].split(",")[0].strip() for ln in progress] == [
        "warm-up epoch (6 batches; workers start)",
        "epoch 1/1",
        "one core's rate",
        "ceiling",
    ], progress


@pytest.mark.parametrize(
    "argv,code,says",
    [
        (["inspect", "/no/such/folder"], 1, "stoker inspect: error: /no/such/folder: no such"),
        (["convert", "/no/such/folder", "OUT"], 1, "stoker convert: error: /no/such/folder"),
        (["convert", "/no/such", "/dev/null/OUT"], 1, "error: dst /dev/null/OUT: cannot create"),
        (["demo", "--out", "/dev/null/d"], 1, "error: --out /dev/null/d: cannot create it"),
        (["bench", ".", "--workers", "many"], 2, "--workers: give 'auto' or a count >= 0"),
        (["bench", ".", "--batch-size", "0"], 2, "argument --batch-size: give a whole number"),
        (["bench", ".", "--workers", "999"], 1, "stoker bench: error: --workers 999: more than"),
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


# --------------------------------------------------------------------------- outputs, timing, words


def _cli(argv: list[str], cwd: Path, wrap: list[str] | None = None, timeout: int = 200):
    """``python -m stoker ARGV`` in a fresh process (inside ``wrap``, a shell prefix, if given)."""
    command = [sys.executable, "-m", "stoker", *argv]
    return subprocess.run(
        [*(wrap or []), *command],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )


def _unreadable_images(folder: Path) -> Path:
    """A folder of files named like images that no decoder reads: a run that loads a single
    sample from it fails, naming them (so an error about anything else came first)."""
    for name in ("a", "b"):
        (folder / name).mkdir(parents=True)
        for k in range(3):
            (folder / name / f"{k}.jpg").write_bytes(b"not a jpeg at all" * 8)
    return folder


@pytest.mark.timeout(240)
def test_bench_plot_to_a_folder_it_cannot_write_fails_before_any_sample_is_read(
    tmp_path, needs_namespace
):
    """The --plot path is checked first: with a source whose every sample fails to load, the
    error is about the path (old code ran the benchmark and failed on the samples)."""
    import chaos_env

    data = _unreadable_images(tmp_path / "data")
    (tmp_path / "file.txt").write_text("a file, not a folder")
    (tmp_path / "ro").mkdir()
    ro = str(tmp_path / "ro")
    read_only = [*chaos_env.NAMESPACE, f'mount --bind -o ro {ro} {ro} && exec "$@"', "sh"]
    for plot, wrap, says in [
        (tmp_path / "missing" / "x.png", None, "the folder " + str(tmp_path / "missing")),
        (tmp_path / "file.txt" / "x.png", None, "is not a folder"),
        (tmp_path / "ro" / "x.png", read_only, "a read-only file system"),
    ]:
        proc = _cli(["bench", str(data), "--workers", "0", "--plot", str(plot)], tmp_path, wrap)
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.startswith(f"stoker bench: error: --plot {plot}: "), proc.stderr
        assert says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stdout == "" and not plot.exists()


@pytest.mark.timeout(240)
def test_bench_prints_its_report_when_the_chart_cannot_be_written(
    image_folder, tmp_path, needs_namespace
):
    """A full disk under --plot: the path passes the check, the write fails after the
    measurement, and the measured report is still printed before the one-line error."""
    import chaos_env

    full = str(tmp_path / "full")
    os.mkdir(full)
    fill = f"mount -t tmpfs -o size=64k tmpfs {full} && {chaos_env.FILL.format(where=full)}"
    wrap = [*chaos_env.NAMESPACE, fill + ' && exec "$@"', "sh"]
    flags = "--workers 0 --batch-size 6 --image-size 32 --epochs 1".split()
    proc = _cli(["bench", str(image_folder), *flags, "--plot", f"{full}/x.png"], tmp_path, wrap)
    assert proc.returncode == 1, proc.stderr
    assert "throughput:" in proc.stdout and "busy cores decode" in proc.stdout, proc.stdout
    assert "plot:" not in proc.stdout
    assert proc.stderr.splitlines()[-1].startswith("stoker bench: error: "), proc.stderr
    assert "No space left on device" in proc.stderr.splitlines()[-1], proc.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "flags,says",
    [
        (["--batch-size", "36"], "an epoch of 1 batch:"),  # the whole folder in one batch
        (["--batch-size", "2", "--max-batches", "3"], "an epoch of 3 batches (--max-batches 3)"),
    ],
)
def test_bench_refuses_an_epoch_made_before_it_is_timed_naming_the_batches_it_needs(
    image_folder, capsys, flags, says
):
    """Two workers keep at least 3 batches made ahead of an epoch: an epoch of 1 or 3 cannot
    be timed (old code drained them and reported a rate far above the decode ceiling)."""
    argv = ["bench", str(image_folder), "--workers", "2", "--image-size", "32", *flags]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "throughput:" not in captured.out and "ratio" not in captured.out
    error = captured.err.splitlines()[-1]
    assert error.startswith("stoker bench: error: cannot time ") and says in error, error
    ahead = int(re.search(r"up to (\d+) batches are made ahead", error)[1])
    assert ahead >= 3
    assert f"at least {10 * ahead} for a rate within 10%" in error, error
    fix = f"--max-batches {10 * ahead} or more" if "--max-batches" in flags else "--batch-size"
    assert fix in error, error


@pytest.mark.timeout(180)
def test_bench_counts_only_the_batches_made_inside_each_timed_epoch(image_folder, capsys):
    """6 batches an epoch with one worker: the first (2 or 3, as the ring stands) are not
    counted, and the report says the rate is a lower bound and how many batches it needs."""
    flags = "--workers 1 --batch-size 4 --image-size 32 --epochs 2 --max-batches 6".split()
    assert main(["bench", str(image_folder), *flags]) == 0
    out = capsys.readouterr().out
    counted = re.search(r"the first (\d+) batches of each epoch, made ahead of it, are not", out)
    warned = re.search(
        r"warning: short epochs: up to (\d+) of each 6 batches .* at least (\d+)", out
    )
    assert counted and warned, out
    assert int(counted[1]) in (2, 3) and int(warned[1]) in (2, 3)  # 1 or 2 per worker, + 1
    assert int(warned[2]) == 10 * int(warned[1])


@pytest.mark.timeout(120)
def test_stoker_warnings_are_one_line_each_before_the_one_line_error(tmp_path):
    """Bad files past the budget: each StokerWarning is one `stoker bench: warning:` line (no
    Python file:line and source line), then the error, and nothing else on stderr."""
    data = tmp_path / "data"
    shutil.copytree(Path(SRC).parent / "tests" / "corpus" / "jpeg", data / "good")
    _unreadable_images(data / "bad")
    argv = ["bench", str(data), "--workers", "0", "--batch-size", "64", "--image-size", "16"]
    proc = _cli(argv, tmp_path)
    lines = proc.stderr.splitlines()
    errors = [k for k, ln in enumerate(lines) if ln.startswith("stoker bench: error: ")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    before = lines[: errors[0]]  # the error lists the files after its first line
    warned = [ln for ln in before if ln.startswith("stoker bench: warning: stoker skipped ")]
    assert warned, proc.stderr
    assert all(ln.startswith("stoker bench: ") for ln in before), proc.stderr
    assert "StokerWarning" not in proc.stderr and "warnings.warn" not in proc.stderr
