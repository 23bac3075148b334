"""The done prefix of a partition (``roles.events.watermark``): what a Kafka commit may
say is trained."""

from roles.events.watermark import Watermark


def test_the_floor_moves_only_over_a_done_prefix_with_gaps_and_redeliveries():
    w = Watermark()
    for p in (10, 11, 13, 14):      # 12: a gap (compacted, a transaction marker)
        w.delivered(p)
    assert not w.done(11) and w.floor == 10   # 10 not done: nothing may be committed
    assert w.done(10) and w.floor == 12
    assert not w.done(14) and w.floor == 12
    w.delivered(13)                 # delivered again before it was done
    assert w.done(13) and w.floor == 15 and w.pending() == 0
    w.delivered(11)                 # a redelivery of what is done: ignored
    assert w.pending() == 0 and not w.done(9) and w.floor == 15
