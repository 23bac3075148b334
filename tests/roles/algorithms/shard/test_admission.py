"""Admission: the count-min sketch (conservative update, ageing) and a batch's keys mapped to
rows, a key without enough sightings to its field's default row."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.shard.admission import MAX_COUNT, Admission, CountMinSketch, sketch_width
from roles.algorithms.shard.embedding_table import EmbeddingTable, initial_rows
from zbus.codec import ProtocolError


def test_the_sketch_memory_is_what_sketch_mb_says_rounded_down_to_a_power_of_two():
    assert sketch_width(16) == 1 << 22           # 4 rows x 4 Mi counters = 16 MiB
    assert CountMinSketch(sketch_width(16)).nbytes == 16 << 20
    assert sketch_width(10) == 1 << 21           # 10 MiB: 8 MiB used
    assert sketch_width(1 / 16) == 1 << 14
    with pytest.raises(ValueError):
        CountMinSketch(1000)


def test_estimates_never_fall_below_the_true_counts():
    rng = np.random.default_rng(3)
    sketch = CountMinSketch(1 << 10)
    truth: dict[int, int] = {}
    for _ in range(20):   # 20 x 40 sightings: fewer than the width, no halving yet
        keys, counts = np.unique(rng.integers(0, 3000, 40), return_counts=True)
        sketch.add(keys, counts)
        for k, c in zip(keys.tolist(), counts.tolist(), strict=True):
            truth[k] = truth.get(k, 0) + c
    assert sketch.halvings == 0
    keys = np.array(sorted(truth), dtype=np.int64)
    est = sketch.estimate(keys)
    assert (est >= [truth[k] for k in keys.tolist()]).all()
    assert (est == [truth[k] for k in keys.tolist()]).mean() > 0.95  # few collisions


def test_conservative_update_keeps_singletons_from_being_admitted():
    # 40,000 keys seen once each in a sketch of 4 x 16,384 counters (halved twice meanwhile):
    # with min_count 3, almost none may look seen 3 times
    sketch = CountMinSketch(1 << 14)
    keys = np.arange(40_000, dtype=np.int64) * 7919
    for chunk in np.array_split(keys, 100):
        sketch.add(chunk, np.ones(len(chunk), dtype=np.int64))
    assert sketch.halvings == 2
    assert (sketch.estimate(keys) >= 2).mean() < 0.01


def test_counters_are_halved_every_width_sightings_and_saturate():
    sketch = CountMinSketch(1 << 6)
    key = np.array([42], dtype=np.int64)
    sketch.add(key, np.array([10]))
    assert sketch.estimate(key).tolist() == [10]
    sketch.add(np.arange(100, 154, dtype=np.int64), np.ones(54, dtype=np.int64))  # 64 in all
    assert sketch.halvings == 1 and sketch.added == 0
    assert sketch.estimate(key)[0] in (5, 6)      # halved (a collision may add one)
    wide = CountMinSketch(1 << 10)
    wide.add(key, np.array([300]))
    assert wide.estimate(key)[0] == MAX_COUNT and wide.halvings == 0


def batch(keys: list[int], fields: int = 2) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """A batch's keys given sample by sample (field = index % fields), as its field-major grid
    (``roles.job.fields``): the keys, their positions and the grid's bounds."""
    grid = np.array(keys, dtype=np.int64).reshape(-1, fields).T.ravel()
    samples = len(keys) // fields
    return grid, np.arange(len(keys), dtype=np.int32), [samples * f for f in range(fields + 1)]


def table(fields: int = 2) -> EmbeddingTable:
    return EmbeddingTable(4, 0.1, 0.5, seed=1, defaults=fields)


def test_min_count_one_admits_every_key_on_first_sight_as_before():
    adm = Admission(1, 16, 2)
    assert adm.sketch is None and adm.defaults == 0
    t = EmbeddingTable(4, 0.1, 0.5, seed=1)
    keys, positions, bounds = batch([5, 6, 5, 7])
    mapped = adm.map_batch(t, keys, positions, bounds)
    assert mapped.pending is None and len(t) == 3 and adm.admitted == 3
    assert t.index.find(keys)[[0, 1, 3]].tolist() == mapped.rows[mapped.inverse][[0, 1, 3]] \
        .tolist()


def test_keys_share_their_fields_default_row_until_min_count_sightings():
    adm, t = Admission(3, 1, 2), table()
    keys, positions, bounds = batch([10, 11, 12, 13, 10, 15])  # fields 0 1 0 1 0 1
    mapped = adm.map_batch(t, keys, positions, bounds)
    # key 10 was seen twice here: still short of 3; every key maps to its field's default
    assert len(t) == 0 and adm.admitted == 0 and adm.rejected == 6
    assert mapped.rows.tolist() == [0, 1]
    assert mapped.inverse.tolist() == [0, 0, 0, 1, 1, 1]   # field-major: 10 12 10, 11 13 15
    pending_keys, pending_counts = mapped.pending
    assert dict(zip(pending_keys.tolist(), pending_counts.tolist(), strict=True)) == {
        10: 2, 11: 1, 12: 1, 13: 1, 15: 1}
    # an eval batch (no gradients, so never trained): nothing counted
    adm.map_batch(t, keys, positions, bounds)
    again = adm.map_batch(t, keys, positions, bounds)
    assert len(t) == 0 and again.rows.tolist() == [0, 1]
    adm.trained(mapped.pending)     # the first batch's gradients applied: 10 seen twice
    third = adm.map_batch(t, *batch([10, 11]))   # 2 + 1 sightings: 10 gets its row
    assert len(t) == 1 and adm.admitted == 1
    row = t.index.find(np.array([10]))[0]
    assert row >= 2 and third.rows[third.inverse].tolist() == [row, 1]
    assert third.pending[0].tolist() == [11]


def test_a_key_seen_min_count_times_in_one_batch_is_admitted_at_once():
    adm, t = Admission(3, 1, 2), table()
    mapped = adm.map_batch(t, *batch([8, 9, 8, 9, 8, 9]))
    assert len(t) == 2 and mapped.pending is None
    assert sorted(mapped.rows.tolist()) == sorted(t.index.find(np.array([8, 9])).tolist())


def test_default_rows_train_as_one_row_each():
    adm, t = Admission(5, 1, 2), table()
    mapped = adm.map_batch(t, *batch([1, 2, 3, 4, 5, 6]))
    assert mapped.rows.tolist() == [0, 1] and np.allclose(t.weights[:2], 0)
    grads = np.array([[1.0, 0, 0, 0], [0, 2.0, 0, 0]], dtype=np.float32)
    t.adagrad(mapped.rows, grads)   # one summed gradient per row, as the worker sends it
    assert np.allclose(t.weights[0], [-0.5, 0, 0, 0]) and np.allclose(t.accum[1], [0, 4, 0, 0])


def test_an_eval_batch_makes_no_row_and_scores_as_the_export_would():
    keys, positions, bounds = batch([5, 6, 5, 7])
    plain, t = Admission(1, 16, 2), EmbeddingTable(4, 0.1, 0.5, seed=1)
    plain.map_batch(t, *batch([6, 6]))
    mapped = plain.map_eval(t, keys, positions, bounds)
    assert len(t) == 1 and plain.admitted == 1 and t.clock == 2   # no row for 5 and 7
    where, values = mapped.fresh
    assert mapped.rows[where].tolist() == [0, 0]   # stand-ins, replaced by the values
    got = t.weights[mapped.rows]
    got[where] = values
    expect = np.stack([initial_rows(np.array([k]), 4, 0.1, 1)[0] if k != 6
                       else t.weights[t.index.find(np.array([6]))[0]] for k in [5, 5, 6, 7]])
    assert np.array_equal(got[mapped.inverse], expect)   # field-major grid: 5 5, 6 7
    # with admission: a key without a row scores with its field's default row, even when
    # its sightings would admit it in a training batch; nothing is counted
    adm, t2 = Admission(2, 1, 2), table()
    seen = adm.map_eval(t2, *batch([8, 9, 8, 9, 8, 9]))
    assert len(t2) == 0 and adm.admitted == 0 and adm.rejected == 0 and seen.fresh is None
    assert seen.rows[seen.inverse].tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ProtocolError):
        adm.map_eval(t2, *batch([1, 2, 3], 3))


def test_a_batch_wider_than_the_fields_is_refused():
    adm, t = Admission(2, 1, 2), table()
    with pytest.raises(ProtocolError):
        adm.map_batch(t, *batch([1, 2, 3], 3))


def test_the_summary_gives_each_shards_table_figures_and_their_total():
    from roles.algorithms.control.summary import table_figures
    from roles.job.settings import parse_job
    job = parse_job("[data]\nsource = \"synthetic\"\n[embeddings]\nmin_count = 3\n"
                    "expire_batches = 500\n")
    counters = {"ps-1": {"table": {"rows": 5, "admitted": 7, "rejected": 11, "expired": 2}},
                "ps-0": {"table": {"rows": 1, "admitted": 2, "rejected": 3, "evicted": 4}},
                "worker-0": {"table": {"rows": 99}}}
    t = table_figures(job, counters)
    assert list(t["shards"]) == ["ps-0", "ps-1"]
    assert t["total"]["rows"] == 6 and t["total"]["rejected"] == 14
    assert t["total"]["expired"] == 2 and t["total"]["evicted"] == 4
    assert (t["min_count"], t["expire_batches"], t["sketch_mb"]) == (3, 500, 16.0)


def test_with_expiry_the_counters_are_halved_once_per_horizon():
    # by batches: a key seen once per horizon never reaches 3: halvings in between
    adm, t = Admission(3, 1, 2, age_batches=4), table()
    key = [77, 78]
    for _ in range(3):
        adm.trained(adm.map_batch(t, *batch(key)).pending)
        for _ in range(3):
            adm.map_batch(t, *batch([1, 2]))   # other batches (eval: nothing counted)
    assert adm.sketch.halvings == 3 and len(t) == 0
    assert adm.sketch.estimate(np.array([77]))[0] <= 1
    # by seconds (expire_s): tick halves once per age_s
    timed = Admission(3, 1, 2, age_s=10.0, now=100.0)
    timed.trained((np.array([5]), np.array([2])))
    timed.tick(105.0)
    assert timed.sketch.estimate(np.array([5]))[0] == 2
    timed.tick(110.0)
    assert timed.sketch.estimate(np.array([5]))[0] == 1 and timed.sketch.halvings == 1
    timed.tick(115.0)
    assert timed.sketch.halvings == 1
