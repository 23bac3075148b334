from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.shard.admission import Admission
from roles.algorithms.shard.embedding_table import EmbeddingTable, KeyIndex, initial_rows


def test_index_agrees_with_a_dict_through_growth():
    rng = np.random.default_rng(1)
    index, reference = KeyIndex(capacity=16), {}
    for _ in range(40):
        keys = np.unique(rng.integers(-2**63, 2**63 - 1, size=300, dtype=np.int64))
        keys = np.concatenate([keys, np.array(list(reference)[:50], dtype=np.int64)])
        keys = np.unique(keys)
        found = index.find(keys)
        for k, r in zip(keys.tolist(), found.tolist(), strict=True):
            assert r == reference.get(k, -1)
        new = keys[found < 0]
        rows = np.arange(len(reference), len(reference) + len(new))
        index.insert(new, rows)
        reference.update(zip(new.tolist(), rows.tolist(), strict=True))
    assert len(index) == len(reference)
    assert index.capacity >= 2 * len(reference)
    keys, rows = index.items()
    assert dict(zip(keys.tolist(), rows.tolist(), strict=True)) == reference


def test_colliding_home_slots_are_all_placed():
    index = KeyIndex(capacity=16)
    keys = np.arange(7, dtype=np.int64)  # 7 keys in 16 slots: home slots collide
    index.insert(keys, keys * 10)
    assert index.find(keys).tolist() == (keys * 10).tolist()
    assert index.find(np.array([99], dtype=np.int64)).tolist() == [-1]


def test_new_rows_are_deterministic_per_key_whatever_the_order():
    keys = np.array([5, -7, 2**62, 11], dtype=np.int64)
    a = EmbeddingTable(8, 0.05, 0.1, seed=3)
    b = EmbeddingTable(8, 0.05, 0.1, seed=3, capacity=2)
    ra = a.rows_for(keys)
    b.rows_for(np.array([99, 98], dtype=np.int64))
    rb = b.rows_for(keys[::-1].copy())[::-1]
    assert np.array_equal(a.weights[ra], b.weights[rb])
    assert np.array_equal(a.weights[ra], initial_rows(keys, 8, 0.05, 3))
    assert np.abs(a.weights[ra]).max() <= 0.05
    assert not np.array_equal(initial_rows(keys, 8, 0.05, 4), a.weights[ra])
    assert len(np.unique(a.weights[ra], axis=0)) == 4


def test_rows_are_created_once_and_keep_their_number():
    t = EmbeddingTable(4, 0.1, 0.1, capacity=2)
    first = t.rows_for(np.array([1, 2, 3], dtype=np.int64))
    again = t.rows_for(np.array([0, 1, 2, 3, 4], dtype=np.int64))
    assert again[1:4].tolist() == first.tolist()
    assert len(t) == 5


def test_adagrad_step_matches_the_formula():
    t = EmbeddingTable(3, 0.1, lr=0.5)
    rows = t.rows_for(np.array([10, 20], dtype=np.int64))
    w0 = t.weights[rows].copy()
    g = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, 1.0]], dtype=np.float32)
    t.adagrad(rows, g)
    t.adagrad(rows, g)
    acc = 2 * g * g
    expected = w0 - 0.5 * g / (np.sqrt(g * g) + 1e-10) - 0.5 * g / (np.sqrt(acc) + 1e-10)
    assert np.allclose(t.weights[rows], expected, atol=1e-6)


def test_release_and_accept_move_rows_with_their_state():
    a = EmbeddingTable(4, 0.1, 0.5, seed=3)
    b = EmbeddingTable(4, 0.1, 0.5, seed=3)
    keys = np.arange(-50, 50, dtype=np.int64) * 977
    rows = a.rows_for(keys)
    a.adagrad(rows, np.ones((len(keys), 4), np.float32))
    before = {int(k): (a.weights[r].copy(), a.accum[r].copy())
              for k, r in zip(keys, rows, strict=True)}
    leaving = np.zeros(a.size, dtype=bool)
    leaving[rows[::3]] = True
    moved, weights, accum = a.release(leaving)
    assert sorted(moved) == sorted(keys[::3]) and len(a) == len(keys) - len(moved)
    b.accept(moved, weights, accum)
    for table, expect in ((a, np.setdiff1d(keys, moved)), (b, moved)):
        found = table.index.find(expect)
        assert (found >= 0).all() and (found < table.size).all()
        for k, r in zip(expect, found, strict=True):
            w, acc = before[int(k)]
            assert np.array_equal(table.weights[r], w) and np.array_equal(table.accum[r], acc)
    assert (a.index.find(moved) == -1).all()
    again = a.rows_for(moved[:2])   # a key that comes back starts from its initial row
    assert np.array_equal(a.weights[again], initial_rows(moved[:2], 4, 0.1, 3))


def test_an_evaluation_gives_an_unknown_key_the_row_create_would_and_makes_none():
    t = EmbeddingTable(8, 0.05, 0.1, seed=3)
    known = t.rows_for(np.array([4, 6], dtype=np.int64))
    t.weights[known] += 1.0   # trained: the evaluation must give these as they are now
    keys = np.array([4, 5, 6, 7, 5], dtype=np.int64)
    evaluating = Admission(1, 1.0, 1)
    got = evaluating.map_eval(t, keys, np.arange(5), [0, 5])
    assert len(t) == 2 and t.created == 2   # no row made
    assert got.rows[got.inverse[[0, 2]]].tolist() == known.tolist()
    where, values = got.fresh
    assert got.rows[where].tolist() == [0, 0]                           # stand-ins
    assert sorted(got.inverse[[1, 3, 4]].tolist()) == sorted([*where.tolist(), where[0]])
    assert np.array_equal(values, initial_rows(np.array([5, 7]), 8, 0.05, 3))
    assert np.array_equal(t.initial(np.array([5, 7])), values)
    made = t.rows_for(np.array([5, 7], dtype=np.int64))   # what a training batch makes later
    assert np.array_equal(t.weights[made], values)
    assert evaluating.map_eval(t, keys, np.arange(5), [0, 5]).fresh is None   # all have rows


def test_adagrad_is_bit_for_bit_the_plain_expression_over_several_steps():
    rng = np.random.default_rng(3)
    t = EmbeddingTable(16, 0.05, 0.03, seed=1)
    rows = t.rows_for(rng.integers(0, 2**60, 5000))
    weights, accum = t.weights.copy(), t.accum.copy()
    for _ in range(5):
        g = rng.standard_normal((len(rows), 16)).astype(np.float32)
        acc = accum[rows] + g * g
        accum[rows] = acc
        weights[rows] -= t.lr * g / (np.sqrt(acc) + t.eps)
        t.adagrad(rows, g)
    assert np.array_equal(weights, t.weights) and np.array_equal(accum, t.accum)


@pytest.mark.parametrize("rowwise", [False, True])
def test_the_compiled_table_keeps_the_same_bits_as_the_numpy_one(rowwise):
    """Initial rows, Adagrad, per value and row-wise (gradients as a message's read-only
    frame) and the rows each key gets: bit for bit the numpy code's, for several seeds."""
    rng = np.random.default_rng(0)
    for seed in (0, 7, 2**40):
        a = EmbeddingTable(16, 0.01, 0.05, seed=seed, defaults=3, compiled=True,
                           rowwise=rowwise)
        b = EmbeddingTable(16, 0.01, 0.05, seed=seed, defaults=3, compiled=False,
                           rowwise=rowwise)
        keys = np.unique(rng.integers(-2**63, 2**63 - 1, 5000, dtype=np.int64))
        assert np.array_equal(a.rows_for(keys), b.rows_for(keys))
        assert np.array_equal(a.weights[:a.size].view(np.uint32),
                              b.weights[:b.size].view(np.uint32))
        assert np.array_equal(a.initial(keys[:50]), initial_rows(keys[:50], 16, 0.01, seed))
        for _ in range(5):
            rows = np.unique(rng.integers(0, a.size, 3000))
            grads = rng.normal(0, 1, (len(rows), 16)).astype(np.float32)
            grads.flags.writeable = False
            a.adagrad(rows, grads)
            b.adagrad(rows, grads)
        for name in ("weights", "accum", "dirty"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_rowwise_adagrad_keeps_one_sum_a_row_the_mean_of_its_squared_gradient():
    """FBGEMM's exact row-wise Adagrad: acc += mean_j g_j^2; w -= lr g / (sqrt(acc) + eps),
    against the formula in float64 over several steps; 4 bytes of state a row."""
    rng = np.random.default_rng(5)
    for compiled in (True, False):
        t = EmbeddingTable(8, 0.05, 0.1, seed=2, rowwise=True, compiled=compiled)
        rows = t.rows_for(np.unique(rng.integers(0, 2**60, 300)))
        assert t.accum.shape[1:] == (1,)
        w, acc = t.weights[rows].astype(np.float64), np.zeros(len(rows))
        for _ in range(4):
            g = rng.standard_normal((len(rows), 8)).astype(np.float32)
            t.adagrad(rows, g)
            acc += (g.astype(np.float64) ** 2).mean(axis=1)
            w -= 0.1 * g / (np.sqrt(acc) + 1e-10)[:, None]
        assert np.allclose(t.accum[rows, 0], acc, rtol=1e-5)
        assert np.allclose(t.weights[rows], w, atol=1e-5)


def test_rows_of_the_other_optimizer_are_refused_in_one_line():
    """A checkpoint or handover whose Adagrad state is of the other kind (per value against
    per row) would broadcast silently into the table: it is refused, the table unchanged."""
    per_value = EmbeddingTable(4, 0.1, 0.5, seed=3)
    rowwise = EmbeddingTable(4, 0.1, 0.5, seed=3, rowwise=True)
    keys = np.arange(10, dtype=np.int64)
    rows = per_value.rows_for(keys)
    per_value.adagrad(rows, np.ones((10, 4), np.float32))
    moved, weights, accum = per_value.release(np.ones(per_value.size, dtype=bool))
    for table, state in ((rowwise, accum), (per_value, accum[:, :1].copy())):
        try:
            table.accept(moved, weights, state)
        except ValueError as e:
            assert "embedding_optimizer" in str(e)
        else:
            raise AssertionError("accepted Adagrad state of the other kind")
        assert len(table) == 0
    rowwise.accept(moved, weights, accum[:, :1].copy())   # its own kind
    assert len(rowwise) == 10
