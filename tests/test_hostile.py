"""Hostile input: pickle payloads are never executed, readers only raise stoker's errors."""

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stoker
from stoker.errors import SourceError, StokerError
from stoker.sources import open_source


class Payload:
    """Unpickling this creates the marker file: proof that something ran pickle.loads."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.timeout(60)
def test_pickle_payload_in_a_parquet_image_column_is_never_executed(tmp_path, image_folder):
    marker = tmp_path / "PWNED"
    good = [f.read_bytes() for f in sorted(image_folder.glob("class_000/*.jpg"))[:5]]
    blobs = good + [pickle.dumps(Payload(str(marker)))]
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(blobs)],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            ),
            "label": pa.array([0] * len(blobs), pa.int64()),
        }
    )
    (tmp_path / "ds").mkdir()
    pq.write_table(table, tmp_path / "ds" / "part-0.parquet", compression="snappy")
    with pytest.warns(stoker.StokerWarning, match="skipped"):
        with stoker.Loader(
            tmp_path / "ds", batch_size=3, image_size=16, workers=2, max_errors=1, shuffle=False
        ) as loader:
            list(loader)
            assert loader.stats().skipped == 1
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_state_is_plain_json(image_folder):
    with stoker.Loader(image_folder, batch_size=4, workers=0) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=400))
def test_any_csv_text_gives_a_source_or_a_source_error(tmp_path, text):
    table = tmp_path / "list.csv"
    table.write_text(
        text, encoding="utf-8", errors="surrogatepass"
    ) if "\ud800" not in text else None
    if not table.exists():
        return
    try:
        src = open_source(table)
    except SourceError:
        return
    assert len(src) == len(src.labels) >= 1
    for i in range(min(len(src), 3)):
        try:
            src.read(i)
        except OSError:
            pass  # a listed file that does not exist: the loader counts it as a bad sample


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2048), suffix=st.sampled_from([".npy", ".parquet", ".tar"]))
def test_garbage_files_give_stoker_errors_not_crashes(tmp_path, data, suffix):
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(data)
    try:
        src = open_source(path)
        for i in range(min(len(src), 3)):
            src.read(i)
    except (StokerError, OSError):
        pass
    finally:
        for leftover in tmp_path.glob("garbage*.idx.npy"):
            os.unlink(leftover)
    assert np.asarray(0) == 0


LONG = "y" * 5000  # longer than any file system's name limit


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cell", [LONG, "a\0b"], ids=["too-long", "nul"])
def test_a_first_cell_that_cannot_be_a_path_is_a_source_error(tmp_path, cell):
    """A headerless CSV whose first cell cannot even be looked up: a SourceError naming the
    file and row (was a raw OSError: File name too long)."""
    table = tmp_path / "list.csv"
    table.write_text(f"{cell},0\n", encoding="utf-8")
    with pytest.raises(stoker.SourceError, match="row 1"):
        open_source(table)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", [LONG, LONG + ".csv", "a\0b.csv"], ids=["dir", "csv", "nul"])
def test_a_source_path_that_cannot_be_looked_at_is_a_source_error(tmp_path, name):
    with pytest.raises(stoker.SourceError, match="cannot be opened|no such file"):
        stoker.Loader(str(tmp_path / name), workers=0)
