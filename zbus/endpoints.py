"""What the transport needs to know of a cluster: where the named endpoints are, who binds
each (for CURVE), and its timing. The application's topology (``roles.protocol.topology``)
provides it; the transport only relies on the two endpoints every zbus cluster has, control's
``control`` (ROUTER: Hello, heartbeats, reports) and ``control_pub`` (PUB: commands).

Node ids are ``<role>-<index>`` (``worker-3``); control is ``control-0``.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Protocol

CONTROL = "control"          # control's ROUTER endpoint
CONTROL_PUB = "control_pub"  # control's PUB endpoint
CONTROL_ID = "control-0"
SCHEMES = ("tcp://", "ipc://", "inproc://")


class BusConfig(Protocol):
    """The endpoints and timing a node runs on (structural: any object with these; the
    transport only reads them, so a frozen dataclass is one)."""

    @property
    def heartbeat_s(self) -> float: ...

    @property
    def orphan_timeout_s(self) -> float: ...

    @property
    def keys_dir(self) -> str: ...

    @property
    def max_message_bytes(self) -> int: ...

    def endpoint(self, name: str) -> str: ...

    def endpoint_names(self) -> list[str]: ...

    def endpoint_owner(self, name: str) -> str: ...

    def curve_enabled(self) -> bool: ...


def node_id(role: str, index: int) -> str:
    return f"{role}-{index}"


def node_index(node: str) -> int:
    """The index in a node id (``worker-3`` -> 3); -1 when it has none."""
    tail = node.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def tcp_host(address: str) -> str | None:
    """The host of a ``tcp://host:port`` address (None for ipc and inproc)."""
    if not address.startswith("tcp://"):
        return None
    return address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")


def is_local(address: str) -> bool:
    """The address is on this host (loopback TCP, ipc or inproc)."""
    host = tcp_host(address)
    return host is None or host in ("localhost", "::1") or host.startswith("127.")


def bind_address(address: str, interface: str = "") -> str:
    """Where a role binds the endpoint ``address``: on ``interface`` when one is given
    (``ZBUS_BIND_INTERFACE``: ``eth0``, ``*``), else as listed, but for a ``tcp://`` address by
    host name (``[cluster] node_host``: ``zbus-ps-3.zbus``), which ZeroMQ cannot bind in
    general: that binds every interface (``*``) on its port."""
    host = tcp_host(address)
    if host is None:
        return address
    port = address.rsplit(":", 1)[1]
    if interface:
        return f"tcp://{interface}:{port}"
    if host in ("*", "localhost"):
        return address
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"tcp://*:{port}"
    return address


def resolved(address: str) -> str:
    """``address`` with its host name looked up (the first address the resolver gives, as
    libzmq takes it); as it is for an IP address, ``*``, ipc or inproc, or a name that does
    not resolve now."""
    host = tcp_host(address)
    if host is None or host == "*":
        return address
    try:
        ipaddress.ip_address(host)
        return address
    except ValueError:
        pass
    port = address.rsplit(":", 1)[1]
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return address
    ip = str(found[0][4][0]) if found else ""
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}" if ip else address

