"""The suite's order for pytest-xdist's workers (``tests/ordering.py``): pure logic."""

from __future__ import annotations

import random

import pytest
from ordering import load, plan, run_sizes


def runs_of(items: list, workers: int) -> list[list]:
    out, at = [], 0
    for size in run_sizes(len(items), workers):
        out.append(items[at:at + size])
        at += size
    return out


def test_the_runs_are_the_sizes_worksteal_hands_out_first():
    assert run_sizes(10, 4) == [2, 2, 3, 3]   # len(pending) // workers left, in turn
    assert sum(run_sizes(1977, 6)) == 1977


@pytest.mark.parametrize("workers", [2, 3, 4, 6])
def test_each_run_has_about_an_equal_share_its_longest_first(workers):
    rng = random.Random(workers)
    seconds = {f"t{i}": rng.choice([0.01, 0.2, 1.0, 3.0]) * rng.random() for i in range(300)}
    seconds.update({"long": 70.0, "second": 37.0, "third": 30.0})
    items = list(seconds)
    out = plan(items, workers, seconds.get)
    assert sorted(out) == sorted(items)
    runs = runs_of(out, workers)
    totals = [sum(seconds[t] for t in run) for run in runs]
    for run in runs:
        assert [seconds[t] for t in run] == sorted((seconds[t] for t in run), reverse=True)
    # the 70 s test's run gets nothing long besides: every other run is within the longest
    # of the short tests of the mean of the others
    (with_long,) = [r for r in runs if "long" in r]
    assert not {"second", "third"} & set(with_long) or workers < 3
    others = [t for r, t in zip(runs, totals, strict=True) if r is not with_long]
    assert max(others) - min(others) <= max(seconds[t] for t in items if seconds[t] < 30)


def test_an_unknown_test_counts_as_the_median_and_one_worker_keeps_the_order():
    seconds = {"a": 1.0, "b": 2.0, "c": 30.0}
    out = plan(["a", "new", "b", "c"], 2, seconds.get)
    assert runs_of(out, 2) == [["c", "a"], ["new", "b"]]   # new: 2 s, the median
    assert plan(["b", "a"], 1, seconds.get) == ["b", "a"]


def test_tests_that_start_processes_run_in_the_first_lanes_only():
    seconds = {f"p{i}": 10.0 + i for i in range(10)} | {f"u{i}": 0.1 * i for i in range(50)}
    items = list(seconds)
    out = plan(items, 5, seconds.get, in_lane=lambda t: t.startswith("p"), lanes=2)
    runs = runs_of(out, 5)
    assert all(t.startswith("u") for run in runs[2:] for t in run)
    assert sorted(t for run in runs[:2] for t in run if t.startswith("p")) == \
        sorted(t for t in items if t.startswith("p"))
    with pytest.raises(ValueError):
        plan(items[:10] + items[10:12], 5, seconds.get, lambda t: t.startswith("p"), 1)


def test_the_durations_file_is_seconds_then_the_node_id(tmp_path):
    path = tmp_path / "durations.tsv"
    path.write_text("1.50\ttests/a.py::test_x[1 2]\n0.2\tx\t\ttests/b.py::y\n\n")
    assert load(path) == {"tests/a.py::test_x[1 2]": 1.5, "tests/b.py::y": 0.2}
    assert load(tmp_path / "none.tsv") == {}
