"""Several feeders' records of where the stream stood at a checkpoint, made one
(``roles.events.positions``): what a resumed job reads again and what it leaves out."""

from hypothesis import given, settings
from hypothesis import strategies as st

from roles.events.positions import GroupAcks, merge_records
from roles.events.watermark import Watermark


def test_a_feeders_acks_above_the_groups_floor_are_kept_and_those_below_let_go():
    acks = GroupAcks()
    for p in (3, 5, 9):
        acks.done(p)                       # no floor known yet: every one kept
    assert acks.record() == {"floor": None, "done": [3, 5, 9], "partial": []}
    acks.floor_at(5)
    assert acks.record()["done"] == [5, 9] and acks.floor == 5
    acks.floor_at(4)                       # an older word of the server's: the floor stays
    acks.done(4)                           # below the floor: acknowledged, nothing to keep
    acks.done(12)
    assert acks.record() == {"floor": 5, "done": [5, 9, 12], "partial": []}
    acks.floor_at(10)
    assert acks.record()["done"] == [12] and len(acks) == 1


def test_kafka_records_meet_at_the_highest_floor_with_an_old_owners_record_passed():
    # partition 0 was feeder A's, then feeder B's after a rebalance; partition 1 is A's only
    a = {"0": {"floor": 100, "done": [104, 106], "partial": [[101, 30]]},
         "1": {"floor": 7, "done": [], "partial": [[8, 5]]}}
    b = {"0": {"floor": 103, "done": [110], "partial": [[103, 20], [106, 4]]}}
    merged = merge_records([a, b])
    assert merged == {
        # below 103 all done (B's word); 104 and 106 done (A's), 110 (B's); 101 below the
        # floor, 106 done: no partial left of them, 103's 20 first events trained
        "0": {"floor": 103, "done": [104, 106, 110], "partial": [[103, 20]]},
        "1": {"floor": 7, "done": [], "partial": [[8, 5]]}}


def test_jetstream_records_meet_at_the_highest_group_floor():
    # each feeder's floor is the group's as the server said it when it last asked
    a = {"0": {"floor": 50, "done": [50, 52, 57], "partial": [[60, 10]]}}
    b = {"0": {"floor": 55, "done": [56, 58], "partial": [[60, 30], [61, 2]]}}
    c = {"0": {"floor": None, "done": [], "partial": []}}   # a feeder that got nothing yet
    assert merge_records([a, b, c]) == {
        "0": {"floor": 55, "done": [56, 57, 58], "partial": [[60, 30], [61, 2]]}}
    assert merge_records([]) == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=60), st.integers(1, 4),
       st.lists(st.integers(0, 59), max_size=40), st.data())
def test_a_shared_consumers_job_record_says_exactly_what_was_acknowledged(
        acked, feeders, floor_reads, data):
    """Positions 1..n of one JetStream consumer dealt out to ``feeders`` feeders, some
    acknowledged (``acked``), the group's floor read by each feeder now and then as acks go
    (it is the server's: every position below acknowledged): the merged record reads again
    from its floor and leaves out exactly the acknowledged positions above it; everything below
    the floor was acknowledged."""
    n = len(acked)
    owner = [data.draw(st.integers(0, feeders - 1)) for _ in range(n)]
    sides = [GroupAcks() for _ in range(feeders)]
    done: set[int] = set()

    def server_floor() -> int:
        p = 1
        while p in done:
            p += 1
        return p

    order = data.draw(st.permutations([p for p in range(1, n + 1) if acked[p - 1]]))
    reads = set(floor_reads)
    for i, p in enumerate(order):
        done.add(p)
        side = sides[owner[p - 1]]
        if i in reads:   # this feeder hears the group's floor (its lag question)
            side.floor_at(server_floor())
        side.done(p)
    records = [{"0": s.record()} for s in sides]
    merged = merge_records(records)["0"]
    floor = merged["floor"] or 1
    assert set(range(1, floor)) <= done                        # below: all acknowledged
    assert set(merged["done"]) == {p for p in done if p >= floor}   # above: exactly those


def test_a_single_kafka_feeders_record_is_its_own():
    w = Watermark()
    for p in range(10, 15):
        w.delivered(p)
    for p in (10, 11, 13):
        w.done(p)
    own = {"3": {"floor": w.floor, "done": w.done_above(), "partial": [[12, 7]]}}
    assert merge_records([own]) == {"3": {"floor": 12, "done": [13], "partial": [[12, 7]]}}
