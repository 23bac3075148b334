"""Faults: a parameter-server shard SIGKILLed mid-job and started again restores its latest
checkpoint and the job finishes; what the crash cost is reported (real processes, loopback)."""

from __future__ import annotations

import signal
import sys

import numpy as np
from harness import ADULT_JOB

ADULT_TRAIN_ROWS = 39074
SLOW = {"model__hidden": [512, 256]}  # epochs of seconds: long enough to kill a shard in


def mid_epoch(e: dict) -> bool:
    return e["event"] == "round_done" and e["round"] >= 3


def test_a_killed_shard_restarts_from_its_checkpoint_and_the_job_finishes(cluster):
    c = cluster(ADULT_JOB, train__epochs=2, train__checkpoint_s=0.5,
                cluster__node_timeout_s=1.5, **SLOW)
    c.start_all(slowdown={0: 3.0, 1: 3.0})
    c.wait_for_event(mid_epoch)
    checkpoint = c.run_dir / "checkpoints" / "ps-1.npz"
    c.wait_for_event(lambda e: checkpoint.exists() and e["event"] == "round_done")
    c.procs["ps-1"].send_signal(signal.SIGKILL)
    c.procs["ps-1"].wait()
    c.wait_for_event(lambda e: e["event"] == "shard_lost" and e["node"] == "ps-1", timeout=30)
    c.start("ps-1-again", [sys.executable, "-m", "roles.ps", "--index", "1"])
    assert c.wait() == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["auc"] >= 0.89, s["auc"]
    (r,) = s["shard_recoveries"]
    assert r["shard"] == "ps-1" and r["restored"], r
    # the lost-update window is bounded by the checkpoint interval (plus a heartbeat of delay)
    assert r["checkpoint_age_s"] <= 0.5 + 1.5 + r["down_s"], r
    assert r["updates_lost_at_least"] >= 0
    assert s["samples_trained"] == 2 * ADULT_TRAIN_ROWS  # no batch lost, none twice
    assert "restarted from the checkpoint" in c.log("ps-1-again")
    with np.load(checkpoint) as f:  # the last checkpoint is whole (written atomically)
        assert len(f["keys"]) == len(f["weights"]) == len(f["accum"]) > 0
