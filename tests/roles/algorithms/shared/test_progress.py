"""Progress where the job waits (pure parts): a long task's figures and its log line, the
epoch's log line, what the job waits for, the console's history of each node and the charts'
y range, a checkpoint in the status and in words, the tools' output when their reader has
gone."""

from __future__ import annotations

import io
import os
import sys

import pytest

from console.charts import robust_limits, series
from console.format import checkpoint_line, final_line, wait_line
from console.history import NodeHistory
from roles.algorithms.shared.progress import Every, Progress, amount, describe, epoch_line, seconds
from roles.control.operators import wait_record
from roles.tools.output import SIGPIPE_STATUS, quiet_broken_pipe


def test_a_task_has_its_rate_and_time_left_once_work_is_done():
    p = Progress("indexing the data", "bytes", 800e6, started=100.0)
    assert p.rate(100.0) is None and p.eta_s(101.0) is None  # nothing done yet
    p.update(120e6, now=102.0)
    f = p.figures(102.0)
    assert f["rate"] == 60e6 and f["eta_s"] == pytest.approx(680e6 / 60e6, abs=0.1)
    assert f["elapsed_s"] == 2.0 and p.fraction() == pytest.approx(0.15)
    assert p.line(102.0) == ("indexing the data: 120.0 MB of 800.0 MB (15%), 60.0 MB/s, "
                             "11 s left")
    unknown = Progress("reading", "rows", None, started=0.0)
    unknown.update(5000, 1.0)
    assert describe(unknown.figures(1.0)) == "reading: 5,000 rows, 5,000 rows/s"
    parts = Progress("snapshots", "parts", 4, started=0.0)
    parts.update(3, 1.0)
    assert describe(parts.figures(1.0)).startswith("snapshots: 3 of 4 parts (75%)")


def test_amounts_and_durations_read_short():
    assert amount(1.5e9, "bytes") == "1.5 GB" and amount(512, "bytes") == "512 B"
    assert amount(1234567, "rows") == "1,234,567 rows"
    assert seconds(45) == "45 s" and seconds(200) == "3 min 20 s"
    assert seconds(7500) == "2 h 05 min"


def test_every_is_due_once_per_interval_and_not_before_the_first():
    every = Every(5.0, start=10.0)
    assert not every.due(12.0)
    assert every.due(15.0) and not every.due(19.9) and every.due(20.0)
    assert Every(5.0).due(0.0)


def test_the_epoch_line_says_progress_rate_and_both_etas():
    t = {"epoch_samples": 36_000, "samples_per_epoch": 80_000, "eta_epoch_s": 1.4,
         "eta_job_s": 35.0}
    assert epoch_line(t, 2, 20, 30_100.4) == (
        "epoch 3 of 20: 36,000 of 80,000 samples (45%), 30,100 samples/s, epoch ends in 1 s,"
        " job in 35 s")


def test_a_wait_names_the_node_its_command_and_its_deadline():
    command = "zbus-ps --index 1 --job runs/r/config.toml"
    w = wait_record("ps-1", "to be restarted", 25.04, 94.96, command)
    assert w == {"node": "ps-1", "what": "to be restarted", "restart": command,
                 "waited_s": 25.0, "left_s": 95.0}
    assert wait_line(w) == "ps-1 to be restarted: start it with zbus-ps --index 1 --job " \
                           "runs/r/config.toml (within 1m35s)"
    assert wait_record("aggregator-0", "x", 1, -5, "")["left_s"] == 0.0


def test_the_end_in_one_line():
    done = final_line({"status": "completed", "reason": "", "auc": 0.90712, "logloss": 0.3121,
                       "summary": "runs/a/summary.json", "wall_s": 41.3})
    assert done.plain == "completed: auc 0.9071, logloss 0.3121, in 41s; summary " \
                         "runs/a/summary.json"
    failed = final_line({"status": "failed", "reason": "ps-1 did not come back",
                         "summary": "runs/a/summary.json"})
    assert failed.plain == "failed (ps-1 did not come back); summary runs/a/summary.json"


def test_a_checkpoint_in_one_line_newest_cut_under_way_and_rollback():
    k = {"every_s": 60.0, "complete": 2, "aborted": 1, "next_in_s": 48.0, "under_way": None,
         "latest": {"number": 2, "age_s": 12.0, "bytes": 4_404_019, "pause_s": 0.05},
         "last_aborted": {"number": 1, "why": "ps-1 lost"}, "rollbacks": []}
    assert str(checkpoint_line(k)) == "2, 12s ago, 4.2M, training paused 0.050s; next in 48s"
    k.update(latest=None, next_in_s=None, last_aborted={"number": 3, "why": "ps-1 lost"},
             under_way={"number": 4, "phase": "drain", "elapsed_s": 1.0},
             rollbacks=[{"checkpoint": 2, "epoch": 1, "retrained_samples": 1500}])
    assert str(checkpoint_line(k)) == ("none yet (every 1m00s); 4 being cut (draining, 1s); "
                                       "resumed from checkpoint 2 (epoch 2, 1.5k samples "
                                       "trained again)")
    k.update(under_way=None)
    assert "3 abandoned: ps-1 lost" in str(checkpoint_line(k))
    assert str(checkpoint_line({"every_s": 0.0})).startswith("none yet (only when asked")


def test_node_history_keeps_one_point_a_second_and_starts_again_with_control():
    h = NodeHistory(keep_s=5.0)
    row = {"id": "worker-0", "cpu": 10.0, "rss": 1e8, "in_per_s": 5.0, "out_per_s": 6.0}
    for t in (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        h.add({"uptime_s": t, "nodes": [{**row, "cpu": t}]})
    times, cpu = h.of("worker-0", "cpu")
    assert times == [2.0, 3.0, 4.0, 5.0, 6.0] and cpu == times  # the last 5 s, one a second
    h.add({"uptime_s": 0.5, "nodes": [row]})  # control started again: its clock too
    assert h.of("worker-0", "rss") == ([0.5], [1e8])
    assert h.of("nobody", "cpu") == ([], [])


def test_a_few_high_first_points_do_not_flatten_the_loss_chart():
    losses = [2.5, 1.9] + [0.40 - i * 0.001 for i in range(40)]
    lo, hi = robust_limits(losses)
    assert lo < min(losses) and 0.40 < hi < 1.0
    assert robust_limits([0.5] * 30) is None and robust_limits(losses[:5]) is None
    s = series("loss", [0, 1, 2, 3], [None, 0.5, 0.4, None])
    assert s.x == (1, 2) and s.y == (0.5, 0.4)


def test_a_reader_gone_away_ends_a_tool_quietly(monkeypatch):
    pointed: list[int] = []   # where stdout would be pointed (at /dev/null), not done here
    monkeypatch.setattr(os, "dup2", lambda _fd, to: pointed.append(to))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO()))
    monkeypatch.setattr(sys.stdout, "fileno", lambda: 99)

    @quiet_broken_pipe
    def tool() -> None:
        raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(SystemExit) as ended:
        tool()
    assert ended.value.code == SIGPIPE_STATUS and pointed == [99]
