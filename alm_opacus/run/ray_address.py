"""The address of a Ray cluster (``--ray-address``, ``RAY_ADDRESS``), checked before a run
starts.

``ray.init`` takes any string: a host that cannot exist (``256.1.1.1``), a port outside
1..65535 or a cluster that is not there each left the driver in ``ray.init`` for minutes,
retrying. Here a malformed address is refused at once, naming it, and a well-formed one must
accept a TCP connection within a bounded time (:data:`DEFAULT_CONNECT_TIMEOUT_S`) before Ray
is asked to connect to it. Nothing here imports Ray.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import socket
from dataclasses import dataclass

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_S",
    "RayAddress",
    "check_connect_timeout",
    "check_reachable",
    "cluster_address",
    "parse_ray_address",
]

#: Seconds a Ray cluster's head has to accept a connection (``--ray-connect-timeout``).
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Ray Client's scheme (``ray://HOST:PORT``), which ``ray.init`` also accepts.
CLIENT_SCHEME = "ray://"
#: Addresses that name no cluster: Ray's own words for "the cluster ``ray start`` started on
#: this machine" (``auto``) and "a new local one" (``local``, what no address means here).
KEYWORDS = ("auto", "local")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_EXPECTED = "expected HOST:PORT (an IPv4 address, [IPv6] or host name, and a port 1..65535)"


@dataclass(frozen=True)
class RayAddress:
    """A well-formed cluster address (``str()`` gives it back as Ray takes it)."""

    host: str
    port: int
    client: bool = False  # ``ray://``: Ray Client

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{CLIENT_SCHEME if self.client else ''}{host}:{self.port}"


def parse_ray_address(text: str, *, source: str = "--ray-address") -> RayAddress | str | None:
    """Check a Ray cluster address without connecting to it.

    Args:
        text: ``HOST:PORT``, ``ray://HOST:PORT``, ``auto`` or ``local``.
        source: where it came from, for the message (a flag or an environment variable).

    Returns:
        The address; ``"auto"`` for Ray to find the cluster started on this machine; ``None``
        for ``local`` or an empty value (a new local cluster).

    Raises:
        ValueError: naming ``source`` and the value, for a malformed host or port.
    """
    value = text.strip()
    if not value or value == "local":
        return None
    if value == "auto":
        return value

    def bad(why: str) -> ValueError:
        return ValueError(f"{source}={text!r}: {why}")

    client = value.startswith(CLIENT_SCHEME)
    rest = value[len(CLIENT_SCHEME) :] if client else value
    if "://" in rest:
        raise bad(f"unknown scheme: {_EXPECTED}, or ray://HOST:PORT")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host:
        raise bad(f"no {'host' if sep else 'port'}: {_EXPECTED}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise bad(f"port {port_text!r} is not a number in 1..65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise bad(f"{host} is not an IPv6 address: {_EXPECTED}") from None
        host = host[1:-1]
    elif re.fullmatch(r"[0-9.]+", host):
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            raise bad(
                f"{host} is not an IPv4 address (four numbers 0..255 joined by dots)"
            ) from None
    else:
        labels = host.split(".")
        if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
            raise bad(f"{host!r} is not a host name: {_EXPECTED}")
        return RayAddress(host=host, port=int(port_text), client=client)
    if ip.is_unspecified or ip.is_multicast:
        raise bad(f"{host} is not the address of a machine: expected the head node's address")
    return RayAddress(host=host, port=int(port_text), client=client)


def check_connect_timeout(seconds: float, *, source: str = "--ray-connect-timeout") -> float:
    """``seconds`` as a float, when it is a positive finite number of seconds.

    Raises:
        ValueError: naming ``source`` and the value, otherwise.
    """
    value = float(seconds)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{source}={seconds!r}: expected a positive number of seconds")
    return value


def check_reachable(address: RayAddress, *, timeout: float, source: str = "--ray-address") -> None:
    """Refuse a cluster whose head does not accept a TCP connection within ``timeout`` s.

    Ray itself would retry for minutes; this one connection attempt is bounded.

    Raises:
        ValueError: naming ``source`` and the address: the host is unknown, the connection
            was refused, or no answer came within ``timeout`` seconds.
    """
    where = f"{source}={str(address)!r}"
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            pass
    except TimeoutError:
        raise ValueError(
            f"{where}: no answer from a Ray cluster within {timeout:g} s (is `ray start "
            "--head` running there, and its port open to this machine? A slow network: "
            "raise --ray-connect-timeout)"
        ) from None
    except socket.gaierror as exc:
        raise ValueError(f"{where}: unknown host {address.host!r} ({exc.strerror})") from None
    except OSError as exc:
        raise ValueError(
            f"{where}: cannot reach a Ray cluster there ({exc.strerror or exc}); start one "
            "with `ray start --head`, or leave out the address for a local cluster"
        ) from None


def cluster_address(
    address: str | None,
    *,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    flag: str = "address",
) -> str | None:
    """The address ``ray.init`` gets: ``address``, else ``$RAY_ADDRESS``; ``None`` for a new
    local cluster. A cluster address is checked for form and then for an answer within
    ``connect_timeout`` seconds, so a bad one fails in seconds, naming it (as ``flag``, or
    as ``RAY_ADDRESS``).

    Raises:
        ValueError: for a malformed address or timeout, or a cluster that does not answer.
    """
    source = flag if address else "RAY_ADDRESS"
    text = address or os.environ.get("RAY_ADDRESS") or ""
    timeout = check_connect_timeout(connect_timeout, source="connect_timeout")
    parsed = parse_ray_address(text, source=source)
    if parsed is None or isinstance(parsed, str):
        return parsed
    check_reachable(parsed, timeout=timeout, source=source)
    return str(parsed)
