"""The cluster settings (``Loader(cluster=..., cluster_workers=..., cluster_transport=...,
cluster_listen=..., cluster_connect_timeout=...)``), checked when the Loader is made: a leaf of
``workers/`` (it imports only ``address`` and ``errors``), so the loader's options, the trainer's
side (``cluster``) and the node's start (``nodestart``, ``nodes``) all read one frozen
:class:`ClusterOptions` without importing each other. Nothing here starts, reaches or imports
Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from . import address as address_mod

__all__ = ["CONNECT_TIMEOUT_S", "TRANSPORTS", "ClusterOptions", "cluster_options"]

TRANSPORTS = ("tcp", "object_store")
CONNECT_TIMEOUT_S = 5.0  # cluster_connect_timeout=None


@dataclass(frozen=True)
class ClusterOptions:
    """``Loader(cluster=..., cluster_workers=..., cluster_transport=..., cluster_listen=...,
    cluster_connect_timeout=...)``."""

    address: str  # "auto" (the running cluster) or a Ray address (``address.parse``)
    cores: int | None  # None: every CPU of the nodes other than the trainer's
    transport: str
    listen: str | None  # the address this trainer listens on for its nodes; None: its node IP
    connect_timeout: float = CONNECT_TIMEOUT_S  # seconds to reach the cluster's address


def cluster_options(
    cluster: Any, cores: Any, transport: Any, listen: Any, connect_timeout: Any = None
) -> ClusterOptions | None:
    """Validate the cluster arguments (nothing is started, reached or imported)."""
    if cluster is None:
        if cores != "auto" or transport != "tcp" or listen is not None or connect_timeout:
            raise ConfigError(
                "cluster_workers, cluster_transport, cluster_listen and "
                "cluster_connect_timeout need cluster='ray' (or a Ray address)"
            )
        return None
    if not isinstance(cluster, str) or not cluster:
        raise ConfigError(f"cluster={cluster!r}: use {address_mod.FORMS}")
    ray_address = address_mod.parse(cluster)
    wait = CONNECT_TIMEOUT_S if connect_timeout is None else connect_timeout
    if isinstance(wait, bool) or not isinstance(wait, int | float | np.number) or not wait > 0:
        raise ConfigError(
            f"cluster_connect_timeout={connect_timeout!r}: give the seconds to wait for the "
            f"cluster's address to answer when the Loader is made, a number > 0 (None: "
            f"{CONNECT_TIMEOUT_S:g})"
        )
    if isinstance(cores, bool) or not (
        cores == "auto" or isinstance(cores, int | np.integer) and cores > 0
    ):
        raise ConfigError(
            f"cluster_workers={cores!r}: give a number of CPU cores on other nodes "
            "(> 0), or 'auto' for all of them"
        )
    if transport not in TRANSPORTS:
        raise ConfigError(
            f"cluster_transport={transport!r}: use 'tcp' (batches stream straight "
            "into the ring) or 'object_store' (through Ray, where only Ray's ports "
            "are open)"
        )
    if listen is not None and (not isinstance(listen, str) or not listen):
        raise ConfigError(
            f"cluster_listen={listen!r}: give this trainer's IP address that the "
            "nodes can reach, or None for its Ray node IP"
        )
    return ClusterOptions(
        ray_address, None if cores == "auto" else int(cores), str(transport), listen, float(wait)
    )
