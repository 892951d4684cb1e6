"""Loader(cluster=...): the address is checked when the Loader is made, within a bounded time.

None of these needs a Ray cluster: a wrong address is found before Ray is imported or joined."""

from __future__ import annotations

import gc
import socket
import warnings

import numpy as np
import pytest

import stoker
from stoker.errors import ClusterError

IMAGES = np.zeros((8, 16, 16, 3), np.uint8)


def _refused(address: str, error: type[Exception]) -> str:
    """The text of the ``error`` that ``Loader(cluster=address)`` raises; no socket is left
    open behind it (ResourceWarnings are recorded, then none may be there)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        with pytest.raises(error) as caught:
            stoker.Loader(IMAGES, batch_size=4, workers=0, cluster=address)
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)], address
    return str(caught.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1:1", "127.0.0.1:1 within cluster_connect_timeout=5 s (ConnectionRefusedError"),
        ("no-such-host.invalid:6379", "cannot resolve 'no-such-host.invalid'"),
    ],
)
def test_an_address_nobody_answers_is_a_cluster_error_when_the_loader_is_made(address, why):
    text = _refused(address, ClusterError)
    assert f"cluster={address!r}: no Ray cluster answered at" in text and why in text
    assert "ray start --head" in text and "cluster_connect_timeout=" in text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("address", ["not an address at all", "host:0", "ray://", "[zz]:6379"])
def test_a_string_that_is_no_address_is_a_config_error_naming_the_forms(address):
    text = _refused(address, stoker.ConfigError)
    assert f"cluster={address!r} is not a Ray address" in text
    assert "'HOST:PORT'" in text and "'ray://HOST:PORT'" in text and "'ray'" in text


@pytest.mark.timeout(60)
def test_an_address_that_answers_passes_and_the_wait_is_an_option():
    with socket.create_server(("127.0.0.1", 0)) as server:  # stands for the head's GCS port
        port = server.getsockname()[1]
        for address in (f"127.0.0.1:{port}", f"ray://localhost:{port}"):
            stoker.Loader(IMAGES, batch_size=4, cluster=address, cluster_connect_timeout=30).close()
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(stoker.ConfigError, match="cluster_connect_timeout="):
            stoker.Loader(IMAGES, batch_size=4, cluster="127.0.0.1:1", cluster_connect_timeout=bad)
    with pytest.raises(stoker.ConfigError, match="need cluster="):
        stoker.Loader(IMAGES, batch_size=4, cluster_connect_timeout=10)


@pytest.mark.timeout(60)
def test_ray_before_this_process_joined_checks_the_address_ray_would_join(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    text = _refused("ray", ClusterError)
    assert "cluster='ray': no Ray cluster answered at 127.0.0.1:1" in text
    monkeypatch.setenv("RAY_ADDRESS", "not an address")
    text = _refused("ray", stoker.ConfigError)
    assert "RAY_ADDRESS='not an address' is not a Ray address" in text
