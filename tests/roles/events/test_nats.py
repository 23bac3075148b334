"""The JetStream consumer against a real nats-server (``-js``) on loopback: messages in stream
order, acknowledged ones never delivered again, unacknowledged ones delivered again to the
group's next puller, a shared durable consumer giving each message to one puller, and one
line for what cannot be consumed."""

from __future__ import annotations

import pytest

from roles.events import BrokerError, open_consumer
from roles.events.nats_js import JetStreamConsumer
from roles.testbed.consuming import drain


@pytest.mark.integration
def test_what_is_acknowledged_never_comes_again_and_the_rest_does(nats):
    seqs = nats.publish("events", "clicks", [f"{i}".encode() for i in range(10)])
    # (an ack wait of 1 s passed on a loaded host before the acks were sent: two messages
    # came due again and counted in the lag, 6 against 4)
    first = JetStreamConsumer([f"127.0.0.1:{nats.port}"], "clicks", "job", "earliest", {},
                              ack_wait_s=3.0)
    try:
        got = drain(first, 10)
        assert [d.position for d in got] == seqs
        assert [d.payload for d in got] == [f"{i}".encode() for i in range(10)]
        assert all(d.deliveries == 1 and d.time_s > 0 for d in got)
        first.done(got[:6])
        assert first.lag() == {0: 4}
    finally:
        first.close()   # a feeder gone with 4 messages trained or not: never acknowledged
    second = open_consumer(nats.url, "clicks", "job")
    try:
        again = drain(second, 4)
        assert [d.position for d in again] == seqs[6:]
        assert all(d.deliveries == 2 for d in again)
        second.done(again)
        assert second.lag() == {0: 0}
        assert second.fetch(10, 0.3) == []
    finally:
        second.close()


@pytest.mark.integration
def test_feeders_sharing_the_group_get_each_message_once_and_latest_starts_at_the_end(nats):
    nats.publish("events", "clicks", [b"old"] * 5)
    url = nats.url
    a, b = open_consumer(url, "clicks", "shared"), open_consumer(url, "clicks", "shared")
    late = open_consumer(url, "clicks", "late", start="latest")
    try:
        seqs = nats.publish("events", "clicks", [f"{i}".encode() for i in range(40)])
        got_a = a.fetch(15, 1.0)
        got_b = drain(b, 45 - len(got_a))
        positions = sorted(d.position for d in got_a + got_b)
        assert positions == list(range(1, 6)) + seqs    # each once, none lost
        assert got_a and got_b
        assert [d.payload for d in drain(late, 40)] == [f"{i}".encode() for i in range(40)]
    finally:
        for c in (a, b, late):
            c.close()


@pytest.mark.integration
def test_what_cannot_be_consumed_is_one_line(nats):
    nats.publish("events", "clicks", [b"x"])
    with pytest.raises(BrokerError, match="no JetStream stream holds the subject 'views'"):
        open_consumer(nats.url, "views", "job")
    with pytest.raises(BrokerError, match="tls_hostnam: not options of the NATS client"):
        open_consumer(nats.url, "clicks", "job", options={"tls_hostnam": "x"})
    with pytest.raises(BrokerError, match="start must be 'earliest' or 'latest'"):
        open_consumer(nats.url, "clicks", "job", start="newest")
    nats.close()
    with pytest.raises(BrokerError, match=f"NATS at nats://127.0.0.1:{nats.port}: "):
        JetStreamConsumer([f"127.0.0.1:{nats.port}"], "clicks", "job", "earliest", {},
                          connect_timeout_s=1.0)


@pytest.mark.integration
def test_a_message_said_in_progress_is_not_delivered_again_while_it_is_worked_on(nats):
    nats.publish("events", "clicks", [b"slow"])
    consumer = JetStreamConsumer([f"127.0.0.1:{nats.port}"], "clicks", "job", "earliest", {},
                                 ack_wait_s=1.0)
    other = JetStreamConsumer([f"127.0.0.1:{nats.port}"], "clicks", "job", "earliest", {},
                              ack_wait_s=1.0)
    try:
        (got,) = drain(consumer, 1)
        for _ in range(4):   # 2 s of work, in progress every half second: past its ack wait
            consumer.working([got])
            assert other.fetch(1, 0.5) == []
        consumer.done([got])
        assert other.fetch(1, 1.5) == []   # acknowledged: never again
    finally:
        consumer.close()
        other.close()


@pytest.mark.integration
def test_a_rewind_delivers_again_from_its_position_what_was_acknowledged(nats):
    """A job gone back to a checkpoint: the group reads again from the position the checkpoint
    recorded, though everything was acknowledged since."""
    seqs = nats.publish("events", "clicks", [f"{i}".encode() for i in range(10)])
    first = open_consumer(nats.url, "clicks", "job")
    try:
        first.done(drain(first, 10))
        assert first.lag() == {0: 0}
    finally:
        first.close()
    again = open_consumer(nats.url, "clicks", "job", rewind={0: seqs[6]})
    try:
        got = drain(again, 4)
        assert [d.position for d in got] == seqs[6:] and again.fetch(10, 0.3) == []
        again.done(got)
    finally:
        again.close()


@pytest.mark.integration
def test_a_roll_back_makes_the_groups_consumer_anew_once_whoever_opens_first(nats):
    """A job gone back to a checkpoint with two feeders: feeder 1 (not leading) waits until
    feeder 0 has made the group's consumer anew from the checkpoint's floor, then both pull
    from it, each message to one; feeder 0 started again within that roll back finds it made
    and goes on (nothing delivered again), and the next roll back makes it anew again. The
    group's floor (``acked_below``) follows the acknowledgements."""
    import threading
    seqs = nats.publish("events", "clicks", [f"{i}".encode() for i in range(10)])
    url = nats.url
    before = open_consumer(url, "clicks", "job")
    assert before.acked_below == 1
    before.done(drain(before, 6))
    before.lag()
    assert before.acked_below == seqs[6]   # acknowledged after the cut: comes again below
    before.close()
    opened: list = []
    follower = threading.Thread(target=lambda: opened.append(open_consumer(
        url, "clicks", "job", rewind={0: seqs[2]}, rewind_id="r1", rewind_leads=False)))
    follower.start()
    follower.join(0.5)
    assert follower.is_alive() and not opened   # waiting for feeder 0
    leader = open_consumer(url, "clicks", "job", rewind={0: seqs[2]}, rewind_id="r1")
    follower.join(30)
    (second,) = opened
    try:
        assert leader.acked_below == second.acked_below == seqs[2]
        got_a = leader.fetch(3, 1.0)
        got_b = drain(second, 8 - len(got_a))
        assert sorted(d.position for d in got_a + got_b) == seqs[2:]   # each once
        leader.done(got_a)
        second.done(got_b)
        leader.lag()
        assert leader.acked_below == seqs[-1] + 1
    finally:
        leader.close()
        second.close()
    again = open_consumer(url, "clicks", "job", rewind={0: seqs[2]}, rewind_id="r1")
    try:
        assert again.fetch(10, 0.3) == []   # the same roll back: not made anew
    finally:
        again.close()
    later = open_consumer(url, "clicks", "job", rewind={0: seqs[4]}, rewind_id="r2")
    try:
        assert [d.position for d in drain(later, 6)] == seqs[4:]
    finally:
        later.close()


@pytest.mark.integration
def test_a_feeder_whose_group_is_never_wound_back_says_so_in_one_line(nats, monkeypatch):
    from roles.events import nats_js
    monkeypatch.setattr(nats_js, "REWIND_WAIT_S", 0.5)
    nats.publish("events", "clicks", [b"0"])
    with pytest.raises(BrokerError) as refused:
        open_consumer(nats.url, "clicks", "job", rewind={0: 1}, rewind_id="r9",
                      rewind_leads=False)
    assert "was not read again from the checkpoint within 0.5 s (feeder 0" in str(refused.value)
    assert "\n" not in str(refused.value)
