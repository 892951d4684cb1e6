"""The fault proxy itself (``tests/faultproxy.py``), through boto3 against the moto server.

Each fault is checked with botocore's own retries off, so the client sees exactly what the
proxy sent: the S3 error code, a reset, a short body.
"""

from __future__ import annotations

import pytest

botocore = pytest.importorskip("botocore")

from faultproxy import FaultProxy, error_body  # noqa: E402


def test_error_body_is_s3s_slowdown_xml() -> None:
    body = error_body("503", "/bkt/key").decode()
    assert "<Code>SlowDown</Code>" in body and "<Resource>/bkt/key</Resource>" in body


@pytest.mark.timeout(120)
def test_the_proxy_forwards_counts_and_injects_each_fault(s3_server: object) -> None:
    from botocore.exceptions import ClientError, ConnectionClosedError, ResponseStreamingError

    bucket = s3_server.bucket()  # type: ignore[attr-defined]
    payload = bytes(range(256)) * 40
    s3_server.client().put_object(Bucket=bucket, Key="a/obj", Body=payload)  # type: ignore[attr-defined]
    with FaultProxy(s3_server.endpoint, latency=0.01, bandwidth=1e6) as proxy:  # type: ignore[attr-defined]
        from botocore.config import Config

        config = Config(retries={"total_max_attempts": 1}, read_timeout=20)
        client = s3_server.client(proxy.endpoint, config)  # type: ignore[attr-defined]
        got = client.get_object(Bucket=bucket, Key="a/obj", Range="bytes=10-19")  # type: ignore[attr-defined]
        assert got["Body"].read() == payload[10:20]
        assert proxy.gets("/a/obj") == 1 and proxy.bytes_sent == 10
        head = client.head_object(Bucket=bucket, Key="a/obj")  # type: ignore[attr-defined]
        assert head["ContentLength"] == len(payload)  # a HEAD tells the size, sends no body
        for kind, code in (("503", "SlowDown"), ("429", "TooManyRequests")):
            proxy.fail(kind, count=1, path="/a/obj")
            with pytest.raises(ClientError) as err:
                client.get_object(Bucket=bucket, Key="a/obj")  # type: ignore[attr-defined]
            assert err.value.response["Error"]["Code"] == code
        proxy.fail("reset")
        with pytest.raises(ConnectionClosedError):
            client.get_object(Bucket=bucket, Key="a/obj")  # type: ignore[attr-defined]
        proxy.fail("truncate")
        with pytest.raises(ResponseStreamingError):
            client.get_object(Bucket=bucket, Key="a/obj")["Body"].read()  # type: ignore[attr-defined]
        whole = client.get_object(Bucket=bucket, Key="a/obj")["Body"].read()  # type: ignore[attr-defined]
        assert whole == payload  # faults are spent: the next request is served whole
        stats = proxy.stats()
    assert stats["faults"] == {"503": 1, "429": 1, "reset": 1, "truncate": 1}
    assert proxy.gets("/a/obj") == 6 and stats["max_in_flight"] >= 1
    assert proxy.in_flight == 0  # stop() waited for every handler
