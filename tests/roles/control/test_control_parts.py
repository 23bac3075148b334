"""Control's parts on their own (roles.control): each built with real members, commands,
metrics and state records, no sockets and no Control around it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pytest

from roles.algorithms.control.membership import Members, Stalls
from roles.algorithms.shared.metrics import TaskScores
from roles.checkpoint.files import checkpoint_dir, read_manifest, store_of
from roles.control.checkpoints import Checkpoints
from roles.control.commands import Commands, ProgressClock
from roles.control.course import Course
from roles.control.exports import Exports
from roles.control.feeding import Feeding
from roles.control.health import Health
from roles.control.main import recovery_line
from roles.control.operators import Operators
from roles.control.placement import PlacementKeeper
from roles.control.recovery import Recovery, recovery_counts
from roles.control.rounds import Rounds
from roles.control.settings import LiveSettings
from roles.control.state import (
    HISTORY_FILE,
    STATE_FILE,
    ControlComponents,
    ControlHistory,
    ControlState,
    ResumeError,
    read_state,
    write_records,
)
from roles.control.summary import run_summary, write_summary
from roles.control.sync_modes import EveryMode, LazyMode, RoundMode, SyncMode, sync_mode
from roles.job.rundir import MetricsLog, shown
from roles.job.settings import (
    AggregationConfig,
    CheckpointConfig,
    DataConfig,
    Job,
    TrainConfig,
    job_to_toml,
)
from roles.job.summary import Summary, SummaryError, read_summary
from roles.job.sync_rules import SYNC_MODES
from roles.protocol.checkpoint import Checkpoint, CheckpointDrained, CheckpointPart, Snapshotted
from roles.protocol.datapath import DataIndex, DataStats, FeederProgress, PartMap, PartStats
from roles.protocol.dense_sync import (
    Aggregate,
    BackupWritten,
    Decision,
    Restored,
    RoundDone,
    RoundReady,
)
from roles.protocol.lifecycle import (
    EpochStart,
    EpochTrained,
    EvalReport,
    Evaluate,
    Export,
    FeederBack,
)
from roles.protocol.operator import Settings
from roles.protocol.topology import ClusterConfig

WORKERS = ["worker-0", "worker-1"]


class Bus:
    """What the parts publish, in order, and what stands."""

    def __init__(self) -> None:
        self.sent: list = []
        self.commands = Commands(self.sent.append)

    def of(self, kind: type) -> list:
        return [m for m in self.sent if isinstance(m, kind)]


def members(*nodes: str) -> Members:
    m = Members(list(nodes), 255, 0.0)
    for i, node in enumerate(nodes):
        role, index = node.rsplit("-", 1)
        m.admit(node, role, int(index), "host", 100 + i, 0.0)
        m.mark_ready(node, 0.0)
    return m


def job(**train) -> Job:
    return Job(data=DataConfig(source="synthetic"), train=TrainConfig(**train),
               cluster=ClusterConfig(workers=2, feeders=2))


@pytest.fixture
def metrics(tmp_path: Path) -> MetricsLog:
    return MetricsLog(tmp_path / "metrics.jsonl")


def rounds_of(mode: SyncMode, bus: Bus, metrics: MetricsLog, clock: ProgressClock) -> Rounds:
    return Rounds(mode, members(*WORKERS), bus.commands, metrics, clock)


def test_every_mode_calls_a_round_once_every_live_worker_is_ready(metrics):
    bus, clock = Bus(), ProgressClock(0.0)
    rounds = rounds_of(EveryMode(8), bus, metrics, clock)
    rounds.ready("worker-0", RoundReady(round=1, steps=8, idle=False))
    rounds.call_if_due(1.0)
    assert bus.of(Aggregate) == []                   # worker-1 has not reported
    rounds.ready("worker-1", RoundReady(round=5, steps=8, idle=False))  # not the next round
    rounds.call_if_due(1.0)
    assert bus.of(Aggregate) == []
    rounds.ready("worker-1", RoundReady(round=1, steps=8, idle=False))
    rounds.call_if_due(1.0)
    (call,) = bus.of(Aggregate)
    assert (call.round, call.participants) == (1, WORKERS) and rounds.in_flight
    assert bus.commands.get("round") is call          # it stands until done
    done = RoundDone(round=1, contributors=WORKERS, samples_by=[10, 30], coefficient=1.0,
                     samples=40)
    assert rounds.finished(done, 2.0) and not rounds.in_flight
    assert bus.commands.get("round") is None and clock.last == 2.0
    assert rounds.samples == {"worker-0": [10], "worker-1": [30]}
    assert not rounds.finished(done, 3.0)             # a repeat is not a second round


def test_a_long_jobs_round_and_backup_records_stay_bounded_and_aligned(metrics, monkeypatch):
    monkeypatch.setattr("roles.control.rounds.ROUND_SAMPLES_KEPT", 3)
    monkeypatch.setattr("roles.control.recovery.BACKUP_RECORDS_KEPT", 2)
    bus, clock = Bus(), ProgressClock(0.0)
    rounds = rounds_of(EveryMode(8), bus, metrics, clock)
    for r in range(1, 6):
        rounds.call("test")
        by = WORKERS if r < 4 else [*WORKERS, "worker-2"]  # a worker joins at round 4
        rounds.finished(RoundDone(round=r, contributors=by, samples_by=[r] * len(by),
                                  coefficient=1.0, samples=r * len(by)), float(r))
    assert rounds.done_count == 5
    assert rounds.samples == {"worker-0": [3, 4, 5], "worker-1": [3, 4, 5],
                              "worker-2": [0, 4, 5]}
    recovery = Recovery(job(), members("ps-0"), bus.commands, metrics, clock)
    for r in range(1, 5):
        recovery.backup_written("aggregator-0", BackupWritten(round=r, path=f"b{r}",
                                                              change=0.1))
    assert recovery.backups_written == 4 and [b["round"] for b in recovery.backups] == [3, 4]
    assert recovery.latest_backup() == "b4"


def test_round_mode_calls_drained_rounds_in_order_and_evaluates_the_last(metrics):
    bus = Bus()
    rounds = rounds_of(RoundMode(), bus, metrics, ProgressClock(0.0))
    rounds.drained(2)                                  # round 1 not drained yet: waits
    assert bus.of(Aggregate) == [] and rounds.round_for_eval() is None
    rounds.drained(1)
    assert [a.round for a in bus.of(Aggregate)] == [1]
    rounds.finished(RoundDone(round=1, contributors=[], samples_by=[], coefficient=0.0,
                              samples=0), 1.0)
    assert [a.round for a in bus.of(Aggregate)] == [1, 2]   # the queued one follows
    rounds.finished(RoundDone(round=2, contributors=[], samples_by=[], coefficient=0.0,
                              samples=0), 1.0)
    assert rounds.round_for_eval() == 2 and len(bus.of(Aggregate)) == 2  # no extra round


def test_every_mode_evaluates_after_one_more_round(metrics):
    bus = Bus()
    rounds = rounds_of(EveryMode(8), bus, metrics, ProgressClock(0.0))
    assert rounds.round_for_eval() is None            # called "end of epoch"
    (call,) = bus.of(Aggregate)
    assert call.reason == "end of epoch" and rounds.round_for_eval() is None
    rounds.finished(RoundDone(round=1, contributors=[], samples_by=[], coefficient=0.0,
                              samples=0), 1.0)
    assert rounds.round_for_eval() == 1


def test_lazy_mode_publishes_every_decision_and_a_refusal_once_per_interval(metrics):
    bus = Bus()
    m = members(*WORKERS)
    health = Health(ClusterConfig(), m, lambda node, probe: None)
    settings = dict(AggregationConfig().__dict__)
    lazy = LazyMode(8, health, lambda: settings, bus.sent.append, metrics, interval=1.0)
    rounds = Rounds(lazy, m, bus.commands, metrics, ProgressClock(0.0))
    rounds.ready("worker-0", RoundReady(round=1, steps=8 * 4, idle=False))
    rounds.call_if_due(10.0)
    rounds.call_if_due(10.5)                          # a refusal is not repeated yet
    (wait,) = bus.of(Decision)
    assert not wait.aggregate and "worker-1 0" in wait.reason and bus.of(Aggregate) == []
    rounds.ready("worker-1", RoundReady(round=1, steps=0, idle=True))  # nothing left
    rounds.call_if_due(10.6)
    assert [d.aggregate for d in bus.of(Decision)] == [False, True]
    assert [a.round for a in bus.of(Aggregate)] == [1]
    assert lazy.decisions == {"aggregate": 1, "wait": 1} and lazy.local_rounds == {}


def test_a_crashed_node_counts_in_the_failure_rate_over_all_nodes_until_the_window_passes():
    """Six nodes; worker-1 stops answering probes, is declared failed: it counts as failing
    (over all six) from its late probe until the window has passed its crash; ps-0 started
    again as a new process counts as a crash too."""
    m = members("feeder-0", "ps-0", "worker-0", "worker-1", "aggregator-0", "ps-1")
    health = Health(ClusterConfig(), m, lambda node, probe: None, failure_window_s=30.0)
    assert health.figures(0.0, probe_timeout_s=3.0)[1] == 0.0
    m.nodes["worker-1"].probe_pending_since = 1.0
    assert health.figures(4.5, 3.0)[1] == pytest.approx(1 / 6)   # late
    m.fail("worker-1", 10.0, "missed heartbeats")
    assert health.figures(10.0, 3.0)[1] == pytest.approx(1 / 6)  # crashed: still counted
    assert health.figures(39.0, 3.0)[1] == pytest.approx(1 / 6)
    assert health.figures(40.5, 3.0)[1] == 0.0                   # the window has passed
    m.admit("ps-0", "ps", 0, "h", 999, 41.0)                      # a new process: a crash
    m.mark_ready("ps-0", 41.0)
    assert health.figures(41.0, 3.0)[1] == pytest.approx(1 / 5)  # worker-1 is gone now
    assert health.figures(71.5, 3.0)[1] == 0.0


def test_a_whole_job_going_back_to_its_checkpoint_counts_no_node_as_failed():
    """A resume after every process was stopped: control's records name the old processes,
    every node comes back as a new one and the job goes back to its checkpoint. Planned:
    the failure rate stays 0 (it was 5/6 of the nodes, and lazy sync waited on it)."""
    nodes = ("feeder-0", "ps-0", "ps-1", "worker-0", "worker-1", "aggregator-0")
    m = members(*nodes)   # as the records left them: the old processes, live and ready
    health = Health(ClusterConfig(), m, lambda node, probe: None, failure_window_s=30.0)
    assert health.figures(0.0, probe_timeout_s=3.0)[1] == 0.0
    m.restart_all()
    for pid, node in enumerate(nodes[:3], start=1000):   # the first back before a look
        role, index = node.rsplit("-", 1)
        m.admit(node, role, int(index), "h", pid, 1.0)
        m.mark_ready(node, 1.0)
    assert health.figures(1.0, 3.0)[1] == 0.0
    for pid, node in enumerate(nodes[3:], start=2000):
        role, index = node.rsplit("-", 1)
        m.admit(node, role, int(index), "h", pid, 2.0)
        m.mark_ready(node, 2.0)
    assert health.figures(2.0, 3.0)[1] == 0.0
    m.admit("ps-1", "ps", 1, "h", 999, 3.0)   # a restart after that is a crash again
    assert health.figures(3.0, 3.0)[1] == pytest.approx(1 / 6)


def test_the_modes_say_what_each_allows():
    health = Health(ClusterConfig(), members(), lambda node, probe: None)
    modes = {name: sync_mode(name, 8, health=health, settings=dict, send=print,
                             metrics=None, interval=1.0)  # type: ignore[arg-type]
             for name in ("step", "every", "round", "lazy")}
    assert [n for n, m in modes.items() if m.rules.aggregator_recovers] == \
        ["every", "round", "lazy"]
    assert [n for n, m in modes.items() if not m.rules.feeder_restarts] == ["round"]
    assert [n for n, m in modes.items() if m.operator_rounds] == ["every", "lazy"]
    assert [n for n, m in modes.items() if not m.epoch_end_round] == ["round"]
    assert [n for n, m in modes.items() if not m.checkpoint_round] == ["round"]
    assert all(m.rules is SYNC_MODES[n] and m.name == n for n, m in modes.items())
    assert [n for n, m in modes.items() if m.last is not None or m.decision_counts() !=
            {"aggregate": 0, "wait": 0}] == []   # nothing decided yet, in any mode


PARTS = np.array([[0, 0, 0, 50, 0, 500, 0], [1, 0, 50, 50, 500, 1000, 0],
                  [2, 0, 100, 20, 1000, 1200, 1]], np.int64)


def feeding_of(bus: Bus, metrics: MetricsLog, *nodes: str) -> Feeding:
    f = Feeding(job(), members(*nodes), bus.commands, metrics, ProgressClock(0.0))
    f.indexed(DataIndex(n_train=100, oracle_aucs=[], body=PartMap.body_of([]), parts=PARTS))
    f.assign_parts()
    return f


def trained(parts: list[int], samples: int) -> EpochTrained:
    return EpochTrained(epoch=0, samples=samples, batches=1, loss_sum=float(samples),
                        weight_sum=float(samples), seconds=1.0, parts=parts,
                        rows=samples, rows_once=samples, rows_repeated=0, rows_missed=0,
                        rows_read=samples + 1, rejected=1, dropped=0, merged=0)


def stats(parts: list[int], rejected: int = 0) -> PartStats:
    rows = np.ones((len(parts), 3, 4))  # the synthetic job has 4 dense columns
    return PartStats(first_rejected="d.csv:7: bad" if rejected else "",
                     parts=np.array(parts, np.int64),
                     counts=np.array([[10, 10 - rejected, rejected, 0, 5] for _ in parts]),
                     moments=rows)


def test_feeding_assigns_parts_gathers_statistics_and_joins_the_parts_reports(metrics):
    bus = Bus()
    f = feeding_of(bus, metrics, "feeder-0", "feeder-1")
    (parts,) = bus.of(PartMap)
    assert parts.owners.tolist() == [0, 1, 0] and bus.commands.get("parts") is parts
    assert f.data["samples_in_data"] == 100 and f.data["eval_samples"] == 20
    assert f.stats_in(stats([0]), 1.0) is None      # part 1's statistics are still out
    got = f.stats_in(stats([1]), 2.0)
    assert isinstance(got, DataStats) and bus.commands.get("stats") is got
    assert got.newest == 5 and (got.rows_read, got.rejected) == (20, 0)
    assert f.trained(trained([0], 50), 1.0) is None   # part 1 still out
    figures = f.trained(trained([1], 50), 2.0)
    assert figures is not None and figures.samples == 100 and figures.loss == 1.0
    assert figures.rows == {"rows": 100, "rows_once": 100, "rows_repeated": 0,
                            "rows_missed": 0}
    assert (f.data["rows_read"], f.data["rejected_rows"]) == (102, 2)
    scores = TaskScores()
    scores.add(np.array([0, 1]), np.array([0.2, 0.9]))
    got = f.evaluated(eval_report(scores), 3.0)
    assert got is not None and got[1] is None   # (no [metrics] group_by)
    figures = got[0].record(["label"])
    assert (figures["auc"], figures["logloss"], got[0].rows) == \
        (1.0, pytest.approx(0.164, abs=1e-3), 2)
    assert figures["tasks"]["label"]["calibration"] == pytest.approx(1.1)


def eval_report(scores: TaskScores) -> EvalReport:
    """Part 2's eval report of two rows (without the GAUC's rows)."""
    return EvalReport(epoch=0, parts=[2], rows_read=2, rejected=0, scored=scores.rows,
                      group_level=0,
                      counts=scores.counts(), loss_sums=scores.loss_sums(),
                      prob_sums=scores.prob_sums(), groups=np.zeros(0, np.int64),
                      group_labels=np.zeros(0, np.float32), group_probs=np.zeros(0, np.float32))


def test_too_many_rejected_rows_stop_the_job_with_the_first_one(metrics):
    bus = Bus()
    f = feeding_of(bus, metrics, "feeder-0")
    f.stats_in(stats([0], rejected=5), 1.0)
    why = f.stats_in(stats([1], rejected=5), 1.0)
    assert isinstance(why, str) and "10 of the first 20 rows read rejected" in why
    assert "d.csv:7: bad" in why and bus.of(DataStats) == []


def test_a_lost_feeders_part_resumes_from_its_last_progress(metrics):
    bus = Bus()
    f = feeding_of(bus, metrics, "feeder-0", "feeder-1")
    f.progressed("feeder-1", FeederProgress(
        epoch=0, batches_acked=7, parts=[1], low=[5], above=[[7, 9]], samples=[70],
        loss_sum=[35.0], weight_sum=[70.0]))
    assert f.feeder_lost("feeder-1", "silent", 4.0, epoch=0, phase="training", restarts=True)
    new = bus.of(PartMap)[-1]
    assert new.version == 1 and new.owners.tolist() == [0, 0, 0]
    assert new.resume["1"] == {"epoch": 0, "phase": "training", "reported": False, "low": 5,
                               "above": [7, 9], "samples": 70, "loss_sum": 35.0,
                               "weight_sum": 70.0}
    assert f.lost[0]["acked_batches"] == {"1": 7}
    assert f.members.nodes["feeder-1"].status == "failed"


def test_the_only_feeder_is_waited_for_unless_the_mode_cannot_restart_it(metrics):
    bus = Bus()
    f = feeding_of(bus, metrics, "feeder-0")
    assert not f.feeder_lost("feeder-0", "silent", 1.0, epoch=0, phase="training",
                             restarts=False)
    assert f.feeder_lost("feeder-0", "silent", 1.0, epoch=0, phase="training", restarts=True)
    assert f.down == {"feeder-0": 1.0}
    f.feeder_back("feeder-0", 3.5, epoch=0, phase="training")
    (back,) = bus.of(FeederBack)
    assert (back.feeder, back.generation) == (0, 1) and f.recoveries[0]["down_s"] == 2.5


def test_a_restored_aggregator_ends_its_recovery_and_late_restarts_fail_the_job(metrics):
    bus, clock = Bus(), ProgressClock(0.0)
    r = Recovery(job(recovery_timeout_s=10.0), members("ps-0"), bus.commands, metrics, clock)
    r.aggregator_down(1.0)
    r.restore(round_=4)
    assert not r.restored(Restored(generation=0, round=4), 2.0, False)  # an older restore
    assert r.restored(Restored(generation=1, round=4), 3.0, True)
    assert r.aggregator_lost_at is None and r.recoveries[0]["seconds"] == 2.0
    assert clock.last == 3.0
    r.shard_silent("ps-0", "silent", 5.0)
    assert r.overdue(15.0, {}) is None
    assert r.overdue(15.5, {}) == "ps-0 did not come back within recovery_timeout_s = 10 s"
    assert r.overdue(1.0, {"feeder-0": 0.0}) is None


def test_a_restarted_shard_says_what_it_came_back_with_and_every_recovery_is_counted(
        metrics, caplog):
    bus = Bus()
    r = Recovery(job(), members("ps-0", "ps-1"), bus.commands, metrics, ProgressClock(0.0))
    before = members("ps-0").nodes["ps-0"]
    for node, info in (("ps-0", {"restored": False, "updates_lost": 12}),
                       ("ps-1", {"restored": True, "checkpoint": 3, "checkpoint_age_s": 4.25,
                                 "updates_lost": 7})):
        r.shard_silent(node, "silent", 1.0)
        r.shard_restarting(node, before, 2.0)
        r.shard_back(node, info, 3.0)
    said = [rec.getMessage() for rec in caplog.records if "is back after" in rec.getMessage()]
    assert said == ["ps-0 is back after 2.0 s with no checkpoint to restore (none was complete)"
                    ": its table starts empty, 12 embedding updates lost",
                    "ps-1 is back after 2.0 s from checkpoint 3, 4.2 s old: 7 embedding "
                    "updates lost"], said
    r.aggregator_down(4.0)
    r.restore(round_=4)
    assert r.restored(Restored(generation=1, round=4), 5.0, True)
    counts = recovery_counts(aggregator=r.recoveries, shard=r.shard_recoveries, feeder=[{}],
                             feeder_handover=[], rollback=[{}, {}])
    assert counts == {"aggregator": 1, "shard": 2, "feeder": 1, "feeder_handover": 0,
                      "rollback": 2}


def test_the_last_lines_say_what_the_job_recovered_from():
    s = {"shard_recoveries": [{"shard": "ps-1", "restored": True, "updates_lost": 1200},
                              {"shard": "ps-0", "restored": False, "updates_lost": None}],
         "recovery": [{"round": 9, "backup_round": 7}],
         "parts": {"feeder_recoveries": [{}], "feeders_lost": []},
         "checkpoints": {"rollbacks": [{"checkpoint": 4, "retrained_samples": 5000}]}}
    assert recovery_line(s) == (
        "recovered from 2 shard restarts (ps-0, ps-1: 1,200 embedding updates lost); "
        "1 aggregator restore (from its backups: 2 rounds of dense updates lost); "
        "1 feeder restart (nothing lost); 1 whole-job restart (back to checkpoint 4: 5,000 "
        "samples trained again)")
    assert recovery_line({"shard_recoveries": [], "recovery": [], "parts": None,
                          "checkpoints": {"rollbacks": []}}) == ""


def test_the_summary_holds_every_part_and_reads_back_checked(tmp_path, metrics):
    """The summary built from control's components has every key of its layout, reads back
    as written, and a summary whose key vanished or changed type is refused in one line naming
    it."""
    bus, clock = Bus(), ProgressClock(0.0)
    j = job(epochs=1)
    m = members("feeder-0", "feeder-1", "ps-0", "aggregator-0", *WORKERS)
    rounds = Rounds(EveryMode(8), m, bus.commands, metrics, clock)
    feeding = feeding_of(bus, metrics, "feeder-0", "feeder-1")
    exports = Exports(j, tmp_path, "run", bus.commands, metrics)
    course = Course(j, bus.commands, metrics, rounds, feeding, exports, clock)
    parts = ControlComponents(
        m, bus.commands, course, rounds, feeding,
        Recovery(j, m, bus.commands, metrics, clock), exports,
        LiveSettings(j.aggregation, tmp_path / "config.toml", bus.commands, metrics),
        PlacementKeeper(j, m, bus.commands, metrics, tmp_path, clock),
        Checkpoints(j, store_of(tmp_path), m, bus.commands, rounds, metrics, clock,
                    lambda n: {}))
    counters = {"feeder-0": {"samples_acked": 60, "acked_by": {"worker-0": 60},
                             "held_mb": 1.5},
                "worker-0": {"samples_trained": 60, "uptime_s": 2.0, "idle_s": 1.0,
                             "device": "cpu", "waiting_s": {"grant": 0.5},
                             "batches_trained": 3},
                "ps-0": {"keys": 7, "table": {"rows": 7}}}
    summary = run_summary(parts, j, "failed", "ps-0: bad data", resume_from=None,
                          counters=counters, wall_s=2.5, model_plan=None,
                          stalls=Stalls(5.0, 1.0, 0.0))
    path = write_summary(tmp_path, summary, None)
    s = read_summary(tmp_path)
    assert list(s) == list(summary) and set(s) == set(typing.get_type_hints(Summary))
    assert s == orjson.loads(path.read_bytes())
    assert (s["status"], s["samples_trained"], s["workers"]) == \
        ("failed", 60, {"worker-0": 60, "worker-1": 0})
    assert s["feeders"]["feeder-0"]["held_mb"] == 1.5 and s["busy"]["worker-0"] == 0.5
    assert s["tables"]["total"]["rows"] == 7 and s["parts"]["parts"] == len(PARTS)
    for broken in ({k: v for k, v in s.items() if k != "auc"}, {**s, "samples_trained": "60"},
                   {**s, "checkpoints": {**s["checkpoints"], "complete": None}}):
        path.write_bytes(orjson.dumps(broken))
        with pytest.raises(SummaryError) as refused:
            read_summary(path)
        said = str(refused.value)
        assert "\n" not in said and str(path) in said
        assert any(k in said for k in ("`auc`", "$.samples_trained", "$.checkpoints.complete"))


def test_live_settings_apply_all_or_nothing_and_are_appended_to_the_config(tmp_path,
                                                                           metrics):
    bus = Bus()
    config = tmp_path / "config.toml"
    config.write_text("# job\n")
    s = LiveSettings(AggregationConfig(), config, bus.commands, metrics)
    ok, message = s.change({"net_util_max": 0.5, "min_local_rounds": 99}, "ops")
    assert not ok and "min_local_rounds" in message and s.version == 0
    assert bus.sent == [] and config.read_text() == "# job\n"
    ok, message = s.change({"net_util_max": "0.5"}, "ops")
    assert ok and message == "applied: net_util_max = 0.5" and s["net_util_max"] == 0.5
    (published,) = bus.of(Settings)
    assert published.version == 1 and bus.commands.get("settings") is published
    assert "by ops: [aggregation] net_util_max = 0.5" in config.read_text()


@pytest.mark.parametrize("export", [True, False])
def test_an_epoch_runs_its_course_to_the_export(tmp_path, metrics, export):
    """... or, with [checkpoint] export = false, to the finish (no export asked for, and an
    operator's refused)."""
    bus, clock = Bus(), ProgressClock(0.0)
    j = dataclasses.replace(job(epochs=1), checkpoint=CheckpointConfig(export=export))
    rounds = Rounds(EveryMode(8), members(*WORKERS), bus.commands, metrics, clock)
    feeding = feeding_of(bus, metrics, "feeder-0", "feeder-1")
    exports = Exports(j, tmp_path, "run", bus.commands, metrics)
    course = Course(j, bus.commands, metrics, rounds, feeding, exports, clock)
    course.start_epoch(0, 1.0)
    assert [m.epoch for m in bus.of(EpochStart)] == [0] and course.phase == "training"
    course.trained(trained([0, 1], 100), 2.0)
    assert course.phase == "syncing" and bus.of(Evaluate) == []  # the end-of-epoch round
    rounds.finished(RoundDone(round=1, contributors=WORKERS, samples_by=[50, 50],
                              coefficient=1.0, samples=100), 3.0)
    course.sync_for_eval()
    (evaluate,) = bus.of(Evaluate)
    assert (evaluate.epoch, evaluate.round, course.phase) == (0, 1, "evaluating")
    scores = TaskScores()
    scores.add(np.array([0, 1]), np.array([0.3, 0.6]))
    course.evaluated(eval_report(scores), 4.0)
    assert course.epochs[0]["auc"] == 1.0 and course.epochs[0]["train_samples"] == 100
    if export:
        assert course.phase == "exporting" and exports.current is not None
        assert bus.of(Export)[0].dir == str(tmp_path / "export")   # the run directory
        return
    assert course.phase == "finishing" and exports.current is None and bus.of(Export) == []
    parts = SimpleNamespace(checkpoints=None, course=course, rounds=rounds, recovery=None,
                            settings=None, commands=bus.commands)   # what "export" reads
    operators = Operators(parts, metrics, clock, lambda: None)  # type: ignore[arg-type]
    ok, message = operators.handle("export", {}, "ops", 5.0)
    assert not ok and "[checkpoint] export = false" in message


def test_an_export_goes_beside_the_checkpoints_when_they_are_in_an_object_store(tmp_path,
                                                                                 metrics):
    """Every node writes its part of the export where control says: with [checkpoint] dir in
    a bucket and no export_dir, there (one place every node reaches), not into each node's
    own run directory."""
    bus = Bus()
    bucket = "s3://zbus-test/run-1/checkpoints"
    for checkpoint, where in [(CheckpointConfig(dir=bucket), f"{bucket}/export"),
                              (CheckpointConfig(dir=bucket, export_dir="s3://b/x"),
                               "s3://b/x/export"),
                              (CheckpointConfig(dir=str(tmp_path / "c")),
                               str(tmp_path / "run" / "export"))]:
        exports = Exports(dataclasses.replace(job(), checkpoint=checkpoint), tmp_path / "run",
                          "run", bus.commands, metrics)
        assert exports.start(final=True, now=1.0) == where
        assert bus.of(Export)[-1].dir == where


def test_the_state_records_round_trip_and_refuse_another_job(tmp_path):
    from roles.control.course import CourseState
    from roles.control.feeding import FeedingState
    from roles.control.recovery import RecoveryState
    from roles.control.rounds import RoundsState
    from roles.control.settings import SettingsState

    job = Job(data=DataConfig(source="synthetic"), train=TrainConfig(epochs=3))
    (tmp_path / "config.toml").write_text(job_to_toml(job))  # the run's effective job
    state = ControlState(run_id="r", started_at=1.5, fingerprint=job.fingerprint(),
                         course=CourseState("training", 2), rounds=RoundsState(7, True, 6),
                         feeding=FeedingState(1, ["feeder-0"]),
                         recovery=RecoveryState(shards_back={"ps-1": 40}),
                         settings=SettingsState({"net_util_max": 0.3}, 2), export_request=1,
                         members_version=3, nodes={"ps-1": ["ps", 1, "h", 9, "alive", True]},
                         standing={})
    history = ControlHistory(epochs=[{"epoch": 0}], round_samples={"w": [1]})
    write_records(tmp_path, state, history)
    got, got_history = read_state(tmp_path, job)
    assert got == state and got_history.round_samples == {"w": [1]}
    # another job: the refusal names the settings that differ from the run's config.toml
    other = Job(data=DataConfig(source="synthetic"), train=TrainConfig(epochs=2, batch_size=64))
    with pytest.raises(ResumeError, match="another job") as refused:
        read_state(tmp_path, other)
    assert "[train] epochs = 3 in the run, 2 now" in str(refused.value), refused.value
    assert "[train] batch_size = 256 in the run, 64 now" in str(refused.value), refused.value
    broken = orjson.loads((tmp_path / "control-state.json").read_bytes())
    del broken["rounds"]
    (tmp_path / "control-state.json").write_bytes(orjson.dumps(broken))
    with pytest.raises(ResumeError, match="incomplete"):
        read_state(tmp_path, job)
    # a run that ended: the refusal says how, and an interrupted one why it cannot go on
    write_records(tmp_path, dataclasses.replace(state, course=CourseState("done", 2)), history)
    (tmp_path / "summary.json").write_bytes(orjson.dumps(
        {"status": "interrupted", "reason": "control received SIGINT", "resume_from": None}))
    with pytest.raises(ResumeError) as ended:
        read_state(tmp_path, job)
    assert str(ended.value) == ("run r has ended; there is nothing to resume (interrupted: "
                                "control received SIGINT, before its first complete "
                                "checkpoint)")
    # the state file says a run directory holds records to resume: written after the history,
    # so that a write that fails leaves no state without its history (a pod's control that
    # failed before its first save of both could not start again)
    torn = tmp_path / "torn"
    (torn / HISTORY_FILE).mkdir(parents=True)   # the history cannot be written there
    with pytest.raises(OSError):
        write_records(torn, state, history)
    assert not (torn / STATE_FILE).exists()


# -- checkpoints ---------------------------------------------------------------------------------
def checkpoints_of(tmp_path: Path, bus: Bus, metrics: MetricsLog, mode: SyncMode,
                   **config) -> tuple[Checkpoints, Rounds]:
    m = members("feeder-0", "feeder-1", "ps-0", "aggregator-0", *WORKERS)
    rounds = Rounds(mode, m, bus.commands, metrics, ProgressClock(0.0))
    j = Job(data=DataConfig(source="synthetic"), cluster=ClusterConfig(workers=2, feeders=2),
            checkpoint=CheckpointConfig(**{"every_s": 10.0, "timeout_s": 30.0, **config}))
    return Checkpoints(j, store_of(tmp_path), m, bus.commands, rounds, metrics, ProgressClock(0.0),
                       lambda n: {"control-state.json": b"{}"}), rounds


def written(node: str, number: int, tmp_path: Path) -> CheckpointPart:
    name = f"{number:06d}/{node}.bin"
    (tmp_path / "checkpoints" / name).write_bytes(b"part")
    return CheckpointPart(number=number, ok=True, error="", files=[name], bytes=4,
                          write_s=0.1, info={"kind": "full"})


WRITERS = ("feeder-0", "feeder-1", "ps-0", "aggregator-0")


def test_a_checkpoint_drains_flushes_writes_resumes_then_completes(tmp_path, metrics):
    bus = Bus()
    ck, rounds = checkpoints_of(tmp_path, bus, metrics, EveryMode(8))
    ck.training_started(0.0)
    ck.tick(5.0, None)
    assert ck.cut is None            # not due yet
    ck.tick(10.0, None)
    assert bus.of(Checkpoint)[-1].phase == "drain"
    ck.drained("feeder-0", CheckpointDrained(number=1), 10.1)
    assert not bus.of(Aggregate)     # one feeder still has batches in flight
    ck.drained("feeder-1", CheckpointDrained(number=1), 10.2)
    (flush,) = bus.of(Aggregate)     # every worker's progress into the aggregator
    assert flush.reason == "checkpoint 1" and flush.participants == WORKERS
    ck.members.nodes["aggregator-0"].counters["waiting_for"] = {
        "round": flush.round, "workers": WORKERS[1:], "aggregators": []}
    assert ck.task(10.25)["task"] == ("checkpoint 1: a round brings the workers' progress in "
                                      f"(round {flush.round} waits for {WORKERS[1]})")
    assert bus.of(Checkpoint)[-1].phase == "drain"
    rounds.finished(RoundDone(round=flush.round, contributors=WORKERS, samples_by=[1, 1],
                              coefficient=2.0, samples=2), 10.3)
    ck.round_finished(flush.round, 10.3)
    cut = bus.of(Checkpoint)[-1]
    assert cut.phase == "write" and cut.round == flush.round
    for node in WRITERS[:-1]:
        ck.snapshotted(node, Snapshotted(number=1, pause_s=0.01, waited_s=0.0), 10.4)
    assert bus.of(Checkpoint)[-1].phase == "write"  # the aggregator has not copied yet
    ck.part("feeder-0", written("feeder-0", 1, tmp_path), 10.4)  # a fast writer
    ck.snapshotted("aggregator-0", Snapshotted(number=1, pause_s=0.0, waited_s=0.0), 10.5)
    assert bus.of(Checkpoint)[-1].phase == "resume"  # feeding goes on while files are written
    assert ck.complete == 0
    for node in WRITERS[1:]:
        ck.part(node, written(node, 1, tmp_path), 11.0)
    assert ck.complete == 1 and ck.cut is None
    manifest = read_manifest(checkpoint_dir(tmp_path, 1))
    assert set(manifest["parts"]) == {*WRITERS, "control"}
    assert manifest["round"] == flush.round
    (record,) = ck.records
    assert record["status"] == "complete" and record["pause_s"] == 0.5
    ck.tick(20.9, None)
    assert ck.cut is None            # every_s from the end of the last one
    ck.tick(21.0, None)
    assert ck.cut is not None and ck.cut.number == 2


def test_a_checkpoint_cut_short_by_an_epochs_end_is_taken_again_once_the_next_one_trains(
        tmp_path, metrics):
    """Epochs about as long as every_s: each cut would begin near an epoch's end and be
    abandoned there; the next one begins as soon as the job trains again, not every_s on."""
    bus = Bus()
    ck, _ = checkpoints_of(tmp_path, bus, metrics, EveryMode(8))
    ck.training_started(0.0)
    ck.tick(10.0, None)
    assert ck.cut is not None and ck.cut.number == 1
    ck.tick(10.5, "the job is not training an epoch (phase syncing)")
    assert ck.cut is None and ck.records[-1]["status"] == "aborted"
    ck.tick(10.6, "the job is not training an epoch (phase syncing)")
    assert ck.cut is None                        # not while the epoch ends
    ck.tick(10.7, None)                          # the next epoch trains: at once
    assert ck.cut is not None and ck.cut.number == 2


def test_a_new_cut_takes_no_number_whose_directory_is_on_disk(tmp_path, metrics):
    """After a run went back to checkpoint 3, the directories of the cuts it abandoned (4, and 5
    killed half-written) are on disk: the next cut is 6, and their files stay out of it."""
    bus = Bus()
    ck, _ = checkpoints_of(tmp_path, bus, metrics, EveryMode(8))
    ck.number = ck.complete = 3
    for number in (4, 5):
        stale = checkpoint_dir(tmp_path, number)
        stale.mkdir(parents=True)
        (stale / "ps-0.delta.npz").write_bytes(b"of the run that died")
    ck.request("zbus-ctl", None)
    ck.tick(1.0, None)
    assert ck.cut is not None and ck.cut.number == 6
    assert bus.of(Checkpoint)[-1].number == 6 and not any(Path(ck.cut.dir).iterdir())


def test_a_checkpoint_is_abandoned_when_a_part_fails_a_writer_dies_or_time_runs_out(
        tmp_path, metrics):
    bus = Bus()
    ck, rounds = checkpoints_of(tmp_path, bus, metrics, RoundMode())
    ck.request("zbus-ctl", None)
    ck.tick(1.0, None)
    for f in ("feeder-0", "feeder-1"):
        ck.drained(f, CheckpointDrained(number=1), 1.1)
    assert bus.of(Checkpoint)[-1].phase == "write" and not bus.of(Aggregate)  # mode round
    ck.part("ps-0", CheckpointPart(number=1, ok=False, error="disk full", files=[], bytes=0,
                                   write_s=0.0, info={}), 1.2)
    assert bus.of(Checkpoint)[-1].phase == "abort" and ck.complete == 0
    assert "disk full" in ck.records[-1]["why"]
    ck.request("zbus-ctl", None)
    ck.tick(2.0, None)
    ck.members.fail("ps-0", 2.1, "gone")
    ck.tick(2.2, None)
    assert bus.of(Checkpoint)[-1].phase == "abort" and "ps-0 lost" in ck.records[-1]["why"]
    ck.request("zbus-ctl", None)
    ck.tick(3.0, None)
    ck.tick(3.0 + 31.0, None)
    assert bus.of(Checkpoint)[-1].phase == "abort" and "timeout_s" in ck.records[-1]["why"]
    assert ck.request("zbus-ctl", "the job is not training") == (
        False, "not now: the job is not training")


def test_a_run_path_is_shown_relative_below_the_working_directory_else_absolute(
        tmp_path, monkeypatch):
    """'summary in runs/x/summary.json' under the repository; a run elsewhere (ZBUS_RUN_DIR in
    /tmp) absolute, not '../../tmp/...'."""
    (tmp_path / "here" / "runs" / "x").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert shown(tmp_path / "here" / "runs" / "x" / "summary.json") == "runs/x/summary.json"
    assert shown(tmp_path / "elsewhere" / "summary.json") == \
        str(tmp_path / "elsewhere" / "summary.json")
