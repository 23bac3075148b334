"""CURVE: every socket authenticated and encrypted; a process without an allowed key cannot
connect, so it cannot inject a batch, a weight update or a command; operators authenticate
with their own key pair."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from console.app import ZbusConsole
from console.bus import Endpoints
from roles.protocol.datapath import Ack, BatchKeys, Lookup
from roles.protocol.dense_sync import Contribution
from roles.protocol.operator import ControlRequest
from roles.protocol.topology import ClusterConfig
from roles.tools.ctl import request
from roles.tools.keys import make_keys
from zbus.security import OPERATOR


def test_curve_is_on_by_default_as_soon_as_an_endpoint_leaves_the_host():
    assert not ClusterConfig().curve_enabled()
    assert not ClusterConfig(endpoints={"ps-0": "ipc:///tmp/x/ps-0"}).curve_enabled()
    away = {"ps-1": "tcp://10.0.0.4:47111"}
    assert ClusterConfig(endpoints=away).curve_enabled()
    assert not ClusterConfig(endpoints=away, curve="off").curve_enabled()
    assert ClusterConfig(curve="on").curve_enabled()


def test_every_endpoint_has_the_node_that_binds_it():
    c = ClusterConfig(workers=2, shards=2, aggregators=2, parts=3, feeders=2)
    owners = {n: c.endpoint_owner(n) for n in c.endpoint_names()}
    assert owners["control_req"] == owners["status"] == "control-0"
    assert owners["samples-1"] == owners["ledger-1"] == "feeder-1"
    assert owners["ps-1"] == "ps-1" and owners["aggregator-1"] == "aggregator-1"
    assert owners["group-1-0"] == "worker-1" and owners["group-1-2"] == "member-3"
    assert set(owners.values()) <= set(c.expected_nodes()) | {"control-0"}


def intruder(ctx: zmq.Context, endpoint: str, server_key: bytes | None) -> zmq.Socket:
    """A DEALER in the clear (``server_key`` None) or with CURVE and a key pair of its own.
    Its sends give up after a second: once the server turned its handshake away, the DEALER
    has no pipe to queue a message in (fresh CI hung on the second send for ever)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 1000)
    sock.setsockopt(zmq.IDENTITY, b"worker-0")  # it even claims to be a node
    if server_key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = \
            public, secret, server_key
    sock.connect(endpoint)
    return sock


def offer(sock: zmq.Socket, msg) -> None:
    """Send, unless the server has already turned the stranger away (no pipe to send on)."""
    try:
        sock.send_multipart(msg.to_frames())
    except zmq.Again:
        pass


@pytest.mark.inprocess
def test_an_authenticated_job_trains_and_a_stranger_gets_nothing_in(cluster, tmp_path):
    keys = tmp_path / "keys"
    settings = dict(cluster__curve="on", cluster__keys_dir=str(keys),
                    data__synthetic__rows=40_000, train__epochs=2)
    c = cluster(transport="tcp", **settings)
    make_keys(keys, [*c.job.cluster.expected_nodes(), "control-0", OPERATOR])
    cl = c.job.cluster
    ctx = zmq.Context()
    try:
        c.start_all()
        c.wait_for_event(lambda e: e["event"] == "epoch_start")
        public = {n: zmq.auth.load_certificate(str(keys / f"{n}.key"))[0]
                  for n in ("ps-0", "aggregator-0", "control-0", "feeder-0")}
        monitored = intruder(ctx, cl.endpoint("ps-0"), public["ps-0"])
        events = monitored.get_monitor_socket()
        strangers = [monitored, intruder(ctx, cl.endpoint("ps-0"), None)]
        for s in strangers:  # a batch: its keys, then a look-up
            offer(s, BatchKeys(
                batch_id=1 << 60, window=0, samples=1, bounds=[0, 1],
                positions=np.zeros(1, np.int32), keys=np.array([42], np.int64)))
            offer(s, Lookup(batch_id=1 << 60, train=True))
        for key in (public["aggregator-0"], None):  # a weight update
            s = intruder(ctx, cl.endpoint("aggregator"), key)
            offer(s, Contribution(round=1, coefficient=1e9, samples=1, done=False,
                                  delta=np.full(10, 1e6, np.float32)))
            strangers.append(s)
        for key in (public["control-0"], None):  # a command
            s = intruder(ctx, cl.endpoint("control_req"), key)
            offer(s, ControlRequest(action="stop", changes={}))
            strangers.append(s)
        for key in (public["feeder-0"], None):  # an acknowledgement
            s = intruder(ctx, cl.endpoint("ledger"), key)
            offer(s, Ack(batch_id=1, samples=1, loss_sum=0.0, weight_sum=1.0,
                         preds=np.zeros(0, np.float32)))
            strangers.append(s)
        # the shard's authenticator turns the stranger's key away during the handshake
        seen = set()
        while zmq.EVENT_HANDSHAKE_FAILED_AUTH not in seen:
            assert events.poll(10_000), f"no handshake failure; events {seen}"
            seen.add(recv_monitor_message(events)["event"])
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in seen
        # an operator with the console's key pair is answered
        reply = request(cl.endpoint("control_req"), "settings", cluster=cl)
        assert reply.ok
        assert c.wait() == 0, c.logs()
        for s in strangers:  # nobody answered the strangers
            assert not s.poll(0)
    finally:
        ctx.destroy(linger=0)
    s = c.summary()
    assert s["status"] == "completed"  # the stranger's stop did not stop it
    assert s["rejected_messages"] == {}  # nothing of theirs even reached a role
    assert s["auc"] > 0.7
    keys_seen = sum(v["keys"] for v in s["shards"].values())
    assert keys_seen > 0


@pytest.mark.inprocess
def test_a_node_without_its_key_cannot_start(cluster, tmp_path):
    c = cluster(cluster__curve="on", cluster__keys_dir=str(tmp_path / "none"))
    proc = c.start_role("ps", 0)
    assert proc.wait(timeout=60) == 2
    assert "no key pair for ps-0" in c.log("ps-0")


def test_zbus_ctl_without_the_operators_key_says_why(tmp_path):
    cl = ClusterConfig(curve="on", keys_dir=str(tmp_path / "none"))
    with pytest.raises(OSError, match="no key pair for console"):
        request(cl.endpoint("control_req"), "settings", cluster=cl, timeout_s=0.5)


@pytest.mark.inprocess
def test_the_console_authenticates_like_any_node(cluster, tmp_path):
    keys = tmp_path / "keys"
    c = cluster(transport="tcp", cluster__curve="on", cluster__keys_dir=str(keys))
    make_keys(keys, ["control-0", OPERATOR])
    cl = c.job.cluster
    c.start_role("control")

    async def drive(endpoints: Endpoints, check) -> None:
        app = ZbusConsole(endpoints)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(300):
                if check(app):
                    return
                await pilot.pause(0.1)
            raise AssertionError(f"console: {app.link_detail}")

    # with the console's key pair: control's status arrives over CURVE
    asyncio.run(drive(Endpoints(cl.endpoint("status"), cl.endpoint("control_req"), cl),
                      lambda app: app.connected and app.snapshot.get("phase") == "starting"))
    # without one: it says why and stays disconnected
    stranger = dataclasses.replace(cl, keys_dir=str(tmp_path / "none"))
    asyncio.run(drive(Endpoints(cl.endpoint("status"), cl.endpoint("control_req"), stranger),
                      lambda app: "cannot authenticate" in app.link_detail))


def test_a_flat_keys_directory_allows_its_public_keys_and_nothing_else(tmp_path):
    """A Kubernetes Secret mounted as a volume is flat (no allowed/): every ``*.key`` in it is
    allowed; a ``.key_secret`` alone is not a public key to allow."""
    import shutil

    from roles.tools.keys import make_keys
    from zbus.security import Curve
    from zbus.sockets import free_tcp_ports

    made, flat = tmp_path / "made", tmp_path / "flat"
    make_keys(made, ["ps-0", "worker-0", "stranger"])
    flat.mkdir()
    for f in made.iterdir():
        if f.is_file() and f.name != "stranger.key":  # the stranger's secret file only
            shutil.copy(f, flat / f.name)
    (port,) = free_tcp_ports(1)
    cluster = ClusterConfig(curve="on", keys_dir=str(flat), shards=1,
                            endpoints={"ps-0": f"tcp://127.0.0.1:{port}"})
    ctx = zmq.Context()
    curves = []
    try:
        server = Curve(ctx, cluster, "ps-0")
        curves.append(server)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        server.server(router)
        router.bind(cluster.endpoint("ps-0"))

        def dealer(name: str) -> zmq.Socket:
            curve = Curve(ctx, cluster, name, authenticate=False)
            curves.append(curve)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            curve.client(sock, address=cluster.endpoint("ps-0"))
            sock.connect(cluster.endpoint("ps-0"))
            return sock

        stranger, worker = dealer("stranger"), dealer("worker-0")
        stranger.send(b"from the stranger")
        worker.send(b"from worker-0")
        assert router.poll(10_000)
        assert router.recv_multipart()[1] == b"from worker-0"
        assert not router.poll(1000)   # the stranger never got through
    finally:
        for curve in curves:
            curve.stop()
        ctx.destroy(linger=0)
