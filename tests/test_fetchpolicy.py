"""The request policies (``sources/fetchpolicy.py``) and the per-process ``Fetcher``, tested
alone: no process, no server; time is a fake clock the tests advance."""

from __future__ import annotations

import random

import pytest

from stoker.sources.fetch import Fetcher, RequestCounts
from stoker.sources.fetchpolicy import (
    FINAL,
    RETRY,
    THROTTLED,
    Backoff,
    RateCeiling,
    ShortBody,
    classify,
    merge_ranges,
)


def test_neighbouring_ranges_within_the_gap_merge_into_one_span() -> None:
    spans = merge_ranges([(300, 400), (0, 100), (150, 250), (5000, 5100)], max_gap=60)
    assert [(s.start, s.end) for s in spans] == [(0, 400), (5000, 5100)]
    assert spans[0].parts == ((0, 100), (150, 250), (300, 400))
    data = bytes(range(256)) * 2
    assert spans[0].slice_of(data[:400], (150, 250)) == data[150:250]


def test_a_gap_one_byte_too_wide_or_a_span_too_long_splits() -> None:
    assert len(merge_ranges([(0, 10), (21, 30)], max_gap=10)) == 2
    assert len(merge_ranges([(0, 10), (20, 30)], max_gap=10)) == 1
    spans = merge_ranges([(0, 10), (10, 20), (20, 30)], max_gap=0, max_span=20)
    assert [(s.start, s.end) for s in spans] == [(0, 20), (20, 30)]
    assert [(s.start, s.end) for s in merge_ranges([(0, 100)], max_span=10)] == [(0, 100)]


def test_overlapping_and_repeated_ranges_ask_for_no_byte_twice() -> None:
    spans = merge_ranges([(0, 50), (10, 20), (0, 50), (40, 90)], max_gap=0)
    assert [(s.start, s.end) for s in spans] == [(0, 90)]
    assert len(spans[0].parts) == 4
    with pytest.raises(ValueError, match="byte range"):
        merge_ranges([(10, 5)])


def test_backoff_is_jittered_exponential_capped_and_stops_at_the_deadline() -> None:
    backoff = Backoff(base=0.1, cap=1.0, deadline=5.0, rng=random.Random(7))
    waits = [backoff.delay(k, 0.0) for k in range(8)]
    assert all(w is not None for w in waits)
    assert all(0 <= w < min(1.0, 0.1 * 2**k) for k, w in enumerate(waits))  # type: ignore[operator]
    assert len(set(waits)) == len(waits)  # jittered: not in step with other clients
    assert Backoff(base=1.0, cap=1.0, deadline=1.0).delay(0, elapsed=1.0) is None


def test_the_rate_ceiling_schedules_requests_at_its_rate_per_prefix() -> None:
    ceiling = RateCeiling(rate=100.0, burst=5)
    now, sent = 0.0, []
    for _ in range(105):
        wait = ceiling.acquire("s3://bkt/train/part-0.parquet", now)
        sent.append(now + wait)
        now += wait  # the caller sleeps as told
    assert sent[:5] == [0.0] * 5  # the burst goes at once
    assert sent[-1] == pytest.approx(1.0)  # 100 more at 100/s: one second
    assert ceiling.scheduled_rate("s3://bkt/train/x") == pytest.approx(100.0)
    assert ceiling.acquire("s3://bkt/other/x", now) == 0.0  # another prefix: its own bucket
    assert ceiling.granted == {"bkt/train": 105, "bkt/other": 1}
    with pytest.raises(ValueError, match="rate"):
        RateCeiling(0)


def test_failures_are_told_apart_throttled_retried_or_final() -> None:
    from botocore.exceptions import ClientError

    def client_error(code: str, status: int) -> ClientError:
        meta = {
            "Error": {"Code": code, "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        }
        return ClientError(meta, "GetObject")  # type: ignore[arg-type]

    assert classify(client_error("SlowDown", 503)) == THROTTLED
    assert classify(client_error("TooManyRequests", 429)) == THROTTLED
    assert classify(client_error("InternalError", 500)) == RETRY
    assert classify(client_error("AccessDenied", 403)) == FINAL
    try:  # s3fs wraps the library's error in an OSError: the cause still tells
        raise OSError("s3://bkt/k bytes 500-503: oops") from client_error("SlowDown", 503)
    except OSError as exc:
        assert classify(exc) == THROTTLED
    assert classify(ConnectionResetError(104, "reset")) == RETRY
    assert classify(ConnectionRefusedError(111, "refused")) == FINAL
    assert classify(ShortBody("short")) == RETRY
    assert classify(TimeoutError()) == RETRY
    assert classify(FileNotFoundError("s3://bkt/k")) == FINAL
    assert classify(OSError("s3://b/k bytes 500-504: bad request")) == FINAL


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_fetcher_retries_and_counts_then_gives_up_at_the_deadline() -> None:
    clock = _Clock()
    fetcher = Fetcher(rate=1e6, timeout=10.0, clock=clock, sleep=clock.sleep)
    replies: list[object] = [ConnectionResetError(104, "reset"), OSError("SlowDown"), b"abcd"]

    def call() -> bytes:
        reply = replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply  # type: ignore[return-value]

    assert fetcher.request("s3://b/k", call, nbytes=4) == b"abcd"
    counts = fetcher.take_counts()
    assert (counts.gets, counts.nbytes, counts.retries, counts.throttled) == (1, 4, 2, 1)
    assert fetcher.take_counts().retries == 0  # taken: the next take starts from zero

    def short() -> bytes:
        return b"ab"

    with pytest.raises(ShortBody, match="attempts"):
        fetcher.request("s3://b/k", short, nbytes=4)
    assert clock.now < 10.0 + 5.0  # gave up at the deadline, never past it by a cap
    counts = fetcher.take_counts()
    assert counts.failed == 1 and counts.retries >= 3

    def missing() -> bytes:
        raise FileNotFoundError("s3://b/gone")

    with pytest.raises(FileNotFoundError):
        fetcher.request("s3://b/gone", missing)
    assert fetcher.take_counts().retries == 0  # final: never retried


def test_request_counts_add_and_give_latency_quantiles() -> None:
    a, b = RequestCounts(), RequestCounts()
    for ms in range(1, 100):
        a.record(ms / 1000, 10)
    b.record(2.0, 10)
    total = a + b
    assert total.gets == 100 and total.nbytes == 1000
    assert 0.050 <= total.latency(0.5) <= 0.050 * 1.26 + 1e-9
    assert 0.099 <= total.latency(0.99) <= 0.099 * 1.26 + 1e-9
    assert RequestCounts().latency(0.5) == 0.0


@pytest.mark.timeout(30)
def test_the_process_wide_cap_bounds_the_requests_in_flight() -> None:
    import threading

    fetcher = Fetcher(rate=1e6, max_in_flight=2)
    pair = threading.Barrier(2, timeout=10)  # two requests meet in flight, pair by pair

    def call() -> bytes:
        pair.wait()
        return b"x"

    threads = [
        threading.Thread(target=fetcher.request, args=(f"s3://b/k{i}", call)) for i in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert fetcher.counts.gets == 6 and fetcher.peak_in_flight == 2 and fetcher.in_flight == 0
