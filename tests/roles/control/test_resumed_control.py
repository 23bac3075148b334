"""A resumed control publishes none of its records' commands before it has decided whether the
nodes live on or the whole job goes back to its checkpoint (``roles.control.commands``)."""

from __future__ import annotations

import time

import orjson
import pytest

from roles.algorithms.shared.key_map import KeyMap
from roles.checkpoint.files import number_name, write_manifest
from roles.control.placement import Migration
from roles.control.process import Control
from roles.protocol.dense_sync import Aggregate
from roles.protocol.lifecycle import Membership
from roles.testbed.jobs import REPO
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
    cut_control_part(dead, 9)
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


def cut_control_part(control: Control, number: int) -> None:
    """Checkpoint ``number`` complete with control's part only, at control's round."""
    store = control.checkpoints.store
    names = []
    for name, data in control.capture_cut(number).items():
        names.append(f"{number_name(number)}/{name}")
        store.put_bytes(names[-1], data)
    write_manifest(store, number, {"parts": {"control": names},
                                   "round": control.rounds.round})


def killed_mid_migration(c) -> None:
    """A dead control's records: checkpoint 9 cut with placement 0 active, then a key migration
    (placement 1) begun and the control killed while the feeders drained."""
    dead = Control(c.job, environ=c.env)
    cut_control_part(dead, 9)
    old = dead.placement.keymap
    moved = KeyMap(1, old.shards, (old.buckets + 1) % old.shards)
    dead.placement.migration = Migration(moved, time.monotonic(), 3)
    dead.commands.publish(moved.message("drain"), "placement")   # written ahead: on disk
    dead.close()


def say_hello(control: Control, node: str, pid: int, run_id: str = "") -> None:
    role, index = node.rsplit("-", 1)
    hello = Hello(role=role, index=int(index), host="h", pid=pid, run_id=run_id,
                  fingerprint=control.job.fingerprint())
    control.on_node(node.encode(), decode(hello.to_frames(node)))


@pytest.mark.inprocess
def test_a_job_killed_whole_during_a_key_migration_goes_back_to_its_checkpoint(cluster):
    """Fresh CI: the whole skew-placement job SIGKILLed while keys moved; the resumed control
    refused its own records ("a key migration was under way") before hearing that every node
    was new, so the job could not go back to a checkpoint cut before the migration began."""
    c = cluster(REPO / "jobs" / "zipf.toml")
    killed_mid_migration(c)
    resumed = Control(c.job, resume=c.run_dir)
    try:
        assert resumed.placement.interrupted == 1
        stateful = [n for n in c.job.cluster.expected_nodes() if not n.startswith("worker")]
        for i, node in enumerate(stateful):
            say_hello(resumed, node, 2000 + i)
        assert resumed.resumption.decision.rolled_back
        assert resumed.course.phase != "done", resumed.course.phase
        assert resumed.placement.interrupted is None and resumed.placement.migration is None
        assert resumed.placement.keymap.version == 0
        standing = resumed.commands.get("placement")
        assert standing is None or standing.phase == "active", standing
    finally:
        resumed.close()


@pytest.mark.inprocess
def test_a_control_killed_during_a_key_migration_fails_saying_so_when_its_nodes_live_on(
        cluster):
    """Only control died mid-migration: the nodes that lived on cannot take the migration up
    again, so the resumed control fails at the first of them, naming the way out (a resume of
    the whole job, back to its checkpoint)."""
    c = cluster(REPO / "jobs" / "zipf.toml")
    killed_mid_migration(c)
    resumed = Control(c.job, resume=c.run_dir)
    try:
        say_hello(resumed, "feeder-0", 3000, run_id=resumed.run_id)
        assert resumed.course.phase == "done" or resumed.resume_from is not None
        summary = orjson.loads((c.run_dir / "summary.json").read_bytes())
        assert "a key migration (placement 1) was under way" in summary["reason"], summary
        assert "resume the run" in summary["reason"]
    finally:
        resumed.close()
