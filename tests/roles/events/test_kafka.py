"""The Kafka consumer against librdkafka's mock cluster on loopback: commits only past the done
prefix of a partition, the group's next consumer going on from the commit, a partition of a
consumer that leaves going to the one left, and one line for what cannot be consumed."""

from __future__ import annotations

from functools import partial

import pytest

from roles.events import BrokerError, open_consumer
from roles.testbed import consuming

# the mock cluster's group coordinator, quick: a consumer that leaves is noticed in seconds
drain = partial(consuming.drain, wait_s=0.5)   # the mock's group coordinator answers slower
QUICK = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


@pytest.mark.inprocess   # the mock cluster runs in this process
def test_a_commit_covers_only_the_done_prefix_and_the_next_consumer_goes_on_from_it(kafka):
    kafka.produce("clicks", [f"{i}".encode() for i in range(10)], partition=0)
    first = open_consumer(kafka.url, "clicks", "job", options=QUICK)
    got = drain(first, 10)
    assert [(d.partition, d.position) for d in got] == [(0, i) for i in range(10)]
    assert [d.payload for d in got] == [f"{i}".encode() for i in range(10)]
    first.done(got[:3] + got[5:8])   # 3 and 4 not trained: the commit stops at 3
    assert first.lag()[0] == 7
    first.close()
    second = open_consumer(kafka.url, "clicks", "job", options=QUICK)
    try:
        again = drain(second, 7)
        assert [d.position for d in again] == list(range(3, 10))
        second.done(again)
        assert second.lag()[0] == 0
    finally:
        second.close()


@pytest.mark.inprocess   # the mock cluster runs in this process
def test_the_lag_of_a_partition_nothing_is_delivered_from_is_after_its_commit(kafka):
    """A partition whose messages a consumer of the group trained and committed: the next
    consumer has nothing of it delivered, and its lag there is none (not the partition from its
    start); one with messages not committed counts them."""
    kafka.produce("clicks", [f"{i}".encode() for i in range(6)], partition=0)
    kafka.produce("clicks", [f"{i}".encode() for i in range(4)], partition=1)
    first = open_consumer(kafka.url, "clicks", "job", options=QUICK)
    got = drain(first, 10)
    first.done([d for d in got if d.partition == 0] + [d for d in got if d.partition == 1][:1])
    first.close()
    second = open_consumer(kafka.url, "clicks", "job", options=QUICK)
    try:
        again = drain(second, 3)
        assert sorted((d.partition, d.position) for d in again) == [(1, 1), (1, 2), (1, 3)]
        assert second.lag() == {0: 0, 1: 3, 2: 0, 3: 0}   # (the topic has 4 partitions)
        second.done(again)
        assert second.lag() == {0: 0, 1: 0, 2: 0, 3: 0}
    finally:
        second.close()


@pytest.mark.inprocess   # the mock cluster runs in this process
def test_the_partitions_of_a_consumer_that_leaves_go_to_the_one_left(kafka):
    kafka.produce("views", [b"x"] * 4)   # made with 4 partitions
    for partition in range(4):
        kafka.produce("views", [f"{partition}-{i}".encode() for i in range(5)], partition)
    a = open_consumer(kafka.url, "views", "job", options=QUICK)
    b = open_consumer(kafka.url, "views", "job", options=QUICK)
    got_a = drain(a, 1)
    got_b = drain(b, 1)
    a.done(got_a)   # (mid-rebalance: committed when its partitions are taken away)
    b.done(got_b)   # what is not done is delivered again, from the last commit
    a.close()       # leaves: its partitions go to b
    try:
        rest: list = []
        for _ in range(4):   # until every message came (one delivered again counts once)
            distinct = {(d.partition, d.position) for d in got_a + got_b + rest}
            if len(distinct) == 24:
                break
            rest += drain(b, 24 - len(distinct), rounds=80)
        seen = sorted((d.partition, d.position) for d in got_a + got_b + rest)
        assert len(set(seen)) == 24   # every message, b taking a's partitions
        # none twice, unless the group refused a commit (a member fenced out mid-rebalance,
        # as a loaded host makes it: Kafka then delivers its done messages again, and only
        # those)
        again = [m for m in set(seen) if seen.count(m) > 1]
        first = {(d.partition, d.position) for d in got_a + got_b}
        refused = a.commits_refused + b.commits_refused
        assert (not again) if not refused else set(again) <= first, (again, refused)
    finally:
        b.close()


@pytest.mark.inprocess   # the mock cluster runs in this process
def test_what_cannot_be_consumed_is_one_line(kafka):
    kafka.produce("clicks", [b"x"])
    with pytest.raises(BrokerError, match="no topic 'nowhere'"):
        open_consumer(kafka.url, "nowhere", "job")
    with pytest.raises(BrokerError, match="group.id: set by the job"):
        open_consumer(kafka.url, "clicks", "job", options={"group.id": "x"})
    with pytest.raises(BrokerError, match="No such configuration property"):
        open_consumer(kafka.url, "clicks", "job", options={"sasl.mechanismz": "PLAIN"})


@pytest.mark.inprocess   # the mock cluster runs in this process
@pytest.mark.parametrize("assignor", ["range,roundrobin", "cooperative-sticky"])
def test_a_rewind_seeks_each_partition_back_whatever_was_committed(kafka, assignor):
    """(With a cooperative assignor the wound-back partitions are assigned incrementally:
    ``assign`` there is an error.)"""
    kafka.produce("clicks", [f"{i}".encode() for i in range(10)], partition=0)
    options = {**QUICK, "partition.assignment.strategy": assignor}
    first = open_consumer(kafka.url, "clicks", "job", options=options)
    got = drain(first, 10)
    first.done(got)
    first.settle()
    first.close()
    again = open_consumer(kafka.url, "clicks", "job", options=options, rewind={0: 6})
    try:
        back = drain(again, 4)
        assert [(d.partition, d.position) for d in back] == [(0, i) for i in range(6, 10)]
    finally:
        again.close()


@pytest.mark.inprocess   # the mock cluster runs in this process
def test_a_roll_back_winds_each_partition_back_once_whichever_feeder_gets_it(kafka):
    """Two feeders of a job gone back to a checkpoint: the first takes every partition and
    seeks each to the checkpoint's offset, trains and commits some of them; once it leaves,
    the second gets them and reads on from the first one's commits (named after the roll
    back), not from the checkpoint again, which would deliver twice what the first trained.
    The next roll back winds them back again."""
    for partition in range(2):
        kafka.produce("views", [f"{partition}-{i}".encode() for i in range(10)], partition)
    before = open_consumer(kafka.url, "views", "job", options=QUICK)
    before.done(drain(before, 20))   # the run before the power cut: all committed
    before.settle()
    before.close()
    rewind = {0: 4, 1: 7}
    a = open_consumer(kafka.url, "views", "job", options=QUICK, rewind=rewind, rewind_id="r1")
    got = drain(a, 9)
    assert sorted((d.partition, d.position) for d in got) == \
        [(0, i) for i in range(4, 10)] + [(1, i) for i in range(7, 10)]
    a.done([d for d in got if d.partition == 0 and d.position < 7]
           + [d for d in got if d.partition == 1])   # 0: 4-6 trained; 1: all
    a.close()
    b = open_consumer(kafka.url, "views", "job", options=QUICK, rewind=rewind, rewind_id="r1")
    try:
        rest = drain(b, 3)
        assert sorted((d.partition, d.position) for d in rest) == [(0, 7), (0, 8), (0, 9)]
        assert b.fetch(10, 1.0) == []
        b.done(rest)
    finally:
        b.close()
    c = open_consumer(kafka.url, "views", "job", options=QUICK, rewind={0: 8},
                      rewind_id="r2")
    try:   # a new roll back: back to its offsets; partition 1, not named, from its start
        again = drain(c, 12)
        assert sorted((d.partition, d.position) for d in again) == \
            [(0, 8), (0, 9)] + [(1, i) for i in range(10)]
    finally:
        c.close()



@pytest.mark.inprocess   # the mock cluster runs in this process
@pytest.mark.parametrize("rewind", [None, {0: 1, 1: 2, 2: 0, 3: 3}])
def test_a_revoke_sets_aside_what_is_not_begun_and_waits_for_the_rest(kafka, rewind):
    """A second feeder joins while the first holds every message it has read, some begun
    (in batches), some not: the revoke asks the first to set aside what it has not begun
    (``revoking``, ``forget``) and waits while it trains the rest (its acknowledgements
    served through its reader meanwhile), so that neither reads again what the first
    trained, and what was set aside goes to its partition's next owner. The mock cluster
    refuses a commit mid-rebalance (a real broker takes it from the group's current
    generation): a partition that comes back to the first feeder reads on past what it
    trained all the same. Before, the revoke committed what was done by then and the
    first feeder read its partitions again from there, training twice what it trained in
    the meantime. The same in a job gone back to a checkpoint (``rewind``): there a
    partition that came back was read again from its wound-back commit."""
    import time

    import orjson

    from roles.data.readers import Schema
    from roles.events.decode import EventDecoder
    from roles.events.reader import EventReader

    def message(i: int) -> bytes:
        return orjson.dumps({"y": i % 2, "x": i, "c": "a"})

    kafka.produce("views", [message(0)] * 4)   # (made with 4 partitions)
    for partition in range(4):
        kafka.produce("views", [message(i) for i in range(4)], partition)
    ends = dict(enumerate(hi for _, hi in kafka.watermarks("views")))
    firsts = dict.fromkeys(ends, 0) if rewind is None else rewind
    back = {"rewind": rewind, "rewind_id": "r1"} if rewind is not None else {}
    # member ids begin with client.id: the range assignor gives a [0, 1], b [2, 3]
    a = open_consumer(kafka.url, "views", "job", options={**QUICK, "client.id": "a"},
                      ack_wait_s=60, **back)
    reader = EventReader(a, EventDecoder(Schema(label="y", dense=["x"], sparse=["c"]),
                                         "json", "views"))
    held: list = []
    b = None
    deadline = time.monotonic() + 60
    try:
        while len(held) < sum(ends[p] - firsts[p] for p in ends):   # all read, none trained
            assert time.monotonic() < deadline, len(held)
            held += [d for deliveries, _ in reader.take() for d in deliveries]
            time.sleep(0.05)
        b = open_consumer(kafka.url, "views", "job", options={**QUICK, "client.id": "b"},
                          **back)
        got_b = drain(b, 1, rounds=1)   # (joins: a's partitions are revoked; b waits)
        while reader.revoking()[1] != {0, 1, 2, 3}:   # (b's join made a's revoke)
            assert time.monotonic() < deadline
            got_b += drain(b, 1, rounds=1)
        begun = [d for d in held if d.partition in (0, 1)]
        count = reader.revoking()[0]   # the answer: what is not begun, set aside
        reader.forget([d for d in held if d.partition in (2, 3)], count)
        time.sleep(0.5)          # the revoke waits on the begun ones ...
        assert reader.revoking()[1] == {0, 1, 2, 3}
        reader.done(begun)       # ... trained now
        # every message set aside is read again, by whichever owns its partition now (the
        # range assignor gives a [0, 1] and b [2, 3]; under load the mock has given b all
        # four first, evicting a slow rejoin, and then split them): collected until all came
        aside = {(p, q) for p in (2, 3) for q in range(firsts[p], ends[p])}
        again_a: list = []
        while not aside <= {(d.partition, d.position) for d in got_b + again_a}:
            assert time.monotonic() < deadline, (got_b, again_a)
            got_b += drain(b, 100, rounds=1)
            again_a += [d for deliveries, _ in reader.take() for d in deliveries]
        time.sleep(1.0)
        got_b += drain(b, 100, rounds=2)
        again_a += [d for deliveries, _ in reader.take() for d in deliveries]
        # nothing a trained comes back to a; to b only from a commit the mock refused
        # mid-rebalance (a real broker takes it: counted)
        assert [d for d in again_a if d.partition in (0, 1)] == [], again_a
        if a.commits_refused == 0:
            assert [d for d in got_b if d.partition in (0, 1)] == [], got_b
    finally:
        reader.shut("the first feeder's")
        if b is not None:
            b.close()
