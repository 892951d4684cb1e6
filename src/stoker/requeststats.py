"""What requests to remote storage cost, as ``stats()`` shows it (from ``sources.fetch``'s
``RequestCounts``, added up over every worker's batch reports)."""

from __future__ import annotations

from typing import Any

from .sources.fetch import RequestCounts


def request_figures(
    counts: RequestCounts, images: int, seconds: float, decoded_bytes: int
) -> dict[str, Any]:
    """The figures of ``counts`` for ``images`` samples loaded in ``seconds``, whose encoded
    bytes (``decoded_bytes``) went to the decoder; {} when no request was made."""
    if not counts.gets and not counts.failed:
        return {}
    per_s = 1.0 / seconds if seconds > 0 else 0.0
    return {
        "gets": counts.gets,
        "gets_per_s": counts.gets * per_s,
        "bytes": counts.nbytes,
        "bytes_per_s": counts.nbytes * per_s,
        "latency_median_ms": counts.latency(0.5) * 1000,
        "latency_p99_ms": counts.latency(0.99) * 1000,
        "retries": counts.retries,
        "throttled": counts.throttled,
        "failed": counts.failed,
        "gets_per_image": counts.gets / images if images else 0.0,
        "fetched_per_decoded": counts.nbytes / decoded_bytes if decoded_bytes else 0.0,
    }


def request_lines(figures: dict[str, Any], storage_bound: bool) -> list[str]:
    """Report lines for ``request_figures``' output ([] when empty)."""
    if not figures:
        return []
    f = figures
    lines = [
        f"  storage requests: {f['gets']:,} GETs ({f['gets_per_s']:,.0f}/s, "
        f"{f['gets_per_image']:.3f} per image), {f['bytes'] / 1e6:,.1f} MB "
        f"({f['bytes_per_s'] / 1e6:,.1f} MB/s, {f['fetched_per_decoded']:.2f} x the bytes "
        f"decoded); latency median {f['latency_median_ms']:.1f} ms, p99 "
        f"{f['latency_p99_ms']:.1f} ms; {f['retries']:,} retries, {f['throttled']:,} "
        f"throttled (503 SlowDown / 429), {f['failed']:,} failed",
    ]
    if storage_bound:
        lines.append(
            "  hint: storage is the bottleneck: the workers mostly wait for requests; raise "
            "read_ahead, convert to shards (fewer, larger requests), or read from a store "
            "closer to the machine"
        )
    if f["throttled"]:
        lines.append(
            "  hint: the store throttled requests: lower Loader(request_rate=...) below its "
            "limit, or spread the data over more prefixes"
        )
    return lines
