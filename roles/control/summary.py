"""The run's summary (``summary.json``) from control's components; the figures themselves are
assembled in ``roles.algorithms.control.summary``."""

from __future__ import annotations

from roles.algorithms.control.summary import build_summary
from roles.control.recovery import recovery_counts
from roles.control.state import ControlComponents
from roles.job.settings import Job


def run_summary(p: ControlComponents, job: Job, status: str, reason: str, *, counters: dict,
                wall_s: float, model_plan: dict | None) -> dict:
    r, mode = p.recovery, p.rounds.mode
    last = mode.last
    return build_summary(
        job=job, run_id=p.exports.run_id, run_dir=str(p.exports.run_dir), status=status,
        reason=reason, data=p.feeding.data, epochs=p.course.epochs, counters=counters,
        wall_s=wall_s, rounds=p.rounds.done_count, round_samples=p.rounds.samples,
        membership=p.members.events,
        model={"backups": r.backups, "backups_written": r.backups_written,
               "latest_backup": r.latest_backup() or None,
               "recoveries": r.recoveries,
               "recovered": recovery_counts(
                   aggregator=r.recoveries, shard=r.shard_recoveries,
                   feeder=p.feeding.recoveries, feeder_handover=p.feeding.lost,
                   rollback=p.checkpoints.rollbacks),
               "shard_recoveries": r.shard_recoveries, "exports": p.exports.exports,
               "settings_changes": p.settings.changes, "settings": p.settings.values,
               "decisions": mode.decision_counts(), "last_decision": last.reason if last else None},
        placement=p.placement.summary(), model_plan=model_plan, parts=p.feeding.summary(),
        checkpoints=p.checkpoints.summary())
