"""How much memory batches take: the worker ring starts at one batch in flight per worker and
deepens only when measured waits say so; workers=0 reuses a few blocks and hands one over,
instead of a copy, to an adapter whose framework keeps batches."""

import time

import numpy as np
import pytest

import helpers
import stoker
from stoker.adapters.base import owned
from stoker.assemble import Report
from stoker.workers.engine import Depth


def _replies(depth, idle, fill, count=8):
    for k in range(count):
        depth.reply(k % 2, Report(idle_s=idle, fill_s=fill))


def test_depth_deepens_only_when_workers_idle_while_the_consumer_waits():
    depth = Depth(workers=2)  # a window of 8 counted replies (each worker's first is not)
    _replies(depth, idle=5.0, fill=0.1, count=2)  # the first tasks waited for the start
    for _ in range(8):
        depth.get(waited=True)
    _replies(depth, idle=0.001, fill=0.1)
    assert depth.deeper() is None  # 1 % idle: deep enough
    for _ in range(8):
        depth.get(waited=False)
    _replies(depth, idle=0.05, fill=0.1)
    assert depth.deeper() is None  # idle, but the consumer never waited: it is the limit
    for _ in range(8):
        depth.get(waited=True)
    _replies(depth, idle=0.05, fill=0.1, count=7)
    assert depth.deeper() is None  # the window is not full yet
    _replies(depth, idle=0.05, fill=0.1, count=1)
    assert depth.deeper() == pytest.approx(0.5)


@pytest.mark.timeout(120)
def test_ring_starts_one_per_worker_and_deepens_when_workers_wait_for_work():
    data = helpers.SlowSamples(48, delay=0.03)  # 0.12 s per batch of 4 in each worker
    with stoker.Loader(data, batch_size=4, workers=2, shuffle=False) as loader:
        seen, ring_seen = [], False
        for _epoch in range(3):
            for x in loader:
                # the first batches may be made here while the workers start (prefetch 0);
                # the ring, once it serves, starts at 1 per worker
                if not ring_seen and loader.stats().prefetch:
                    assert loader.stats().prefetch == 2
                    ring_seen = True
                seen.append(x[:, 0].astype(int).tolist())
                if len(seen) % 2:  # uneven steps (a validation, a log): the workers finish
                    time.sleep(0.4)  # and wait for work, then the consumer waits for them
            if loader.stats().prefetch == 4:
                break
        report = loader.stats()
    assert ring_seen and report.prefetch == 4, report
    assert "deepened to 2 per worker" in str(report)
    flat = [i for batch in seen for i in batch]
    assert flat == list(range(48)) * (len(flat) // 48)  # order untouched by the change


@pytest.mark.timeout(60)
def test_in_process_block_is_handed_over_not_copied_and_never_reused():
    images = np.random.default_rng(0).integers(0, 256, (48, 160, 160, 3), dtype=np.uint8)
    with stoker.Loader(images, batch_size=16, workers=0, shuffle=False) as loader:
        given = []
        for x, _y in loader:
            kept = owned(x)  # what the tf / Keras-TF / JAX-CPU adapters do with a batch
            assert kept is x
            given.append(kept)
        assert len({id(x.base) for x in given}) == len(given)  # none reused under tf.data
        for k, x in enumerate(given):
            assert np.array_equal(x, images[16 * k : 16 * (k + 1)])
    with stoker.Loader(images, batch_size=16, workers=1, shuffle=False) as loader:
        x, _y = next(iter(loader))
        assert owned(x) is not x and np.array_equal(owned(x), x)  # a ring slot is copied


def test_a_long_idle_reads_as_a_multiple_not_thousands_of_percent():
    from stoker.workers.engine import idle_words

    assert idle_words(0.25) == "25% of" and idle_words(45.69) == "45.7x"
