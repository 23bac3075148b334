"""A worker's gradient row sums (``roles.model.row_sums``): the compiled loop and torch's
``index_add_`` give the same bits, a row read by no position stays zero."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from harness import REPO

from roles.data.compiled import AVAILABLE
from roles.model.row_sums import RowSums

CPU = torch.device("cpu")


def test_the_loop_is_compiled_here():
    assert AVAILABLE, "numba is a dependency: a worker sums its gradient rows compiled"
    assert RowSums(CPU).compiled and not RowSums(CPU, compiled=False).compiled
    assert not RowSums(torch.device("meta")).compiled   # a GPU's: torch's index_add_


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])
def test_rows_read_twice_add_up_and_a_row_read_by_none_stays_zero(compiled):
    grads = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    sums = RowSums(CPU, compiled).sums(np.array([2, 0, 2, 0]), grads, rows=4)
    assert sums.dtype == np.float32 and sums.shape == (4, 3)
    assert sums.tolist() == [[3 + 9, 4 + 10, 5 + 11], [0, 0, 0], [0 + 6, 1 + 7, 2 + 8],
                             [0, 0, 0]]


def test_both_ways_give_the_same_bits_on_a_criteo_size_grid():
    rng = np.random.default_rng(7)
    index = rng.integers(0, 16_000, 26_624)
    grads = torch.from_numpy(rng.normal(size=(26_624, 16)).astype(np.float32) * 1e-3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # index_add_ adds in grid order on one thread, as a worker runs
    try:
        a = RowSums(CPU).sums(index, grads, 16_001)
        b = RowSums(CPU, compiled=False).sums(index, grads, 16_001)
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(a, b)
    assert not a[16_000].any() and a.any()


def test_a_gradient_that_is_not_contiguous_or_float32_takes_the_right_path():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    grads = base[:, ::2]   # a view with a stride
    index = np.array([1, 1, 0, 3])
    expect = RowSums(CPU, compiled=False).sums(index, grads.contiguous(), 4)
    assert np.array_equal(RowSums(CPU).sums(index, grads, 4), expect)
    assert np.array_equal(RowSums(CPU).sums(index, grads.double(), 4), expect)


@pytest.mark.integration
def test_the_first_calls_of_the_compiled_loops_import_nothing():
    """The loops are ready when their users are made: a shard's first look-up and Adagrad and
    a worker's first row sums import no module (numba's typing of an array argument used to
    import ``numpy.ma`` at the first call: 7-8 ms on a job's first batch, in each role). In a
    fresh interpreter, since this one has imported everything already."""
    code = """if True:
        import sys, time
        import numpy as np, torch
        from roles.algorithms.shard.admission import Admission
        from roles.algorithms.shard.embedding_table import EmbeddingTable
        from roles.model.row_sums import RowSums
        admission = Admission(0, 0, 2, 0, 0, time.monotonic())
        table = EmbeddingTable(4, 0.05, 0.05, seed=1, defaults=admission.defaults)
        sums = RowSums(torch.device("cpu"))
        before = set(sys.modules)
        keys = np.arange(16, dtype=np.int64) * 7919
        got = admission.map_batch(table, keys, np.arange(16, dtype=np.int32), [0, 8, 16])
        table.adagrad(got.rows, np.ones((len(got.rows), 4), np.float32))
        sums.sums(got.inverse.astype(np.int64), torch.ones(16, 4), len(got.rows))
        print(sorted(set(sys.modules) - before))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
