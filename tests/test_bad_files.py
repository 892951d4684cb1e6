"""Finding 10 and the "stoker's own errors only" rule: a loader whose files are all bad says
which file and why in the exception itself, and its stats() count them, with no negative time."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.errors import TooManyErrors


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 50, 3), 120, np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("workers", [0, 1])
def test_one_bad_file_names_the_file_and_reason(tmp_path, workers: int) -> None:
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(_jpeg()[:300])
    loader = stoker.Loader(
        paths=[str(bad)],
        labels=[0],
        batch_size=1,
        image_size=16,
        workers=workers,
        max_errors=10,
    )
    with pytest.raises(TooManyErrors) as info:
        next(iter(loader))
    message = str(info.value)
    assert "broken.jpg" in message and "truncated" in message.lower()
    assert "64 samples" not in message and "in a row" not in message
    assert re.search(r"only sample", message), message
    report = loader.stats()
    assert report.skipped == 1 and report.bad_files[0][0].endswith("broken.jpg")
    assert report.elapsed_s >= 0 and report.first_batch_s >= 0
    assert "-" not in f"{report.elapsed_s:.2f}" and "skipped samples: 1" in str(report)
    loader.close()


def test_all_bad_files_are_listed(tmp_path) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"bad{i}.png"
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
        paths.append(str(path))
    with stoker.Loader(
        paths=paths, labels=[0, 1, 2], batch_size=2, image_size=16, workers=0, max_errors=10
    ) as loader:
        with pytest.raises(TooManyErrors) as info:
            next(iter(loader))
        message = str(info.value)
        assert "all 3 samples failed" in message
        assert all(f"bad{i}.png" in message for i in range(3)), message
        assert loader.stats().skipped == 3
