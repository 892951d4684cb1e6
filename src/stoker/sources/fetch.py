"""Every remote request of one process, paced, retried and counted (``fetchpolicy`` decides).

``request(url, call, nbytes=None)`` runs ``call()`` (one GET, made by the store) under the
process-wide policies: at most ``max_in_flight`` requests at once in the process (read-ahead
threads of one worker share it), the request-rate ceiling per prefix (``RateCeiling``), and
retries with jittered exponential backoff (``Backoff``) on throttling (503 SlowDown, 429),
other 5xx, dropped or reset connections, timeouts and short bodies (``nbytes`` given: fewer
bytes than asked for), all within one deadline (``timeout``). What still fails raises the last
error, with how many attempts were made added to its message; the caller names the URL.

``counts`` (a ``RequestCounts``) adds up what the requests cost: GETs, bytes, retries,
throttling replies, failures, and a latency histogram (median and p99 come from it); a worker
hands ``take_counts()`` (the counts since the last take) to the main process with each batch
report, where ``stats()`` adds them up.

``configure(rate=..., timeout=...)`` sets the process's policies (read-ahead does it from
``Loader(request_rate=..., timeout=...)`` in every worker). A forked process starts afresh.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .fetchpolicy import DEFAULT_RATE, FINAL, THROTTLED, Backoff, RateCeiling, ShortBody, classify

MAX_IN_FLIGHT = 128  # requests at once in one process (every read-ahead window together)
DEFAULT_TIMEOUT = 60.0  # seconds one request may take, retries included
_BUCKETS = 64  # latency histogram: bucket k holds latencies below 0.1 ms * 2**(k/3)


def _bucket(seconds: float) -> int:
    if seconds <= 1e-4:
        return 0
    return min(_BUCKETS - 1, int(math.ceil(3 * math.log2(seconds / 1e-4))))


def _bucket_top(k: int) -> float:
    return 1e-4 * 2.0 ** (k / 3)


@dataclass
class RequestCounts:
    """What requests cost: counts, bytes, seconds and a latency histogram; ``+`` adds two."""

    gets: int = 0
    nbytes: int = 0
    retries: int = 0
    throttled: int = 0
    failed: int = 0
    seconds: float = 0.0
    histogram: list[int] = field(default_factory=lambda: [0] * _BUCKETS)

    def __add__(self, other: RequestCounts) -> RequestCounts:
        return self._combined(other, 1)

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return self._combined(other, -1)

    def _combined(self, other: RequestCounts, sign: int) -> RequestCounts:
        return RequestCounts(
            self.gets + sign * other.gets,
            self.nbytes + sign * other.nbytes,
            self.retries + sign * other.retries,
            self.throttled + sign * other.throttled,
            self.failed + sign * other.failed,
            self.seconds + sign * other.seconds,
            [a + sign * b for a, b in zip(self.histogram, other.histogram, strict=True)],
        )

    def latency(self, q: float) -> float:
        """The ``q`` quantile (0.5: median) of one request's latency in seconds, from the
        histogram (the top of the bucket it falls in: within 26% above the true figure)."""
        total = sum(self.histogram)
        if not total:
            return 0.0
        rank, seen = q * total, 0
        for k, n in enumerate(self.histogram):
            seen += n
            if seen >= rank and n:
                return _bucket_top(k)
        return _bucket_top(_BUCKETS - 1)

    def record(self, seconds: float, nbytes: int) -> None:
        """One answered request."""
        self.gets += 1
        self.nbytes += nbytes
        self.seconds += seconds
        self.histogram[_bucket(seconds)] += 1


class Fetcher:
    """One process's request policies and counters; see the module docstring."""

    def __init__(
        self,
        rate: float = DEFAULT_RATE,
        timeout: float = DEFAULT_TIMEOUT,
        max_in_flight: int = MAX_IN_FLIGHT,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.ceiling = RateCeiling(rate)
        self.timeout = float(timeout)
        self.max_in_flight = max_in_flight
        self.clock, self.sleep = clock, sleep
        self.counts = RequestCounts()
        self._taken = RequestCounts()
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()
        self.in_flight = self.peak_in_flight = 0

    def configure(self, rate: float | None = None, timeout: float | None = None) -> None:
        """Change the rate ceiling (requests/s per prefix) or the per-request deadline."""
        if rate is not None and rate != self.ceiling.rate:
            self.ceiling = RateCeiling(rate)
        if timeout is not None:
            self.timeout = float(timeout)

    def take_counts(self) -> RequestCounts:
        """The counts added since the last take (a worker sends them with a batch report)."""
        with self._lock:
            now = self.counts + RequestCounts()
            taken, self._taken = self._taken, now
        return now - taken

    def request(
        self,
        url: str,
        call: Callable[[], bytes],
        nbytes: int | None = None,
        deadline: float | None = None,
    ) -> bytes:
        """``call()``'s bytes for ``url``, paced and retried (see the module docstring); no
        retry starts past ``timeout`` seconds (or ``deadline``, when that is sooner)."""
        limit = self.timeout if deadline is None else min(self.timeout, deadline)
        backoff = Backoff(deadline=limit)
        began = self.clock()
        attempt = 0
        while True:
            wait = self.ceiling.acquire(url, self.clock())
            if wait > 0:
                self.sleep(wait)
            try:
                data = self._once(call, nbytes)
            except Exception as exc:  # noqa: BLE001 - classified; re-raised when final
                kind = classify(exc)
                delay = None if kind == FINAL else backoff.delay(attempt, self.clock() - began)
                with self._lock:
                    self.counts.throttled += kind == THROTTLED
                    self.counts.failed += delay is None
                    self.counts.retries += delay is not None
                if delay is None:
                    if attempt:
                        _note(exc, f"after {attempt + 1} attempts")
                    raise
                self.sleep(delay)
                attempt += 1
                continue
            return data

    def _once(self, call: Callable[[], bytes], nbytes: int | None) -> bytes:
        with self._slots:
            with self._lock:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            t0 = time.perf_counter()
            try:
                data = call()
            finally:
                seconds = time.perf_counter() - t0
                with self._lock:
                    self.in_flight -= 1
        with self._lock:
            self.counts.record(seconds, len(data))
        if nbytes is not None and len(data) < nbytes:
            raise ShortBody(f"got {len(data)} bytes, expected {nbytes} (a short body)")
        return data


def _note(exc: BaseException, text: str) -> None:
    """Add ``text`` to what ``exc`` says (its message, so a caller's ``one_line`` shows it)."""
    if isinstance(exc, OSError) and exc.strerror:  # OSError(errno, strerror): str() shows it
        exc.strerror = f"{exc.strerror} ({text})"
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]} ({text})", *exc.args[1:])


_FETCHER: Fetcher | None = None
_PID = -1
_GUARD = threading.Lock()


def fetcher() -> Fetcher:
    """This process's ``Fetcher`` (made afresh in a forked or spawned process)."""
    global _FETCHER, _PID
    with _GUARD:
        if _FETCHER is None or _PID != os.getpid():
            _FETCHER, _PID = Fetcher(), os.getpid()
        return _FETCHER


def request(
    url: str, call: Callable[[], bytes], nbytes: int | None = None, deadline: float | None = None
) -> bytes:
    """``fetcher().request(...)``: one request under this process's policies."""
    return fetcher().request(url, call, nbytes, deadline)


def configure(rate: float | None = None, timeout: float | None = None) -> None:
    """Set this process's rate ceiling and per-request deadline (``Fetcher.configure``)."""
    fetcher().configure(rate=rate, timeout=timeout)
