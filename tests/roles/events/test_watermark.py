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


def test_positions_set_aside_are_not_waited_for_and_the_floor_stays_below_them():
    """``forget``: a revoked partition's messages set aside untrained leave ``pending``; the
    floor stays at the first of them (the next owner reads them from there), and positions
    done above them no longer count as pending either."""
    w = Watermark()
    for p in range(5):
        w.delivered(p)
    assert w.done(0) and w.floor == 1
    w.done(4)                       # done ahead of 1-3 (a rejected-only message, say)
    assert w.pending() == 3
    w.forget([2, 3])                # set aside: 1 still in a batch
    assert w.pending() == 1 and w.floor == 1
    assert w.done(1) and w.floor == 2 and w.pending() == 0
