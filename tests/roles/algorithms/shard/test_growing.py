"""Rows that grow in place (roles.algorithms.shard.growing): kept, zero or ``fill`` beyond, a
fork's copy of them unmoved, and a growth refused while a view lives, the rows intact."""

from __future__ import annotations

import os

import numpy as np
import pytest

from roles.algorithms.shard.embedding_table import FREE, EmbeddingTable
from roles.algorithms.shard.growing import GrowingRows


def test_grown_rows_keep_theirs_and_the_new_read_as_the_fill():
    g = GrowingRows(3, (4,), np.float32)
    g.array[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    grown = g.grow(100_000)
    assert grown.shape == (100_000, 4)
    np.testing.assert_array_equal(grown[:3], np.arange(12).reshape(3, 4))
    assert not grown[3:].any()
    clocks = GrowingRows(2, (), np.int64, fill=7)
    clocks.array[0] = 1
    assert clocks.grow(5).tolist() == [1, 7, 7, 7, 7]


def test_a_growth_refused_while_a_view_lives_leaves_the_rows_as_they_were():
    g = GrowingRows(4, (2,), np.float32)
    g.array[:] = 3.0
    view = g.array[:2]
    with pytest.raises(BufferError):
        g.grow(64)
    assert g.rows == 4 and (g.array == 3.0).all()
    del view
    assert g.grow(64).shape == (64, 2) and (g.array[:4] == 3.0).all()


def test_a_fork_sees_the_rows_as_they_were_when_it_forked():
    g = GrowingRows(1000, (8,), np.float32)
    g.array[:] = 1.0
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: what it sees after the parent has written
        os.read(read, 1)
        os._exit(0 if (g.array == 1.0).all() else 1)
    g.array[:] = 2.0
    os.write(write, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_table_grown_by_many_doublings_holds_every_row_it_was_given():
    t = EmbeddingTable(dim=4, init_scale=0.1, lr=0.1, capacity=8)
    keys = np.arange(1, 5001, dtype=np.int64) * 7919
    rows = t.rows_for(keys[:10])
    t.weights[rows] = 5.0
    rows = t.rows_for(keys[10:20])   # (rows first: t.weights may not be held as rows come)
    before = t.weights[rows].copy()
    t.rows_for(keys)   # grows 8 -> 8192 rows
    assert len(t.weights) >= 5000 and len(t) == 5000
    np.testing.assert_array_equal(t.weights[t.rows_for(keys[:10])], 5.0)
    np.testing.assert_array_equal(t.weights[t.rows_for(keys[10:20])], before)
    assert (t.last_seen[t.size:] == FREE).all()
