"""The join of impressions with late labels (``roles.algorithms.feeding.label_join``): each
impression leaves once, joined or as a negative after the window; late, unmatched and duplicate
labels counted; memory bounded by the window, not by the stream."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.algorithms.feeding.label_join import LabelJoin, Waiting


def a(*values):
    return np.asarray(values)


def test_a_label_joins_its_impression_whichever_comes_first_and_a_lone_one_expires():
    j = LabelJoin(window_s=10.0)
    out, dup = j.add_impressions(a(1, 2, 3), a(100.0, 101.0, 102.0), a(11, 12, 13))
    assert len(out) == 0 and len(dup) == 0
    out = j.add_labels(a(2), a(1.0), a(103.0))
    assert out.handles.tolist() == [12] and out.labels.tolist() == [1.0]
    out = j.add_labels(a(4), a(1.0), a(104.0))   # before its impression
    assert len(out) == 0
    out, _ = j.add_impressions(a(4), a(104.5), a(14))
    assert out.handles.tolist() == [14] and out.labels.tolist() == [1.0]
    out = j.advance(110.5)   # impression 1 (t=100) is past the window; 3 (t=102) is not
    assert out.handles.tolist() == [11] and out.labels.tolist() == [0.0]
    out = j.add_labels(a(1), a(1.0), a(111.0))   # too late: 1 was trained as a negative
    assert len(out) == 0
    out = j.advance(113.0)
    assert out.handles.tolist() == [13]
    assert j.add_labels(a(9), a(1.0), a(113.0)).handles.tolist() == []
    j.advance(124.0)
    c = j.counts
    assert (c.joined, c.expired_negative, c.labels_late, c.labels_unmatched) == (2, 2, 1, 1)
    assert j.waiting() == 0


def test_duplicates_are_counted_and_the_first_kept():
    j = LabelJoin(window_s=5.0)
    _, dup = j.add_impressions(a(1, 1, 2), a(1.0, 1.0, 1.0), a(10, 11, 12))
    assert dup.tolist() == [11]
    _, dup = j.add_impressions(a(2), a(2.0), a(13))
    assert dup.tolist() == [13]
    out = j.add_labels(a(1, 1), a(1.0, 0.0), a(2.0, 2.0))
    assert out.handles.tolist() == [10] and out.labels.tolist() == [1.0]
    j.add_labels(a(7), a(1.0), a(2.0))
    j.add_labels(a(7), a(0.0), a(2.5))
    c = j.counts
    assert (c.duplicate_impressions, c.duplicate_labels) == (2, 2)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 400), st.floats(0.5, 20.0))
def test_every_impression_leaves_once_with_its_label_or_as_a_negative(seed, n, window):
    """Impressions at one a second; a random share of them labelled after a random delay
    (some past the window), some labels for ids never shown; events in time order."""
    rng = np.random.default_rng(seed)
    events = []   # (time, kind, id, value)
    for i in range(n):
        events.append((float(i), 0, i, 0.0))
        if rng.random() < 0.6:
            events.append((i + float(rng.exponential(window / 2)), 1, i, float(rng.random() < 0.5)))
        if rng.random() < 0.05:
            events.append((i + 0.5, 1, 10_000 + i, 1.0))
    events.sort()
    j = LabelJoin(window)
    left: dict[int, float] = {}
    i = 0
    while i < len(events):   # a few events at a time, as batches come
        chunk = events[i:i + int(rng.integers(1, 8))]
        i += len(chunk)
        for kind in (0, 1):
            part = [e for e in chunk if e[1] == kind]
            if not part:
                continue
            ids, times = a(*[e[2] for e in part]), a(*[e[0] for e in part])
            if kind == 0:
                out, dup = j.add_impressions(ids, times, ids + 1_000_000)
                assert len(dup) == 0
            else:
                out = j.add_labels(ids, a(*[e[3] for e in part]), times)
            for h, label in zip(out.handles.tolist(), out.labels.tolist(), strict=True):
                assert h not in left
                left[h] = label
    out = j.advance(np.inf)
    left.update(zip(out.handles.tolist(), out.labels.tolist(), strict=True))
    assert sorted(left) == [k + 1_000_000 for k in range(n)]   # each impression once
    c = j.counts
    labelled = {e[2]: e[3] for e in events if e[1] == 1 and e[2] < 10_000}
    for k, label in left.items():
        if label == 1.0:   # a positive is always its own label
            assert labelled.get(k - 1_000_000) == 1.0
    assert c.joined + c.expired_negative == n
    assert c.joined + c.labels_late + c.labels_unmatched == sum(1 for e in events if e[1] == 1)
    assert j.waiting() == 0


def test_the_join_holds_one_window_however_long_the_stream():
    j = LabelJoin(window_s=1000.0)   # 1,000 impressions at a time, a tenth labelled
    peak = 0
    for start in range(0, 200_000, 500):
        ids = np.arange(start, start + 500)
        j.add_impressions(ids, ids.astype(float), ids)
        j.add_labels(ids[::10], np.ones(50), ids[::10] + 0.5)
        peak = max(peak, j.impressions.capacity, j.resolved.capacity)
    assert j.counts.joined == 20_000 and j.counts.expired_negative > 170_000
    assert peak <= 8192, peak   # a window holds ~1,000 waiting and ~1,000 resolved
    assert j.nbytes() < 1 << 20


def test_what_waits_survives_a_checkpoint():
    w = Waiting()
    w.add(a(5, 6, 7), a(1.0, 2.0, 3.0), a(50.0, 60.0, 70.0))
    w.take(a(6))
    again = Waiting.from_state(w.state())
    assert again.state()["ids"].tolist() == [5, 7]
    assert again.take(a(7))[1].tolist() == [70.0]
    assert again.expire(10.0)[0].tolist() == [5]
