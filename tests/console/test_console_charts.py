"""The charts' ticks (pure): round values that show the scale, at least two, never closer
than the chart's rows or columns hold apart."""

from __future__ import annotations

import pytest

from console.charts import nice_ticks


@pytest.mark.parametrize("lo, hi", [(0.0, 0.3), (0.0, 0.05), (0.315, 0.594), (0.9030, 0.9102),
                                    (0.0, 52_700.0), (27.0, 116.0), (0.0, 1e-4),
                                    (5.0, 5.0001), (-2.0, 3.0)])
@pytest.mark.parametrize("apart", [1.0, 0.5, 0.3, 0.2])
def test_ticks_are_two_distinct_labels_at_least_and_far_enough_apart(lo, hi, apart):
    ticks, labels = nice_ticks(lo, hi, apart)
    assert len(ticks) >= 2
    assert all(lo - 1e-12 <= t <= hi + 1e-12 for t in ticks)
    assert len(set(labels)) == len(labels), labels   # each label tells its row apart
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert min(gaps) >= (hi - lo) * apart * (1 - 1e-6), ticks


def test_round_steps_and_just_the_decimals_they_need():
    assert nice_ticks(0.0, 0.3, 0.3) == ([0.0, 0.1, 0.2, 0.3], ["0.0", "0.1", "0.2", "0.3"])
    assert nice_ticks(27.0, 116.0, 0.2)[1] == ["40", "60", "80", "100"]
    # a chart of three rows: ticks two rows apart; no two round values fit, so the ends
    assert nice_ticks(0.315, 0.594, 1.0)[1] == ["0.32", "0.59"]


def test_an_axis_from_zero_covers_the_values_and_ends_on_a_tick():
    ticks, labels = nice_ticks(0.0, 0.32, 0.5, cover=True)
    assert ticks[0] == 0.0 and ticks[-1] >= 0.32
    assert labels == ["0.0", "0.2", "0.4"]
