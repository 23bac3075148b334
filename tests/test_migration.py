"""Control's placement part (roles.control.placement), without sockets: a window's
counts decide a new map; drain, move and active follow the feeders' and shards' reports."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from roles.algorithms.membership import Members
from roles.control.commands import Commands, ProgressClock
from roles.control.placement import PlacementKeeper
from roles.job.rundir import MetricsLog
from roles.job.settings import DataConfig, Job, PlacementConfig
from roles.protocol.placement import Drained, KeyCounts, Moved, Placement
from roles.protocol.topology import ClusterConfig


class Keeper(PlacementKeeper):
    """The keeper with real parts around it: members, commands and metrics (no sockets)."""

    def __init__(self, run_dir: Path):
        job = Job(data=DataConfig(source="synthetic"), cluster=ClusterConfig(shards=2),
                  placement=PlacementConfig(mode="skew", buckets_per_shard=2))
        members = Members(["feeder-0", "ps-0", "ps-1"], 0, 0.0)
        for node in members.expected:
            members.admit(node, node.split("-")[0], 0, "h", 1, 0.0)
        self.published: list[Placement] = []
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        super().__init__(job, members, Commands(self.published.append), self.log, run_dir,
                         ProgressClock(0.0))

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


def test_shard_work_becomes_records_two_windows_later(keeper):
    keeper.window_pairs.update({0: 1000, 1: 1000, 2: 1000})
    work = {"0": [500, 0.01, 500, 0.002], "1": [500, 0.01, 500, 0.002],
            "2": [100, 0.001, 0, 0.0]}
    keeper.record_work(1, {"windows": work})
    assert {(r.window, r.op, r.shard) for r in keeper.records} == {(0, "lookup", 1),
                                                                   (0, "update", 1)}
    keeper.record_work(1, {"windows": work})        # already recorded
    keeper.record_work(1, {"windows": {"x": [1]}})  # malformed: ignored
    assert len(keeper.records) == 2
    assert len((keeper.run_dir / "placement" / "capacity_records.jsonl")
               .read_text().splitlines()) == 2
