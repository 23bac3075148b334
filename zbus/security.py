"""Authentication and encryption of the bus with ZeroMQ CURVE.

Every node has a key pair, made by ``zbus-keys`` into the keys directory (``[cluster]
keys_dir``): ``<node>.key`` (its public key) and ``<node>.key_secret`` (both keys; keep it on
the node's host only). ``allowed/`` holds the public keys that may connect: the allow-list;
a keys directory without ``allowed/`` (a Kubernetes Secret mounted as a volume is flat) allows
every ``<name>.key`` in it (``zmq.auth`` reads ``*.key`` files, never ``*.key_secret``).
Operators (``zbus-console``, ``zbus-ctl``) use the key pair named ``console``.

When CURVE is on (``[cluster] curve``: ``on``, or ``auto`` and some endpoint is not on this
host), every socket a node binds is a CURVE server with the node's key pair, and a ZAP
authenticator in the node accepts a peer only if its public key is in ``allowed/``; every socket
a node connects is a CURVE client with the node's key pair, checking the server's public key
(the key of the node that binds that endpoint, ``BusConfig.endpoint_owner``). A peer
without an allowed key never completes the handshake, so nothing it sends reaches the role.
"""

from __future__ import annotations

import logging
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from zbus.endpoints import BusConfig
from zbus.sockets import Context, Socket

log = logging.getLogger(__name__)
OPERATOR = "console"  # the key pair of zbus-console and zbus-ctl
ALLOWED = "allowed"


class KeyFileError(OSError):
    """A key file is missing or unreadable: the node cannot join an authenticated bus."""


def load_pair(keys_dir: Path, name: str) -> tuple[bytes, bytes]:
    path = keys_dir / f"{name}.key_secret"
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"no key pair for {name} at {path} ({exc}); make the job's keys with "
                        "zbus-keys --job JOB") from None
    if secret is None:
        raise KeyFileError(f"{path} holds no secret key")
    return public, secret


def load_public(keys_dir: Path, name: str) -> bytes:
    path = keys_dir / f"{name}.key"
    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"no public key of {name} at {path} ({exc})") from None
    return public


class Curve:
    """One process's CURVE set-up: its key pair, the authenticator of the sockets it binds,
    and the server keys of the endpoints it connects to."""

    def __init__(self, ctx: Context, cluster: BusConfig, name: str,
                 authenticate: bool = True):
        self.keys_dir = Path(cluster.keys_dir)
        self.public, self.secret = load_pair(self.keys_dir, name)
        self.servers = {cluster.endpoint(n): cluster.endpoint_owner(n)
                        for n in cluster.endpoint_names()}
        self.auth: ThreadAuthenticator | None = None
        if authenticate:
            allowed = self.keys_dir / ALLOWED
            if not allowed.is_dir():  # a flat directory: its public keys are the allow-list
                allowed = self.keys_dir
            self.auth = ThreadAuthenticator(ctx, log=logging.getLogger("zbus.auth"))
            self.auth.start()
            self.auth.configure_curve(domain="*", location=str(allowed))

    def server(self, sock: Socket) -> None:
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True

    def client(self, sock: Socket, address: str) -> None:
        owner = self.servers.get(address)
        if owner is None:
            raise KeyFileError(f"{address} is not an endpoint of this job: no server key for it")
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = load_public(self.keys_dir, owner)

    def stop(self) -> None:
        if self.auth is not None:
            self.auth.stop()
            self.auth = None


def for_process(ctx: Context, cluster: BusConfig, name: str,
                authenticate: bool = True) -> Curve | None:
    """The process's CURVE set-up, or None when the bus runs in the clear."""
    if not cluster.curve_enabled():
        return None
    return Curve(ctx, cluster, name, authenticate)


def describe(curve: Curve | None) -> str:
    """Whether the bus is secured, for a start-up log line."""
    if curve is None:
        return "CURVE off: the bus is neither authenticated nor encrypted"
    return f"CURVE on: keys from {curve.keys_dir}"
