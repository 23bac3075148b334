"""The cluster's topology: where every role listens, the ``[cluster]`` section of a job
resolved to ZeroMQ endpoints (it is the transport's ``zbus.endpoints.BusConfig``).

By default every endpoint is ``tcp://<host>:<base_port + offset>``, or, with ``node_host`` set (a
pattern such as ``zbus-{node}.zbus``: each node at a DNS name of its own, as a Kubernetes
StatefulSet's pods behind a headless Service are), ``tcp://<node_host with {node} = the node
that binds it>:<base_port + offset>``; ``endpoints`` overrides any of them one by one (a
``tcp://`` address on another host, or an ``ipc://`` path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zbus.endpoints import SCHEMES, is_local

if TYPE_CHECKING:
    from zbus.endpoints import BusConfig

# Offsets from base_port of the endpoints that roles bind.
FIXED_ENDPOINTS = {
    "control": 0,          # control ROUTER: Hello, heartbeats and reports from every node
    "control_pub": 1,      # control PUB: lifecycle commands
    "samples": 2,          # feeder PUSH: the sample queue
    "ledger": 3,           # feeder ROUTER: acknowledgements from workers
    "aggregator": 4,       # aggregator ROUTER: contributions, step gradients, weight requests
    "aggregator_pub": 5,   # aggregator PUB: new dense weights
    "control_req": 6,      # control ROUTER: requests of operators (zbus-ctl, the console)
    "status": 7,           # control PUB: the job's status for consoles (nodes never see it)
    "dense": 8,            # aggregator PUB: dense weights for serving processes
}
PS_OFFSET = 10             # ps shard i binds base_port + 10 + i
AGGREGATOR_OFFSET = 280    # aggregator i >= 1 (hierarchical aggregation) binds 280 + i
MAX_AGGREGATORS = 16
GROUP_OFFSET = 300         # member p of model-parallel group g binds 300 + g * parts + p
MAX_PARTS = 8
FEEDER_OFFSET = 2400       # feeder i >= 1 binds samples-i at 2400 + 2i, ledger-i at 2401 + 2i
MAX_FEEDERS = 16
ROWS_OFFSET = 2440         # shard i's PUB of changed rows for serving processes (rows-i)
MAX_SHARDS = 255
DEFAULT_BASE_PORT = 47100


def reserved_ports(base_port: int = DEFAULT_BASE_PORT) -> str:
    """The ports a job's roles may bind, as ``net.ipv4.ip_local_reserved_ports`` takes them:
    reserved, no outgoing connection takes one as its local port (docs/operations.md,
    "Ports")."""
    return f"{base_port}-{base_port + ROWS_OFFSET + MAX_SHARDS - 1}"


@dataclass(frozen=True)
class ClusterConfig:
    """Counts of processes and the endpoints they bind and connect to."""

    workers: int = field(default=2, metadata={"min": 1, "max": 255, "doc": (
        "worker processes the job starts with (more may join)")})
    shards: int = field(default=2, metadata={"min": 1, "max": MAX_SHARDS, "doc": "ps shards"})
    aggregators: int = field(default=1, metadata={"min": 1, "max": MAX_AGGREGATORS, "doc": (
        "aggregator processes; more than one: hierarchical aggregation")})
    parts: int = field(default=1, metadata={"min": 1, "max": MAX_PARTS, "doc": (
        "how many parts the dense network is split into: more than one makes each worker "
        "lead a model-parallel group of that many processes, itself and `parts − 1` "
        "members (not with sync `step`)")})
    feeders: int = field(default=1, metadata={"min": 1, "max": MAX_FEEDERS, "doc": (
        "feeder processes, each reading its parts of the data (not with sync `round`)")})
    host: str = field(default="127.0.0.1", metadata={"doc": "address of the default endpoints"})
    node_host: str = field(default="", metadata={"doc": (
        "each node's own host for the default endpoints instead of `host`: a pattern with "
        "`{node}`, the id of the node that binds the endpoint (`zbus-{node}.zbus`: "
        "`zbus-ps-3.zbus` for shard 3's; `control-0`, `feeder-<i>`, `aggregator-<i>`, "
        "`ps-<i>`, `worker-<i>`, `member-<i>`), e.g. a Kubernetes StatefulSet's pod names; "
        "a role then binds every interface (`*`) unless `ZBUS_BIND_INTERFACE` says which")})
    base_port: int = field(default=DEFAULT_BASE_PORT, metadata={"min": 1024, "max": 65000, "doc": (
        "first port of the default endpoints (each endpoint at a fixed offset from it)")})
    endpoints: dict[str, str] = field(default_factory=dict, metadata={"doc": (
        "the `[cluster.endpoints]` table: per-endpoint address overrides, `tcp://` or "
        "`ipc://`, for `control`, `control_pub`, `control_req`, `status`, `samples`, "
        "`ledger`, `samples-<i>`, `ledger-<i>`, `aggregator`, `aggregator_pub`, "
        "`aggregator-<i>`, `ps-<i>`, `group-<g>-<p>`, and the serving PUBs `dense` and "
        "`rows-<i>`")})
    heartbeat_s: float = field(default=1.0, metadata={"min": 0.05, "max": 60.0, "doc": (
        "heartbeat interval, and the longest a role's poll waits")})
    status_s: float = field(default=0.25, metadata={"min": 0.05, "max": 10.0, "doc": (
        "control publishes its status for consoles this often")})
    node_timeout_s: float = field(default=10.0, metadata={"min": 0.5, "doc": (
        "a node silent this long is failed: a worker's batches go to the others, a group "
        "member ends its group, a shard, a feeder or an aggregator is waited for (up to "
        "`recovery_timeout_s`) or replaced as the recovery design says, else the job fails")})
    start_timeout_s: float = field(default=180.0, metadata={"min": 1.0, "doc": (
        "every node must be ready within this")})
    orphan_timeout_s: float = field(default=120.0, metadata={"min": 1.0, "doc": (
        "a node that hears nothing from control this long exits (a killed control must be "
        "resumed within it)")})
    max_message_mb: float = field(default=256.0, metadata={"min": 0.01, "doc": (
        "larger incoming messages are refused by ZeroMQ (the connection that carried one is "
        "dropped; the sender's socket connects again)")})
    interfaces: list[str] = field(default_factory=list, metadata={"doc": (
        "network interfaces counted for utilisation; empty: loopback when the whole cluster "
        "is on one host, else every interface but loopback")})
    link_mbps: float = field(default=10_000.0, metadata={"min": 1.0, "doc": (
        "capacity (Mbit/s) of an interface whose speed psutil does not report")})
    # CURVE authentication and encryption (zbus.security): on, off, or auto (on as soon as
    # some endpoint is not on this host); the key pairs and the allow-list live in keys_dir
    curve: str = field(default="auto", metadata={"choices": ("auto", "on", "off"), "doc": (
        "CURVE authentication and encryption: `auto` (on as soon as an endpoint is not on "
        "this host), `on`, `off`")})
    keys_dir: str = field(default="keys", metadata={"doc": (
        "the key pairs and `allowed/` made by `zbus-keys` (relative to where a role starts)")})

    def __post_init__(self) -> None:
        if self.node_host:
            bare = self.node_host.replace("{node}", "")
            if "{node}" not in self.node_host or "{" in bare or "}" in bare:
                raise ValueError(f"[cluster] node_host = {self.node_host!r} must hold {{node}} "
                                 "(the node's id: zbus-{node}.zbus), and no other {...}")
            if "://" in bare or "/" in bare:
                raise ValueError(f"[cluster] node_host = {self.node_host!r} is a host name, "
                                 "without a scheme (no tcp://) or a path")
            if ":" in bare:
                raise ValueError(f"[cluster] node_host = {self.node_host!r} is a host name "
                                 "without a port (each endpoint's port is base_port + its "
                                 "offset)")
        names = self.endpoint_names()
        for name, address in self.endpoints.items():
            if name not in names:
                raise ValueError(f"[cluster.endpoints] has unknown endpoint {name!r}; "
                                 f"known: {', '.join(sorted(names))}")
            if not address.startswith(SCHEMES):
                raise ValueError(f"[cluster.endpoints] {name} = {address!r} must start with "
                                 f"one of {', '.join(SCHEMES)}")

    def endpoint_names(self) -> list[str]:
        return [*FIXED_ENDPOINTS, *(f"ps-{i}" for i in range(self.shards)),
                *(f"rows-{i}" for i in range(self.shards)),
                *(f"{kind}-{i}" for i in range(1, self.feeders) for kind in ("samples", "ledger")),
                *(f"aggregator-{i}" for i in range(1, self.aggregators)),
                *(self.group_endpoint_name(g, p) for g in range(self.workers)
                  for p in range(self.parts) if self.parts > 1)]

    @staticmethod
    def group_endpoint_name(group: int, member: int) -> str:
        """Where member ``member`` of model-parallel group ``group`` listens (member 0 is the
        group's leader, worker ``group``; member p >= 1 is node
        ``member-<group * (parts - 1) + p - 1>``)."""
        return f"group-{group}-{member}"

    @staticmethod
    def feeder_endpoint_name(kind: str, feeder: int) -> str:
        """Where feeder ``feeder`` binds its sample queue (``kind`` samples) or its ledger:
        feeder 0 at ``samples`` / ``ledger``, feeder i >= 1 at ``samples-i`` / ``ledger-i``."""
        return kind if feeder == 0 else f"{kind}-{feeder}"

    def member_position(self, index: int) -> tuple[int, int]:
        """(group, member) of node ``member-<index>``."""
        return divmod(index, self.parts - 1)[0], index % (self.parts - 1) + 1

    def member_index(self, group: int, member: int) -> int:
        """The index of the node that is member ``member`` >= 1 of group ``group``."""
        return group * (self.parts - 1) + member - 1

    def endpoint(self, name: str) -> str:
        if name in self.endpoints:
            return self.endpoints[name]
        if name in FIXED_ENDPOINTS:
            offset = FIXED_ENDPOINTS[name]
        elif name.startswith("ps-") and name[3:].isdigit() and int(name[3:]) < self.shards:
            offset = PS_OFFSET + int(name[3:])
        elif name.startswith("rows-") and name[5:].isdigit() and int(name[5:]) < self.shards:
            offset = ROWS_OFFSET + int(name[5:])
        elif (name.startswith(("samples-", "ledger-")) and name.split("-")[1].isdigit()
              and 0 < int(name.split("-")[1]) < self.feeders):
            offset = FEEDER_OFFSET + 2 * int(name.split("-")[1]) + name.startswith("ledger")
        elif (name.startswith("aggregator-") and name[11:].isdigit()
              and 0 < int(name[11:]) < self.aggregators):
            offset = AGGREGATOR_OFFSET + int(name[11:])
        elif (name.startswith("group-") and self.parts > 1 and name.count("-") == 2
              and name[6:].replace("-", "").isdigit()
              and int(name.rsplit("-", 1)[1]) < self.parts):
            group, member = (int(x) for x in name[6:].split("-"))
            offset = GROUP_OFFSET + group * self.parts + member
        else:
            raise KeyError(f"no endpoint {name!r}")
        host = self.node_host.replace("{node}", self.endpoint_owner(name)) if self.node_host \
            else self.host
        return f"tcp://{host}:{self.base_port + offset}"

    def aggregator_endpoint(self, index: int) -> str:
        """Where aggregator ``index`` listens: the root (0) at ``aggregator``."""
        return self.endpoint("aggregator" if index == 0 else f"aggregator-{index}")

    def group_of(self, worker_index: int) -> int:
        """The aggregator that combines this worker's contributions (hierarchical)."""
        return worker_index % self.aggregators

    def single_host(self) -> bool:
        """Every endpoint is on this host (loopback TCP, ipc or inproc); a host name other
        than ``localhost`` (``node_host``) is not."""
        return all(is_local(self.endpoint(name)) for name in self.endpoint_names())

    def curve_enabled(self) -> bool:
        return self.curve == "on" or (self.curve == "auto" and not self.single_host())

    def endpoint_owner(self, name: str) -> str:
        """The node that binds endpoint ``name`` (whose public key a client checks)."""
        if name in ("control", "control_pub", "control_req", "status"):
            return "control-0"
        if name in ("aggregator", "aggregator_pub", "dense"):
            return "aggregator-0"
        if name in ("samples", "ledger"):
            return "feeder-0"
        kind, _, rest = name.partition("-")
        if kind in ("samples", "ledger"):
            return f"feeder-{rest}"
        if kind in ("ps", "aggregator"):
            return name
        if kind == "rows":
            return f"ps-{rest}"
        if kind == "group":
            group, member = (int(x) for x in rest.split("-"))
            return f"worker-{group}" if member == 0 else \
                f"member-{self.member_index(group, member)}"
        raise KeyError(f"no endpoint {name!r}")

    @property
    def max_message_bytes(self) -> int:
        return int(self.max_message_mb * 1024 * 1024)

    def expected_nodes(self) -> list[str]:
        """Node ids control waits for before training starts."""
        return [*(f"feeder-{i}" for i in range(self.feeders)),
                *(f"aggregator-{i}" for i in range(self.aggregators)),
                *(f"ps-{i}" for i in range(self.shards)),
                *(f"worker-{i}" for i in range(self.workers)),
                *(f"member-{i}" for i in range(self.workers * (self.parts - 1)))]


if TYPE_CHECKING:
    def _is_bus_config(cluster: ClusterConfig) -> BusConfig:
        return cluster  # the type check fails here when ClusterConfig stops being a BusConfig
