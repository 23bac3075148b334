"""A resumed control publishes none of its records' commands before it has decided whether the
nodes live on or the whole job goes back to its checkpoint (``roles.control.commands``)."""

from __future__ import annotations

import time

import pytest

from roles.checkpoint.files import number_name, write_manifest
from roles.control.process import Control
from roles.protocol.dense_sync import Aggregate
from roles.protocol.lifecycle import Membership
from zbus.codec import Message, decode
from zbus.messages import Deciding, Hello, Welcome


@pytest.mark.inprocess
def test_a_resumed_control_publishes_none_of_the_dead_runs_commands_before_it_goes_back(
        cluster, monkeypatch):
    """The whole job killed with round 26 in flight, its newest checkpoint at round 25 (fresh CI:
    the Aggregate(26) of the dead run's records, republished while control waited for the nodes
    to say Hello, was read by the restored aggregator after its Welcome; it finished round 26
    alone, ignored every Aggregate(26) control called after, and each checkpoint's flush waited
    for that round until its timeout). Until the last stateful node says Hello anew, control
    publishes only Deciding; then the checkpoint's commands, before the Welcome."""
    c = cluster()
    out: list[tuple[str, Message]] = []   # what control sends: ("pub" or "other", message)

    def send(self, sock, msg, identity=None, flags=0) -> int:
        out.append(("pub" if sock is self.pub else "other", msg))
        return 0

    monkeypatch.setattr(Control, "send", send)
    dead = Control(c.job, environ=c.env)
    dead.rounds.round = 25                      # checkpoint 9 is cut at round 25
    store = dead.checkpoints.store
    names = []
    for name, data in dead.capture_cut(9).items():
        names.append(f"{number_name(9)}/{name}")
        store.put_bytes(names[-1], data)
    write_manifest(store, 9, {"parts": {"control": names}, "round": 25})
    dead.rounds.call("every worker did 8 local steps")   # round 26 in flight at the kill
    assert dead.commands.get("round") == Aggregate(round=26, participants=[],
                                                  reason="every worker did 8 local steps")
    dead.close()
    out.clear()

    resumed = Control(c.job, resume=c.run_dir)
    now = time.monotonic()
    for tick in range(3):   # the nodes start again: control waits for every stateful one
        resumed.on_tick(now + tick * resumed.heartbeat_s)
    stateful = [n for n in c.job.cluster.expected_nodes() if not n.startswith(("worker",
                                                                                "member"))]
    for i, node in enumerate(stateful):
        role, index = node.rsplit("-", 1)
        hello = Hello(role=role, index=int(index), host="h", pid=1000 + i,
                      fingerprint=c.job.fingerprint())
        resumed.on_node(node.encode(), decode(hello.to_frames(node)))
    welcome = next(i for i, (to, m) in enumerate(out) if isinstance(m, Welcome))
    published = [m for to, m in out[:welcome] if to == "pub"]
    assert not [m for to, m in out if isinstance(m, Aggregate)], out   # not the dead run's
    deciding = next(i for i, m in enumerate(published) if not isinstance(m, Deciding))
    assert deciding == 3, published    # one Deciding per heartbeat while it waited
    back = published[deciding:]        # then the checkpoint's commands, Membership of none
    assert not any(isinstance(m, Deciding) for m in back), back
    assert any(isinstance(m, Membership) and m.workers == [] for m in back), back
    assert out[welcome][1].rollback and resumed.rounds.round == 25
    assert not resumed.rounds.in_flight
    resumed.close()
