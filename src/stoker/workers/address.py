"""The ``cluster=`` address: parsed when the Loader is made, and the cluster reached within a
bounded time, so that a wrong address is a clear error at once, never a wait at the first batch.

What is reached is the TCP port Ray would join: the head's GCS port for ``HOST:PORT``, the Ray
Client server for ``ray://HOST:PORT``, and for ``"ray"``/``"auto"`` the cluster Ray itself would
find (``RAY_ADDRESS``, else the one ``ray start`` made on this machine), unless this process
has joined one already. Ray is imported only for that last case.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import sys
import threading
import time
from typing import Any

from ..errors import ClusterError, ConfigError

FORMS = (
    "'ray' (the Ray cluster this process joined, else the one Ray finds: RAY_ADDRESS or "
    "`ray start` on this machine), 'HOST:PORT' (the head's address, as `ray start --head` "
    "prints it: '10.0.0.1:6379') or 'ray://HOST:PORT' (Ray Client, usually port 10001)"
)
START = (
    "Start one (`ray start --head --port=6379` on the head, `ray start --address=HEAD:6379` on "
    "each decode node), check the address, or pass cluster_connect_timeout= to wait longer"
)
_LABEL = r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?"  # of a host name (or an IPv4 address)
_HOST = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")


def parse(cluster: str) -> str:
    """The address Ray is given for ``cluster=``: ``"auto"``, ``HOST:PORT`` or
    ``ray://HOST:PORT``; a ConfigError naming the forms for anything else."""
    if cluster in ("ray", "auto"):
        return "auto"
    rest = cluster[len("ray://") :] if cluster.startswith("ray://") else cluster
    if split(rest) is None:
        raise ConfigError(f"cluster={cluster!r} is not a Ray address: use {FORMS}")
    return cluster


def split(hostport: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``HOST:PORT`` (an IPv6 host in brackets), or None."""
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
    elif not _HOST.match(host) or len(host) > 253:
        return None
    return host, int(port)


def reach(address: str, timeout: float) -> None:
    """A ClusterError unless the cluster at ``address`` (as :func:`parse` gives it) accepts a
    TCP connection within ``timeout`` seconds."""
    target = _target(address)
    if target is None:
        return
    shown = "ray" if address == "auto" else address
    host, port = target
    deadline = time.monotonic() + timeout
    why = _connect(host, port, deadline)
    if why:
        raise ClusterError(
            f"cluster={shown!r}: no Ray cluster answered at {host}:{port} within "
            f"cluster_connect_timeout={timeout:g} s ({why}). {START}"
        )


def _target(address: str) -> tuple[str, int] | None:
    """The host and port to reach for ``address``; None when this process joined Ray."""
    if address != "auto":
        found = split(address[len("ray://") :] if address.startswith("ray://") else address)
        assert found is not None  # parse() let it through
        return found
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return None
    env = os.environ.get("RAY_ADDRESS", "")
    if env:
        found = split(env[len("ray://") :] if env.startswith("ray://") else env)
        if found is None:
            raise ConfigError(f"cluster='ray': RAY_ADDRESS={env!r} is not a Ray address ({FORMS})")
        return found
    return _found_by_ray()


def _found_by_ray() -> tuple[str, int]:
    """The cluster ``ray.init(address="auto")`` would join (Ray's own search)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError as exc:
        raise ConfigError(
            "cluster='ray' needs Ray: pip install 'stoker[ray]' (on every node)"
        ) from exc
    try:
        found = split(canonicalize_bootstrap_address_or_die("auto"))
    except ConnectionError as exc:
        raise ClusterError(f"cluster='ray': no Ray cluster to join ({exc}). {START}") from exc
    if found is None:
        raise ClusterError(f"cluster='ray': Ray found no address to join. {START}")
    return found


def _connect(host: str, port: int, deadline: float) -> str:
    """ "" once some address of ``host`` accepts a connection before ``deadline``; else why not."""
    infos, why = _resolve(host, port, deadline)
    for family, kind, proto, _, sockaddr in infos:
        left = deadline - time.monotonic()
        if left <= 0:
            return why or "timed out"
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(left)
                sock.connect(sockaddr)
            return ""
        except OSError as exc:
            why = f"{type(exc).__name__}: {exc.strerror or exc}"
    return why


def _resolve(host: str, port: int, deadline: float) -> tuple[list[Any], str]:
    """``getaddrinfo`` bounded by ``deadline`` (the resolver has no timeout of its own: it
    runs on a daemon thread that is left behind if it overruns)."""
    out: list[Any] = []
    failed: list[str] = []

    def run() -> None:
        try:
            out.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            failed.append(f"cannot resolve {host!r}: {exc.strerror or exc}")

    thread = threading.Thread(target=run, name="stoker-resolve", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        return [], f"resolving {host!r} did not finish"
    return out, failed[0] if failed else ""
