from __future__ import annotations

from roles.algorithms.control.membership import Members, Stalls

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


def beat(m: Members, now: float, *nodes: str) -> None:
    for n in nodes or EXPECTED:
        m.nodes[n].last_seen = now


def test_control_stalled_gives_every_live_node_a_fresh_timeout_once():
    m, stalls = started(), Stalls(timeout=3.0, heartbeat=0.5, started=0.0)
    assert stalls.check(1.0, m) == ""
    beat(m, 1.4, "feeder-0", "aggregator-0", "ps-0", "worker-0")  # worker-1 died at 1.0
    m.nodes["feeder-0"].probe_pending_since = 1.2
    assert stalls.check(2.0, m) == ""  # a gap of a second: no stall
    why = stalls.check(6.0, m)         # control did not run for 4 s
    assert "control's own loop stalled for 4.0 s" in why
    assert m.silent(6.0, 3.0) == [] and m.nodes["feeder-0"].probe_pending_since is None
    assert list(stalls.events) == [{"t": 6.0, "why": why, "nodes": 5}] and stalls.count == 1
    for now in (6.5, 7.0, 7.5, 8.0, 8.5, 9.0, 9.1):  # worker-1 stays silent: failed now
        beat(m, now, "feeder-0", "aggregator-0", "ps-0", "worker-0")
        assert stalls.check(now, m) == ""
    assert m.silent(9.1, 3.0) == ["worker-1"]


def test_every_node_silent_at_once_is_a_stall_once_and_not_a_second_time():
    m, stalls = started(), Stalls(timeout=3.0, heartbeat=0.5, started=0.0)
    for i, node in enumerate(EXPECTED):  # their last heartbeats, up to one apart
        beat(m, 1.0 + 0.1 * i, node)
    for now in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0):
        assert stalls.check(now, m) == ""
    assert m.silent(4.1, 3.0) == ["feeder-0"]  # the first due: the others are quiet too
    assert "every live node went silent at once (for 2.7 s at least)" in stalls.check(4.1, m)
    assert m.silent(4.2, 3.0) == []
    for now in (4.5, 5.0, 5.5, 6.0, 6.5, 7.0):  # nobody speaks again: they are lost
        assert stalls.check(now, m) == ""
    assert stalls.check(7.2, m) == "" and m.silent(7.2, 3.0) == EXPECTED
    assert len(stalls.events) == stalls.count == 1


def test_some_nodes_silent_are_no_stall_and_a_lone_node_is_failed_at_once():
    m, stalls = started(), Stalls(timeout=3.0, heartbeat=0.5, started=0.0)
    for now in (1.5, 2.0, 2.5, 3.0, 3.5, 4.0):
        beat(m, now, "feeder-0", "aggregator-0", "ps-0")
        assert stalls.check(now, m) == ""
    assert stalls.check(4.1, m) == "" and m.silent(4.1, 3.0) == ["worker-0", "worker-1"]
    lone = Members(["feeder-0"], max_workers=255, started=0.0)
    lone.admit("feeder-0", "feeder", 0, "h", 1, now=1.0)
    lone.mark_ready("feeder-0", now=1.0)
    assert not lone.all_quiet(4.1, 1.0) and lone.silent(4.1, 3.0) == ["feeder-0"]


def test_a_dead_node_gets_one_fresh_timeout_however_often_control_stalls():
    m, stalls = started(), Stalls(timeout=3.0, heartbeat=0.5, started=0.0)
    assert stalls.gap_limit == 1.5 and stalls.quiet == 1.0
    now = 1.0
    assert stalls.check(now, m) == ""
    for _ in range(6):  # control stalls 2 s every 2.5 s; worker-1 died at 1.0
        now += 0.5
        beat(m, now, "feeder-0", "aggregator-0", "ps-0", "worker-0")
        stalls.check(now, m)
        now += 2.0
        assert stalls.check(now, m).startswith("control's own loop stalled")
    assert stalls.count == 6 and [e["nodes"] for e in stalls.events] == [5, 4, 4, 4, 4, 4]
    assert m.silent(now, 3.0) == ["worker-1"]


def test_a_timeout_within_a_heartbeat_or_two_looks_for_no_quiet():
    assert Stalls(timeout=1.0, heartbeat=1.0, started=0.0).quiet <= 0
    assert Stalls(timeout=10.0, heartbeat=1.0, started=0.0).quiet == 2.0
