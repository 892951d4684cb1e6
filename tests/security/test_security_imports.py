"""Worker processes import only stoker's own installation, never code planted in the folder the
trainer runs in: the Loader's workers, the reaper and ``stoker convert``'s job workers.

A trainer started as ``python /abs/path/train.py`` has its script's folder first on ``sys.path``,
not its current folder; a worker must not be less careful than the trainer it serves."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stoker

SRC = str(Path(stoker.__file__).resolve().parents[1])
# module names the trainer, its workers, the reaper or a convert job import; a planted copy of
# any of them records its import and then fails, so a trainer that imported one cannot pass
PLANTED = (
    "stoker",
    "numpy",
    "cloudpickle",
    "cv2",
    "PIL",
    "pyarrow",
    "select",
    "fcntl",
    "threading",
    "warnings",
    "json",
    "psutil",
)

TRAINER = """
import os, sys
os.chdir(sys.argv[1])  # the shared, writable folder the trainer works in
import stoker
from stoker.cli import main
seen = []
with stoker.Loader(sys.argv[2], batch_size=4, image_size=32, workers=2, seed=0) as loader:
    for images, labels in loader:
        seen.append(len(labels))
assert main(["convert", sys.argv[2], sys.argv[3], "--workers", "2", "--shard-mb", "0.05",
             "--quiet"]) == 0
print("TRAINED", sum(seen))
"""


def _plant(folder: Path, marker: Path) -> None:
    """A module for every name in PLANTED that records ``name pid argv`` and refuses to load."""
    body = textwrap.dedent(f"""
        import os as _os, sys as _sys
        with open({str(marker)!r}, "a") as _f:
            _f.write(__name__ + " " + str(_os.getpid()) + " " + repr(_sys.argv) + "\\n")
        raise ImportError("planted module " + __name__ + " imported from " + __file__)
    """)
    for name in PLANTED:
        if name in ("stoker", "PIL"):
            (folder / name).mkdir()
            (folder / name / "__init__.py").write_text(body)
        else:
            (folder / f"{name}.py").write_text(body)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["started in the folder", "chdir with an empty PYTHONPATH entry"])
def test_no_worker_reaper_or_convert_job_imports_a_module_planted_in_the_working_folder(
    tmp_path, image_folder, how
):
    app, work, home = tmp_path / "app", tmp_path / "work", tmp_path / "home"
    for folder in (app, work, home):
        folder.mkdir()
    os.chmod(work, 0o1777)  # anyone may write here, as in /tmp or a shared project folder
    marker = tmp_path / "imported.txt"
    _plant(work, marker)
    (app / "train.py").write_text(TRAINER)
    # "chdir": the trainer starts in its own folder, and PYTHONPATH ends in ':' (an empty
    # entry: "the current folder", which the trainer resolved to the folder it started in)
    start, pythonpath = (work, SRC) if how == "started in the folder" else (app, SRC + os.pathsep)
    env = {**os.environ, "PYTHONPATH": pythonpath, "HOME": str(home)}
    argv = [
        sys.executable,
        str(app / "train.py"),
        str(work),
        str(image_folder),
        str(tmp_path / "shards"),
    ]
    out = subprocess.run(argv, cwd=start, env=env, capture_output=True, text=True, timeout=240)
    planted = marker.read_text() if marker.exists() else ""
    assert planted == "", f"planted modules were imported:\n{planted}\n{out.stderr[-3000:]}"
    assert out.returncode == 0 and "TRAINED 36" in out.stdout, out.stderr[-3000:]


@pytest.mark.timeout(120)
def test_without_dash_p_as_on_python_3_10_the_first_statement_keeps_the_folder_out(
    tmp_path, monkeypatch
):
    """Python 3.10 has no ``-P``: the worker's first statement (``BOOT``) alone must do it."""
    import numpy as np

    from stoker.workers import launch

    marker = tmp_path / "imported.txt"
    work = tmp_path / "work"
    work.mkdir()
    _plant(work, marker)
    monkeypatch.setattr(launch, "SAFE_PATH", (), raising=False)
    monkeypatch.chdir(work)
    images = np.zeros((8, 8, 8, 3), np.uint8)
    with stoker.Loader(
        images, labels=np.arange(8), batch_size=4, image_size=8, workers=1, augment=None
    ) as loader:
        assert [len(y) for _, y in loader] == [4, 4]
    assert not marker.exists(), marker.read_text()


def test_a_worker_keeps_only_absolute_pythonpath_entries_and_imports_stoker_from_its_own_folder(
    monkeypatch,
):
    from stoker.workers import launch

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["", "rel", "/abs/one", ".", "/abs/two"]))
    assert launch.worker_env()["PYTHONPATH"] == os.pathsep.join(["/abs/one", "/abs/two"])
    monkeypatch.setenv("PYTHONPATH", "")
    assert "PYTHONPATH" not in launch.worker_env()
    path = launch.worker_path()
    assert path[0] == SRC and path.count(SRC) == 1
    assert [p for p in sys.path if p != SRC] == path[1:]


WAITING_TRAINER = """
import sys
import numpy, stoker  # imported before the module below is planted: the trainer is not its target
print("READY", flush=True)
sys.stdin.readline()  # the second user plants numpy.py in this folder meanwhile
with stoker.Loader(sys.argv[1], batch_size=4, image_size=32, workers=2, seed=0) as loader:
    print("TRAINED", sum(len(labels) for _, labels in loader), flush=True)
"""


@pytest.mark.timeout(240)
def test_a_module_another_user_plants_in_the_shared_folder_never_runs_in_a_worker(
    tmp_path, image_folder, nobody, shared
):
    """``PYTHONPATH=/mine:`` started in a shared folder: Python puts that folder on the
    trainer's sys.path (the empty entry). Another user plants numpy.py there after the trainer
    imported numpy; the workers, started then, never import it (they used to: they took the
    trainer's path whole), and the trainer is warned once, naming the folder."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "train.py").write_text(WAITING_TRAINER)
    marker = shared / "imported.txt"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep, "HOME": str(tmp_path)}
    trainer = subprocess.Popen(
        [sys.executable, str(app / "train.py"), str(image_folder)],
        cwd=shared,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert trainer.stdout.readline().strip() == "READY"
        planted = (
            "import os, sys\n"
            f"open({str(marker)!r}, 'a').write('numpy ' + str(os.getpid()) + '\\n')\n"
            "raise ImportError('planted numpy.py imported from ' + __file__)\n"
        )
        nobody(f"open({str(shared / 'numpy.py')!r}, 'w').write({planted!r})")
        assert os.stat(shared / "numpy.py").st_uid == 65534  # the other user's file
        out, err = trainer.communicate("go\n", timeout=200)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate()
    assert not marker.exists(), f"the planted module ran: {marker.read_text()}\n{err[-3000:]}"
    assert trainer.returncode == 0 and "TRAINED 36" in out, err[-3000:]
    warned = [ln for ln in err.splitlines() if "StokerWarning" in ln]
    assert len(warned) == 1 and str(shared) in warned[0], err[-3000:]


def test_the_entries_an_empty_or_relative_pythonpath_entry_made_are_found_where_python_put_them():
    from stoker.workers.importpath import from_loose_entries

    major, minor = sys.version_info[:2]
    lib = [f"/py/lib/python{major}{minor}.zip", os.path.dirname(os.__file__)]
    # python /app/train.py in /shared with PYTHONPATH=/mine: (and something inserted first)
    assert from_loose_entries(["/app", "/mine", "/shared", *lib], "/mine:") == {"/shared"}
    assert from_loose_entries(["/x", "/app", "/mine", "/shared", *lib], "/mine:") == {"/shared"}
    # relative entries resolve under the same folder; '.' is that folder
    path = ["", "/mine", "/s/rel", "/s", *lib]
    assert from_loose_entries(path, "/mine:rel:.") == {"/s/rel", "/s"}
    # the script's own folder, or an entry given as absolute too, is never one of them
    assert from_loose_entries(["/shared", "/mine", *lib], "/mine:") == set()
    assert from_loose_entries(["/app", "/mine", *lib], "/mine") == set()
