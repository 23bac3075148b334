"""Control's placement part (roles.control.placement), without sockets: a window's
counts decide a new map; drain, move and active follow the feeders' and shards' reports; the
shards' work becomes history records, each window once; the predictor trains off the loop."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest

from roles.algorithms.control.membership import Members
from roles.algorithms.shard.window_work import WindowLedger
from roles.control.commands import Commands, ProgressClock
from roles.control.placement import PlacementKeeper
from roles.job.rundir import MetricsLog
from roles.job.settings import DataConfig, Job, PlacementConfig
from roles.protocol.placement import Drained, KeyCounts, Moved, Placement, WindowWork, WorkRecorded
from roles.protocol.topology import ClusterConfig


class Keeper(PlacementKeeper):
    """The keeper with real parts around it: members, commands and metrics (no sockets)."""

    def __init__(self, run_dir: Path, **placement):
        job = Job(data=DataConfig(source="synthetic"), cluster=ClusterConfig(shards=2),
                  placement=PlacementConfig(mode="skew", buckets_per_shard=2, **placement))
        members = Members(["feeder-0", "ps-0", "ps-1"], 0, 0.0)
        for node in members.expected:
            members.admit(node, node.split("-")[0], 0, "h", 1, 0.0)
        self.published: list[Placement] = []
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        super().__init__(job, members, Commands(self.published.append), self.log, run_dir,
                         ProgressClock(0.0), train_in=lambda: ThreadPoolExecutor(1))

    def events(self) -> list[dict]:
        return [orjson.loads(line) for line in (self.run_dir / "metrics.jsonl").read_bytes()
                .splitlines()]


def counts(window: int, keymap) -> KeyCounts:
    """A window where two hot keys both live on shard 0: placement must split them."""
    keys = np.array([0, 2], dtype=np.int64)          # both hash to shard 0
    tail = np.arange(10, 410, dtype=np.int64)
    stream = np.concatenate([np.repeat(keys, 300), tail])
    return KeyCounts(window=window, version=keymap.version, size=16, pairs=len(stream),
                     keys=keys, counts=np.array([300, 300], np.int64),
                     errors=np.zeros(2, np.int64),
                     bucket_pairs=np.bincount(keymap.bucket_of(stream), minlength=4),
                     shard_pairs=np.bincount(keymap.owner_of(stream), minlength=2))


@pytest.fixture
def keeper(tmp_path):
    return Keeper(tmp_path)


def test_a_better_map_is_drained_moved_and_activated(keeper):
    keeper.handle_key_counts("feeder-0", counts(0, keeper.keymap))
    assert [p.phase for p in keeper.published] == ["drain"]
    new = keeper.published[-1]
    assert new.version == 1 and keeper.keymap.version == 0
    # a window closing meanwhile is recorded, not placed
    keeper.handle_key_counts("feeder-0", counts(1, keeper.keymap))
    assert keeper.windows[-1]["decision"] == "a migration is still running"
    keeper.handle_moved("ps-0", Moved(version=1, sent=3, received=0))  # too early: ignored
    keeper.handle_placement_drained("feeder-0", Drained(version=0))     # stale: ignored
    assert [p.phase for p in keeper.published] == ["drain"]
    keeper.handle_placement_drained("feeder-0", Drained(version=1))
    assert [p.phase for p in keeper.published] == ["drain", "move"]
    keeper.handle_moved("ps-0", Moved(version=1, sent=3, received=0))
    assert keeper.keymap.version == 0              # ps-1 has not reported yet
    time.sleep(0.01)
    keeper.handle_moved("ps-1", Moved(version=1, sent=0, received=3))
    assert [p.phase for p in keeper.published] == ["drain", "move", "active"]
    assert keeper.keymap.version == 1 and keeper.migration is None
    hot = keeper.keymap.owner_of(np.array([0, 2], dtype=np.int64))
    assert hot[0] != hot[1]                        # the two hot keys are split
    (record,) = keeper.migrations
    assert record["moved_keys"] == 3 and record["pause_s"] > 0
    assert {"event": "placement", **record} in [
        {k: v for k, v in e.items() if k != "t"} for e in keeper.events()]
    assert keeper.progress.last > 0.0              # the migration was progress
    state = keeper.status()
    assert state["version"] == 1 and state["migrations"] == 1 and state["phase"] == "active"


def test_a_map_that_is_not_better_enough_is_kept(keeper):
    even = KeyCounts(window=0, version=0, size=16, pairs=400, keys=np.zeros(0, np.int64),
                     counts=np.zeros(0, np.int64), errors=np.zeros(0, np.int64),
                     bucket_pairs=np.full(4, 100, np.int64),
                     shard_pairs=np.full(2, 200, np.int64))
    keeper.handle_key_counts("feeder-0", even)
    assert keeper.published == [] and keeper.windows[-1]["decision"] == "keep"
    keeper.handle_key_counts("feeder-0", even)      # a repeat of a closed window: ignored
    assert len(keeper.windows) == 1


def work(windows: list[int], late: int = 0) -> WindowWork:
    return WindowWork(late_pairs=late, windows=np.array(windows, np.int64),
                      figures=np.array([[500, 0.01, 500, 0.002]] * len(windows), np.float64))


def test_finished_windows_become_records_once_and_are_answered(keeper):
    for w in range(3):
        keeper.closed(w, 1000)
    answer = keeper.handle_window_work(1, work([0, 1, 2]))
    assert answer.closed == 2 and answer.windows.tolist() == [0, 1, 2]
    assert {(r.window, r.op, r.shard) for r in keeper.records()} == {
        (w, op, 1) for w in range(3) for op in ("lookup", "update")}
    again = keeper.handle_window_work(1, work([1, 2]))   # the answer was lost: repeated
    assert again.windows.tolist() == [1, 2] and len(keeper.records()) == 6
    assert keeper.handle_window_work(1, work([5])).windows.tolist() == []  # not closed yet
    assert len((keeper.run_dir / "placement" / "capacity_records.jsonl")
               .read_text().splitlines()) == 6


def test_work_reported_after_the_summary_is_answered_but_not_recorded(keeper):
    """The shards report their last windows as they stop, after control wrote the summary: the
    records file keeps to what the summary counted."""
    for w in range(3):
        keeper.closed(w, 1000)
    keeper.handle_window_work(0, work([0, 1]))
    keeper.seal()
    late = keeper.handle_window_work(0, work([2]))
    assert late.windows.tolist() == [2]             # answered: the shard stops reporting it
    assert keeper.status()["records"] == 4 == len(keeper.records())
    assert len((keeper.run_dir / "placement" / "capacity_records.jsonl")
               .read_text().splitlines()) == 4


def test_every_window_is_recorded_when_windows_close_faster_than_heartbeats(keeper):
    """Three windows close between two heartbeats of each shard; each shard's ledger reports
    its finished windows with every heartbeat until control answers: none is lost."""
    ledgers = {shard: WindowLedger() for shard in (0, 1)}
    window = 0
    for beat in range(20):
        for _ in range(3):                        # three windows close per heartbeat
            for shard, ledger in ledgers.items():
                ledger.add(window, "lookup", 100 + shard, 0.001)
                ledger.add(window, "update", 100 + shard, 0.0005)
            keeper.handle_key_counts("feeder-0", counts(window, keeper.keymap))
            window += 1
        for shard, ledger in ledgers.items():
            held = Counter({window - 1: 1} if beat % 4 == 0 else {})  # a batch in flight
            report = ledger.report(held)
            if beat % 5 == 3:
                continue                          # this report was lost on the way
            ledger.answered(keeper.handle_window_work(shard, report))
    for _ in range(2):                            # two more heartbeats, nothing new
        for shard, ledger in ledgers.items():
            report = ledger.report(Counter())
            if report is not None:
                ledger.answered(keeper.handle_window_work(shard, report))
    recorded = Counter((r.window, r.shard, r.op) for r in keeper.records())
    assert set(recorded.values()) == {1}          # no record twice
    assert {w for w, _, _ in recorded} == set(range(window))   # every window, every shard
    assert len(recorded) == window * 2 * 2
    assert all(not ledger.figures for ledger in ledgers.values())


def test_a_shard_behind_the_feeders_still_reports_the_windows_closed_meanwhile(keeper):
    """Control closes a window when every feeder has sent its batches; a shard still working
    through earlier batches hears of it first. Its work on those windows afterwards is that
    window's work, not a late copy's: every window is recorded; a batch sent again after its
    window was recorded is late."""
    ledger = WindowLedger()
    for w in range(3):
        keeper.handle_key_counts("feeder-0", counts(w, keeper.keymap))
    ledger.add(0, "lookup", 100, 0.001)
    ledger.add(0, "update", 100, 0.0005)
    ledger.answered(keeper.handle_window_work(0, ledger.report(Counter())))
    assert ledger.closed == 2 and ledger.recorded == 0   # heard: up to window 2 closed
    for w in (1, 2):                                # the shard catches up with the closed ones
        ledger.add(w, "lookup", 100, 0.001)
        ledger.add(w, "update", 100, 0.0005)
    assert ledger.late_pairs == 0
    ledger.answered(keeper.handle_window_work(0, ledger.report(Counter())))
    assert ledger.recorded == 3
    assert {(r.window, r.op) for r in keeper.records() if r.shard == 0} == {
        (w, op) for w in range(3) for op in ("lookup", "update")}
    ledger.add(1, "update", 7, 0.0001)              # window 1's batch sent again
    assert ledger.late_pairs == 7 and not ledger.figures


def test_the_windows_a_shard_remembers_as_recorded_are_bounded():
    ledger = WindowLedger(kept=4)
    for w in range(10):
        ledger.add(w, "lookup", 1, 0.001)
        ledger.answered(WorkRecorded(closed=w, windows=np.array([w], np.int64)))
    assert len(ledger.done) == 4 and ledger.done_below == 5
    ledger.add(3, "lookup", 2, 0.001)               # long recorded: late
    ledger.add(8, "lookup", 3, 0.001)               # recorded: late
    assert ledger.late_pairs == 5 and not ledger.figures


def test_the_history_is_bounded_and_the_predictor_trains_off_the_loop(tmp_path):
    """Control keeps the newest history_windows windows; the predictor is trained elsewhere
    (here a thread; in control, a child process): the call that starts a training returns the
    capacities in service (equal, before the first training), and the trained predictor serves
    once it is done."""
    keeper = Keeper(tmp_path, history_windows=4, min_windows=2)
    for w in range(12):
        keeper.closed(w, 1000)
        keeper.handle_window_work(0, work([w]))
        keeper.handle_window_work(1, work([w]))
    assert len(keeper.history) == 4 and len(keeper.records()) == 4 * 2 * 2
    assert keeper.records_total == 12 * 2 * 2 and min(keeper.history) == 8
    caps, source = keeper.capacities(1000)
    assert source == "equal" and keeper.trainer.running is not None
    keeper.trainer.wait(120)
    caps, source = keeper.capacities(1000)
    assert source == "predicted" and caps.sum() == pytest.approx(1000)
    assert keeper.status()["predictor_fits"] == 1
    assert (tmp_path / "placement" / "capacity_model.pt").exists()
    keeper.close()
