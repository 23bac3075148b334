from __future__ import annotations

from roles.algorithms.control.membership import Members

EXPECTED = ["feeder-0", "aggregator-0", "ps-0", "worker-0", "worker-1"]


def started() -> Members:
    m = Members(EXPECTED, max_workers=255, started=0.0)
    for i, node in enumerate(EXPECTED):
        role, index = node.rsplit("-", 1)
        assert m.refusal(node, role, int(index), pid=100 + i) == ""
        m.admit(node, role, int(index), "h", 100 + i, now=1.0)
        m.mark_ready(node, now=1.0)
    return m


def test_the_job_starts_when_the_expected_nodes_are_ready():
    m = Members(EXPECTED, 255, 0.0)
    assert not m.all_expected_ready() and m.missing() == EXPECTED
    assert started().all_expected_ready()


def test_workers_join_leave_and_fail_and_each_change_raises_the_version():
    m = started()
    version = m.version
    assert m.refusal("worker-7", "worker", 7, pid=7) == ""          # workers may join
    m.admit("worker-7", "worker", 7, "h", 7, now=2.0)
    assert m.mark_ready("worker-7", now=2.0)
    assert m.live_workers() == ["worker-0", "worker-1", "worker-7"]
    assert m.leave("worker-1", now=3.0, reason="stopped")
    assert m.fail("worker-0", now=4.0, reason="silent")
    assert not m.fail("worker-0", now=5.0, reason="again")          # once only
    assert m.live_workers() == ["worker-7"] and m.version == version + 3
    assert [(e["node"], e["event"]) for e in m.events[-3:]] == [
        ("worker-7", "joined"), ("worker-1", "left"), ("worker-0", "failed")]


def test_refusals_name_the_problem():
    m = started()
    assert "not a node of this job" in m.refusal("ps-3", "ps", 3, pid=1)
    assert "not a node of this job" in m.refusal("worker-0", "worker", 1, pid=1)  # identity
    assert "already running as pid 103" in m.refusal("worker-0", "worker", 0, pid=999)
    m.fail("worker-0", now=9.0, reason="silent")
    assert m.refusal("worker-0", "worker", 0, pid=999) == ""        # a restart may rejoin


def test_silent_nodes_are_found():
    m = started()
    m.nodes["ps-0"].last_seen = 0.5
    assert m.silent(now=5.0, timeout=4.0) == ["ps-0"]


def test_the_job_finishes_once_every_live_node_sent_its_final_counters():
    m = started()
    m.fail("worker-1", now=2.0, reason="silent")   # its figures stay its last heartbeat's
    for node in EXPECTED[:-2]:
        m.nodes[node].final = True
    assert m.not_final(alive=True) == ["worker-0"]
    m.nodes["worker-0"].final = True
    assert m.not_final(alive=True) == []           # the job may end
    assert m.not_final() == ["worker-1"]           # what the summary lists
