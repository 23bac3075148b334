"""A node's link to control (zbus.node), turned by the test over real sockets (ipc), the test
playing control: what control hears of a node, and when."""

from __future__ import annotations

import time

import pytest
import zmq

from roles.protocol.topology import ClusterConfig
from zbus.codec import decode
from zbus.messages import Hello, Ready, Welcome
from zbus.node import Node


class Early(Node):
    """A node that is ready before control admits it (as a worker that hears a restored
    aggregator's weights before its Welcome)."""

    role = "worker"


@pytest.fixture
def control(tmp_path):
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    cluster = ClusterConfig(heartbeat_s=0.05, endpoints={
        "control": f"ipc://{tmp_path}/control", "control_pub": f"ipc://{tmp_path}/pub"})
    router.bind(cluster.endpoint("control"))
    pub = ctx.socket(zmq.PUB)
    pub.bind(cluster.endpoint("control_pub"))
    try:
        yield cluster, router
    finally:
        ctx.destroy(linger=0)


def heard(node: Node, router: zmq.Socket, seconds: float) -> list[object]:
    """What control hears of ``node`` while the test turns it for ``seconds``."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        node.turn(0.01)
        while router.poll(0):
            _identity, *frames = router.recv_multipart()
            got.append(decode(frames).msg)
    return got


def test_a_ready_said_before_control_admitted_the_node_reaches_control_after_its_welcome(
        control):
    cluster, router = control
    node = Early(cluster, 0, "f")
    try:
        node.to_control(Ready(info={"early": True}))   # before any Welcome
        before = heard(node, router, 0.3)
        assert any(isinstance(m, Hello) for m in before), before
        assert not any(isinstance(m, Ready) for m in before), before
        assert not node.ready_sent and node.hello().ready is False
        router.send_multipart([b"worker-0", *Welcome(accepted=True, reason="", run_id="r",
                                                     run_dir="").to_frames("control-0")])
        after = heard(node, router, 0.3)
        (ready,) = [m for m in after if isinstance(m, Ready)]
        assert ready.info == {"early": True} and node.ready_sent
    finally:
        node.stopping = True
        node.turn(0)
