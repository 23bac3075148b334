"""Parts held between passes (roles.data.held_parts): a part read whole is held if it fits, later
reads come from memory unchanged and read-only, and the budget holds however the reads end."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from roles.data.held_parts import MB, HeldParts
from roles.data.readers import RawBlock, Rejected
from roles.data.stream import Parsed, Preparer, Tally, Weighting
from roles.data.transforms import DenseTransform
from roles.job.fields import FieldLayout

ROW_BYTES = 8 * 2 + 8 * 2 + 4   # two key slots, two dense values, a label


def block(rows: int, seed: int = 0) -> Parsed:
    rng = np.random.default_rng(seed)
    raw = RawBlock(labels=rng.integers(0, 2, rows).astype(np.float32),
                   dense=rng.normal(size=(rows, 2)), sparse=[], timestamps=None,
                   rows_read=rows + 1, rejected=[Rejected("f", 7, "bad label", "x,y")])
    return Parsed(raw, rng.integers(-2**62, 2**62, (rows, 2)))


def reads(blocks: list[Parsed], log: list[str]):
    """A part's blocks as if read from its file (each read noted in ``log``)."""
    log.append("file")
    yield from blocks


def test_a_part_read_whole_is_held_and_read_again_from_memory_unchanged():
    held, log = HeldParts(1, ROW_BYTES), []
    blocks = [block(1000, s) for s in range(3)]
    first = list(held.read(7, 3000, reads(blocks, log)))
    again = list(held.read(7, 3000, reads(blocks, log)))
    assert log == ["file"] and len(again) == 3
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert held.counters() == {"parts_held": 1, "held_mb": round(held.used() / MB, 1),
                               "parts_read_from_memory": 1}
    with pytest.raises(ValueError, match="read-only"):   # no pass can change a later one's rows
        again[0].keys[0, 0] = 1
    with pytest.raises(ValueError, match="read-only"):
        again[0].raw.dense[0, 0] = 1.0


def test_a_part_larger_than_the_budget_is_read_every_time():
    held, log = HeldParts(0.01, ROW_BYTES), []     # about 10 KB
    blocks = [block(1000)]                          # about 36 KB
    assert not held.fits(1, 1000)
    for _ in range(2):
        assert len(list(held.read(1, 1000, reads(blocks, log)))) == 1
    assert log == ["file", "file"] and held.counters()["parts_held"] == 0 and held.used() == 0


def test_a_part_whose_rows_outgrow_its_estimate_stops_being_kept():
    held, log = HeldParts(0.05, ROW_BYTES), []     # about 52 KB: the estimate (100 rows) fits
    blocks = [block(1000, s) for s in range(3)]    # about 108 KB: it does not
    assert held.fits(1, 100)
    assert len(list(held.read(1, 100, reads(blocks, log)))) == 3
    assert held.counters()["parts_held"] == 0 and held.used() == 0
    small = [block(10)]
    list(held.read(2, 10, reads(small, log)))       # the budget is whole again
    assert held.counters()["parts_held"] == 1


def test_a_part_read_only_in_part_is_not_held_and_frees_its_share():
    held, log = HeldParts(1, ROW_BYTES), []
    blocks = [block(1000, s) for s in range(3)]
    it = held.read(3, 3000, reads(blocks, log))
    next(it)
    assert held.used() > 0                          # reserved while it is read
    it.close()                                      # the pass dropped its stream
    assert held.used() == 0 and held.counters()["parts_held"] == 0
    assert len(list(held.read(3, 3000, reads(blocks, log)))) == 3 and log == ["file", "file"]


def test_parts_no_longer_the_feeders_are_dropped_even_while_being_read():
    held, log = HeldParts(1, ROW_BYTES), []
    for n in (1, 2):
        list(held.read(n, 1000, reads([block(1000, n)], log)))
    it = held.read(3, 1000, reads([block(1000, 3), block(10)], log))
    next(it)
    held.drop([2])                                  # a new PartMap: only part 2 is ours
    list(it)                                        # part 3's read ends after the drop
    assert held.counters()["parts_held"] == 1 and held.parts.keys() == {2}
    assert held.used() == sum(b.freeze() for b in held.parts[2])


def test_a_parsed_block_prepares_as_its_block_does():
    layout = FieldLayout.of(["a", "b"], {}, {}, 4, {}, {}, {})
    raw = RawBlock(labels=np.array([1, 0, 1], np.float32),
                   dense=np.array([[1.0, np.nan], [2.0, 3.0], [0.5, -1.0]]),
                   sparse=[pa.array(["x", "y", "x"]), pa.array(["p", None, "q"])],
                   timestamps=None, rows_read=4)
    prepare = Preparer(layout, DenseTransform(True, np.zeros(2), np.ones(2)),
                       Weighting(1.0, 86_400, 0.0, True, None))
    parsed = Parsed.of(layout, raw)
    parsed.freeze()
    for train in (True, False):
        a, b = Tally(), Tally()
        want, got = prepare(raw, train, a), prepare.parsed(parsed, train, b)
        for k in ("keys", "dense", "labels", "weights"):
            np.testing.assert_array_equal(getattr(got, k), getattr(want, k))
        assert a == b and a.rows_read == 4
