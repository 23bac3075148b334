"""Three hosts in network namespaces on one machine, for tests and benchmarks: hosts a, b and c,
each joined by a veth pair to a hub namespace, where either the kernel's bridge or a user-space
delay bridge (``delay_bridge.py`` here: this kernel has no ``tc netem``) joins the links. With a
``rate``, ``tc tbf`` limits each link both ways (on both ends of its veth pair). Names are
random-tagged; ``Hosts.close`` removes every namespace, link and bridge process, and so does
leaving the ``with`` block, exceptions and Ctrl-C included.

    with Hosts(rtt_ms=1.0, rate="1gbit") as hosts:
        hosts.probe("a", "c", "rtt")     # netprobe.py here: TCP connect and echo times
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from roles.protocol.topology import reserved_ports

ZBUS_PORTS = reserved_ports()   # the default base_port's
HOSTS = {"a": "10.77.0.1", "b": "10.77.0.2", "c": "10.77.0.3"}
BRIDGE = Path(__file__).resolve().parent / "delay_bridge.py"
PROBE = Path(__file__).resolve().parent / "netprobe.py"
MTU = 65535  # one frame per (GSO-sized) write: fewer frames for the delay bridge


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def namespaces_allowed() -> str:
    """'' when this process may make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    probe = f"zbprobe{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"ip netns add is not permitted here: {getattr(exc, 'stderr', b'')!r}"
    ip("netns", "del", probe)
    return ""


class Hosts:
    """``rtt_ms`` None: the kernel's bridge; a number (0 included): the delay bridge with a
    one-way delay of rtt_ms / 2. ``mtu`` None keeps veth's 1,500."""

    def __init__(self, rtt_ms: float | None = None, rate: str | None = None,
                 mtu: int | None = None, workdir: Path | None = None):
        self.tag = secrets.token_hex(2)
        self.names = {h: f"zb{self.tag}{h}" for h in HOSTS} | {"hub": f"zb{self.tag}hub"}
        self.address = dict(HOSTS)
        self.rtt_ms, self.rate, self.mtu = rtt_ms, rate, mtu
        self.workdir = workdir
        self.bridge: subprocess.Popen | None = None
        self.bridge_stats: dict = {}
        self.built = False
        self.stats_path = Path("/nonexistent")

    def __enter__(self) -> Hosts:
        try:
            if not self.built:
                self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def hub_port(self, host: str) -> str:
        return f"zb{self.tag}{host}o"

    def build(self) -> None:
        self.built = True
        for ns in self.names.values():
            ip("netns", "add", ns)
        hub = self.names["hub"]
        if self.rtt_ms is None:
            ip("-n", hub, "link", "add", "br0", "type", "bridge")
            ip("-n", hub, "link", "set", "br0", "up")
        for h, address in HOSTS.items():
            outside, inside = self.hub_port(h), f"zb{self.tag}{h}i"
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            ip("link", "set", outside, "netns", hub)
            ip("link", "set", inside, "netns", self.names[h])
            if self.mtu:
                ip("-n", hub, "link", "set", outside, "mtu", str(self.mtu))
                ip("-n", self.names[h], "link", "set", inside, "mtu", str(self.mtu))
            if self.rtt_ms is None:
                ip("-n", hub, "link", "set", outside, "master", "br0")
            ip("-n", hub, "link", "set", outside, "up")
            ip("-n", self.names[h], "addr", "add", f"{address}/24", "dev", inside)
            ip("-n", self.names[h], "link", "set", inside, "up")
            ip("-n", self.names[h], "link", "set", "lo", "up")
            # as docs/operations.md ("Ports") has a host configured: no outgoing connection
            # takes a port a role binds as its local port (a restarted role could not bind it)
            self.run_in(self.names[h], ["sysctl", "-q", "-w",
                                        f"net.ipv4.ip_local_reserved_ports={ZBUS_PORTS}"])
            if self.rate:
                for ns, dev in ((hub, outside), (self.names[h], inside)):
                    self.run_in(ns, ["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate",
                                     self.rate, "burst", "1mb", "latency", "20ms"])
        if self.rtt_ms is not None:
            self.start_bridge()

    def start_bridge(self) -> None:
        base = self.workdir or Path("/tmp")
        ready = base / f"bridge-{self.tag}.ready"
        self.stats_path = base / f"bridge-{self.tag}.json"
        ready.unlink(missing_ok=True)
        self.bridge = subprocess.Popen(
            ["ip", "netns", "exec", self.names["hub"], sys.executable, str(BRIDGE),
             "--delay-ms", str((self.rtt_ms or 0.0) / 2), "--ready", str(ready),
             "--stats", str(self.stats_path), *(self.hub_port(h) for h in HOSTS)],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while not ready.exists():
            if self.bridge.poll() is not None or time.monotonic() > deadline:
                err = self.bridge.stderr.read().decode() if self.bridge.stderr else ""
                raise RuntimeError(f"the delay bridge did not start: {err}")
            time.sleep(0.05)
        ready.unlink()

    def run_in(self, ns: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, *argv], check=True,
                              capture_output=True, timeout=kwargs.pop("timeout", 30), **kwargs)

    def run(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """``argv`` in host ``host``'s namespace."""
        return self.run_in(self.names[host], argv, **kwargs)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], *argv],
                                start_new_session=True, **kwargs)

    def probe(self, src: str, dst: str, *args: str, port: int = 47999) -> dict:
        """``roles/testbed/netprobe.py`` from host ``src`` against its server on host ``dst``:
        ``probe("a", "c", "rtt")``, ``probe("a", "c", "stream", "3")``."""
        server = self.popen(dst, [sys.executable, str(PROBE), "serve", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            assert server.stdout is not None and server.stdout.readline() == b"ready\n"
            out = self.run(src, [sys.executable, str(PROBE), args[0], self.address[dst],
                                 str(port), *args[1:]], timeout=120)
            return json.loads(out.stdout)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)

    def link_bytes(self) -> dict[str, dict[str, int]]:
        """Bytes each host's link carried so far, as the hub's ports count them: ``up`` from
        the host, ``down`` to it."""
        out = json.loads(ip("-n", self.names["hub"], "-s", "-j", "link", "show").stdout)
        by_name = {link["ifname"]: link["stats64"] for link in out}
        return {h: {"up": by_name[self.hub_port(h)]["rx"]["bytes"],
                    "down": by_name[self.hub_port(h)]["tx"]["bytes"]} for h in HOSTS
                if self.hub_port(h) in by_name}

    def close(self) -> None:
        if self.bridge is not None:
            if self.bridge.poll() is None:
                os.killpg(self.bridge.pid, signal.SIGTERM)
                try:
                    self.bridge.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.bridge.pid, signal.SIGKILL)
                    self.bridge.wait(timeout=10)
            if self.stats_path.exists():
                self.bridge_stats = json.loads(self.stats_path.read_bytes())
                self.stats_path.unlink()
            self.bridge = None
        for ns in self.names.values():  # removing a namespace removes its links
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for h in HOSTS:  # and a pair left behind by a failed move, if any
            subprocess.run(["ip", "link", "del", self.hub_port(h)], capture_output=True,
                           timeout=30)
