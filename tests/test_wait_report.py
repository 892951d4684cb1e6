"""The wait report: training-loop time apart from validation and other time outside the loop,
the per-N-steps meter for hand-written loops, and its figures."""

from __future__ import annotations

import pathlib
import time

import pytest

import stoker
from helpers import report_of
from stoker import stats as stats_mod

KW = {"batch_size": 8, "image_size": 16, "workers": 0}


class Clock:
    """A perf_counter that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_accounting_keeps_validation_out_of_the_training_loop(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(stats_mod.time, "perf_counter", clock)
    s = stats_mod.Stats()
    t0 = s.begin_wait()
    clock.now += 2.0  # start-up: the first batch, reported on its own
    s.end_wait(t0, 8)
    since = s.window()
    for _ in range(3):  # three steps of 1 s compute, each after a 0.5 s wait
        clock.now += 1.0
        s.tick()
        t0 = s.begin_wait()
        clock.now += 0.5
        s.end_wait(t0, 8)
    clock.now += 1.0
    s.tick()
    s.pause()  # the epoch is over: validation for 30 s
    clock.now += 30.0
    t0 = s.begin_wait()
    clock.now += 0.5
    s.end_wait(t0, 8)
    report = report_of(s)
    assert report.first_batch_s == 2.0 and report.elapsed_s == 38.0
    assert report.outside_s == 30.0 and report.train_s == 6.0  # 4 steps of 1 s, 4 waits
    assert report.wait_share == pytest.approx(2.0 / 6.0)
    assert report.images_per_s == pytest.approx(32 / 6.0)  # not 40 images / 38 s
    figures = s.window() - since
    assert figures["steps"] == 4 and figures["data_wait"] == pytest.approx(2.0 / 6.0)
    assert figures["input_img_s"] == pytest.approx(32 / 6.0) and "device_wait" not in figures
    s.add_device_wait(0.3)
    assert (s.window() - since)["device_wait"] == pytest.approx(0.05)


@pytest.mark.timeout(60)
def test_time_between_epochs_is_outside_the_training_loop(image_folder: pathlib.Path) -> None:
    with stoker.Loader(image_folder, **KW) as loader:
        for _ in loader:
            pass
        time.sleep(0.3)  # validation, a checkpoint...
        for _ in loader:
            pass
        report = loader.stats()
    assert report.batches == 2 * len(loader)
    assert report.outside_s >= 0.3
    assert report.train_s + report.outside_s <= report.elapsed_s - report.first_batch_s + 1e-6
    steady = report.images - KW["batch_size"]
    assert report.images_per_s == pytest.approx(steady / report.train_s)
    assert "outside the training loop" in str(report)


@pytest.mark.timeout(60)
def test_wait_meter_gives_figures_every_n_steps(image_folder: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    with stoker.Loader(image_folder, **KW) as loader:
        meter = loader.wait_meter(every=2)
        got = []
        for x, _ in loader.torch():
            torch.nn.functional.avg_pool2d(x.float(), 2)  # a "step" on (B, C, H, W)
            got.append(meter.step())
    assert [g is None for g in got] == [True, False, True, False]
    for figures in got[1::2]:
        assert figures["steps"] == 2 and 0.0 <= figures["data_wait"] <= 1.0
        assert figures["input_img_s"] > 0
        assert "waited for data" in str(figures)
    with pytest.raises(stoker.ConfigError):
        loader.wait_meter(every=0)
