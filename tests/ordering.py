"""The order the suite's tests are handed to pytest-xdist's workers in, so that every worker's
share of the run's expected seconds is about the same and each runs its longest tests first
(longest processing time first): no long test is left to end alone while the others idle.

pytest-xdist's ``worksteal`` scheduler gives each of N workers one contiguous run of the
collection at the start (``len(pending) // workers_left`` tests, in order), then moves the back
half of the longest queue to a worker that has run out. So the collection is laid out as N runs
of exactly those sizes: the tests, longest first, are dealt one at a time to the run whose
expected total is smallest among those with room, and each run is then ordered longest first
(what a worker steals is then the short end of a queue).

``lanes`` (fewer than N): the tests that start processes are dealt to the first ``lanes`` runs
only, so that at most that many of them run at once (their roles compete for the CPU with each
other far more than in-process jobs do), and the in-process and unit tests fill the rest.

A test's expected seconds come from ``tests/durations.tsv`` (wall seconds, then the node id;
see ``load``); a test not in it counts as the median of those that are.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

DURATIONS = Path(__file__).with_name("durations.tsv")


def load(path: Path = DURATIONS) -> dict[str, float]:
    """``{node id: seconds}`` from lines of ``seconds<TAB>node id`` (a ``ZBUS_TEST_CPU`` file
    has the wall seconds first and the node id fourth: ``cut -f1,4``); the last line of a node
    id counts. A missing file is no durations: the collection's order is kept."""
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0]:
            out[fields[-1]] = float(fields[0])
    return out


def run_sizes(count: int, workers: int) -> list[int]:
    """How many tests worksteal's first distribution gives each worker, in order."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def plan(items: Sequence[T], workers: int, seconds: Callable[[T], float | None],
         in_lane: Callable[[T], bool] = lambda _: False, lanes: int = 0) -> list[T]:
    """``items`` reordered for ``workers`` worksteal workers (see the module's text);
    ``seconds(item)`` is None for a test of unknown duration, ``in_lane(item)`` true for one
    that must run in one of the first ``lanes`` runs (0: none is)."""
    if workers <= 1 or len(items) <= 1:
        return list(items)
    known = [s for s in map(seconds, items) if s is not None]
    default = statistics.median(known) if known else 1.0
    cost = {id(item): (s if (s := seconds(item)) is not None else default) for item in items}
    order = {id(item): i for i, item in enumerate(items)}
    sizes = run_sizes(len(items), workers)
    runs: list[list[T]] = [[] for _ in range(workers)]
    totals = [0.0] * workers
    lanes = lanes if 0 < lanes < workers else 0
    laned = [item for item in items if lanes and in_lane(item)]
    rest = [item for item in items if not (lanes and in_lane(item))]
    if len(laned) > sum(sizes[:lanes]):
        raise ValueError(f"{len(laned)} tests for {lanes} lanes of {sizes[:lanes]}")

    def longest_first(group: list[T]) -> list[T]:
        return sorted(group, key=lambda item: (-cost[id(item)], order[id(item)]))

    for group, choices in ((laned, range(lanes)), (rest, range(workers))):
        for item in longest_first(group):
            room = [i for i in choices if len(runs[i]) < sizes[i]]
            i = min(room, key=lambda i: (totals[i], i))
            runs[i].append(item)
            totals[i] += cost[id(item)]
    return [item for run in runs for item in longest_first(run)]
