"""A training pass's count of each batch's samples and acknowledgements
(``roles.algorithms.feeding.tally.PassBatches``): the same totals whether its batches are kept
one by one or folded once far behind their part's newest, in memory that does not grow with
the pass."""

from __future__ import annotations

import random

from roles.algorithms.feeding.tally import PassBatches


def counted(window: int, steps: list[tuple[str, int, int, int]]) -> PassBatches:
    batches = PassBatches(window)
    for what, part, seq, samples in steps:
        if what == "made":
            batches.made(part, seq, samples, before=samples % 7 == 0)
        else:
            batches.acked(part, seq)
    return batches


def test_folded_totals_are_the_totals_kept_one_by_one():
    """Two parts of a long pass: each batch made, then acknowledged a few batches later, some
    twice (a straggler's copy), some never (missed), a jump ahead (a restarted stream feeder
    numbers on from far above): a window of 64 gives what one of a million does."""
    rng = random.Random(4)
    steps: list[tuple[str, int, int, int]] = []
    top = {0: 0, 1: 0}
    for _ in range(5000):
        part = rng.randrange(2)
        seq = top[part] = top[part] + (rng.randrange(300, 400) if rng.random() < 0.002 else 1)
        steps.append(("made", part, seq, rng.randrange(1, 300)))
        late = seq - rng.randrange(0, 20)   # its ack, or an earlier one's, comes now
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            steps.append(("acked", part, max(0, late), 0))
    small, whole = counted(64, steps), counted(1 << 20, steps)
    assert small.rows() == whole.rows() and small.count == whole.count
    assert whole.rows()["rows_repeated"] and whole.rows()["rows_missed"]   # both were there
    assert all(len(s) <= 128 for s in small.sizes.values())   # at most twice the window


def test_a_long_stream_pass_keeps_at_most_two_windows_a_part():
    batches = PassBatches(1024)
    for seq in range(100_000):
        batches.made(3, seq, 256, before=False)
        batches.acked(3, seq)
    assert len(batches.sizes[3]) <= 2048 and len(batches.acks[3]) <= 2048
    assert batches.count == 100_000
    assert batches.rows() == {"rows": 25_600_000, "rows_once": 25_600_000,
                              "rows_repeated": 0, "rows_missed": 0}


def test_numbers_never_made_are_not_counted_batches():
    """A restarted stream feeder numbers on past its dead process's in-flight numbers, and a
    long stream's numbers start far up: only the batches made count (before, the count took
    every number from 0, about 2^27 here)."""
    batches = PassBatches(window=8)
    start = (1 << 27) - 10
    for seq in [*range(start, start + 20), *range(start + 40, start + 45)]:
        batches.made(3, seq, 4, before=False)
        batches.acked(3, seq)
    assert batches.count == 25
    assert batches.rows() == {"rows": 100, "rows_once": 100, "rows_repeated": 0,
                              "rows_missed": 0}
