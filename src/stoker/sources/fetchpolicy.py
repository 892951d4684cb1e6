"""The policies that shape requests to an object store, each a small pure object.

- ``merge_ranges``: byte ranges wanted from one object, merged where the gap between neighbours
  is at most ``max_gap`` bytes (the gap is fetched and thrown away: one request costs more than
  a few KiB of transfer) and a merged request stays within ``max_span`` bytes.
- ``Backoff``: the waits between attempts of one request, jittered and exponential ("full
  jitter": a uniform draw below ``base * 2**attempt``, capped), never past a deadline.
- ``RateCeiling``: a token bucket per key prefix that keeps the request rate under a ceiling
  (S3 serves about 5,500 GETs/s per partitioned prefix, GCS about 5,000 reads/s per bucket at
  first; the default stays below both); it accounts every request it let through.
- ``classify``: whether a failed request is worth another attempt, and whether it was the store
  throttling.

None of them does I/O or reads a clock of its own: time is passed in, so each is tested alone.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

from ..errors import StokerError

DEFAULT_MAX_GAP = 256 << 10  # bytes between two wanted ranges that one request still spans
DEFAULT_MAX_SPAN = 32 << 20  # the most bytes one merged request asks for
DEFAULT_RATE = 3500.0  # requests/s per prefix: below S3's ~5,500 and GCS's ~5,000
THROTTLED = "throttled"
RETRY = "retry"
FINAL = "final"


@dataclass(frozen=True)
class Span:
    """One request's byte range ``[start, end)`` of an object, and the wanted ranges it
    serves, in the order they were given (``(start, end)`` pairs inside the span)."""

    start: int
    end: int
    parts: tuple[tuple[int, int], ...]

    def slice_of(self, data: bytes, part: tuple[int, int]) -> bytes:
        """The bytes of ``part`` (one of ``parts``) out of this span's ``data``."""
        return data[part[0] - self.start : part[1] - self.start]


def merge_ranges(
    ranges: list[tuple[int, int]],
    max_gap: int = DEFAULT_MAX_GAP,
    max_span: int = DEFAULT_MAX_SPAN,
) -> list[Span]:
    """Merge ``(start, end)`` ranges of one object into as few requests as the bounds allow.

    Ranges are sorted by start; one joins the span before it when it begins at most ``max_gap``
    bytes past that span's end and the span would stay within ``max_span`` bytes (a single
    range larger than ``max_span`` is one span of its own). Overlapping and repeated ranges
    join the span that covers them, so no byte is asked for twice. Spans come in storage order.
    """
    spans: list[Span] = []
    start = end = 0
    parts: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if b < a or a < 0:
            raise ValueError(f"byte range ({a}, {b}): need 0 <= start <= end")
        if parts and a - end <= max_gap and max(end, b) - start <= max_span:
            end = max(end, b)
        else:
            if parts:
                spans.append(Span(start, end, tuple(parts)))
            start, end, parts = a, b, []
        parts.append((a, b))
    if parts:
        spans.append(Span(start, end, tuple(parts)))
    return spans


@dataclass
class Backoff:
    """Waits between the attempts of one request: attempt ``k`` (0 first) waits a uniform draw
    in ``[0, min(cap, base * 2**k))`` seconds (full jitter, so throttled clients do not retry
    in step); ``delay`` returns None once the wait would end past ``deadline`` seconds after
    the first attempt began (the caller then gives up)."""

    base: float = 0.05
    cap: float = 5.0
    deadline: float = 60.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, elapsed: float) -> float | None:
        """The wait before attempt ``attempt + 1``, after ``elapsed`` seconds so far; None: stop."""
        wait = self.rng.uniform(0.0, min(self.cap, self.base * 2.0**attempt))
        if elapsed + wait >= self.deadline:
            return None
        return wait


def _prefix(url: str) -> str:
    """The rate key of ``url``: its bucket and first path segment (S3 partitions by prefix)."""
    rest = url.split("://", 1)[-1]
    parts = rest.split("/", 2)
    return "/".join(parts[:2])


class RateCeiling:
    """A token bucket per prefix: at most ``rate`` requests/s on average, bursts of ``burst``.

    ``acquire(url, now)`` takes one token for ``url``'s prefix and returns how long the caller
    must wait before sending (0 when a token is there); it never refuses. Thread-safe. The
    counters (``granted``, ``first``, ``last``) are the ceiling's own accounting: requests let
    through per prefix, and the times the first and the last were scheduled to go out.
    """

    def __init__(self, rate: float = DEFAULT_RATE, burst: float | None = None) -> None:
        if not rate > 0:
            raise ValueError(f"rate={rate!r}: give requests per second, a positive number")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1.0, rate / 10))
        self._tokens: dict[str, tuple[float, float]] = {}  # prefix -> (tokens, at time)
        self.granted: dict[str, int] = {}
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self._lock = threading.Lock()

    def acquire(self, url: str, now: float) -> float:
        """Seconds to wait before sending one request to ``url`` (a token is reserved)."""
        key = _prefix(url)
        with self._lock:
            tokens, at = self._tokens.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate) - 1.0
            self._tokens[key] = (tokens, now)
            wait = 0.0 if tokens >= 0 else -tokens / self.rate
            self.granted[key] = self.granted.get(key, 0) + 1
            self.first.setdefault(key, now + wait)
            self.last[key] = now + wait
            return wait

    def scheduled_rate(self, url: str) -> float:
        """Requests/s the ceiling scheduled for ``url``'s prefix over its whole run, not
        counting the first burst (which the bucket lets through at once by design)."""
        key = _prefix(url)
        with self._lock:
            n = self.granted.get(key, 0) - self.burst
            span = self.last.get(key, 0.0) - self.first.get(key, 0.0)
        return n / span if n > 0 and span > 0 else 0.0


_THROTTLE_WORDS = (
    "slowdown",
    "slow down",
    "reduce your request rate",
    "toomanyrequests",
    "throttl",
    "rate exceeded",
)
_SERVER_WORDS = ("internalerror", "serviceunavailable", "internal error", "bad gateway")
_RETRY_TYPES = frozenset(
    {
        "ConnectionError",
        "ConnectionResetError",
        "ConnectionClosedError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ClientOSError",
        "IncompleteRead",
        "ProtocolError",
        "ResponseStreamingError",
        "ReadTimeoutError",
        "TimeoutError",
        "EndpointConnectionError",
        "BrokenPipeError",
        "ShortBody",
    }
)


class ShortBody(OSError):
    """A response that ended before the bytes it announced (a truncated body): retried."""


def _status(exc: BaseException) -> int | None:
    """The HTTP status a storage library's exception carries, if any."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(code, int):
            return code
    for name in ("status", "status_code", "code"):
        code = getattr(exc, name, None)
        if isinstance(code, int) and 100 <= code < 600:
            return code
    return None


def classify(exc: BaseException) -> str:
    """``THROTTLED`` (503 SlowDown, 429: retry, and count it as the store pushing back),
    ``RETRY`` (another 5xx, a reset or dropped connection, a short body, a timeout: retry) or
    ``FINAL`` (not found, no permission, a bad request, a refused connection: another attempt
    cannot help). Looks at
    the exception and its causes: the status a library's error carries, its type, its words."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    final = (FileNotFoundError, PermissionError, IsADirectoryError, StokerError)
    if isinstance(exc, final) or any(isinstance(e, ConnectionRefusedError) for e in chain):
        return FINAL  # nothing listens there (a wrong endpoint): retrying cannot help
    statuses = {code for e in chain if (code := _status(e)) is not None}
    text = " ".join(f"{type(e).__name__} {e}" for e in chain).lower()
    if statuses & {429, 503} or any(word in text for word in _THROTTLE_WORDS):
        return THROTTLED
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    if any(500 <= code < 600 for code in statuses) or names & _RETRY_TYPES:
        return RETRY
    if any(word in text for word in _SERVER_WORDS):
        return RETRY
    return FINAL
