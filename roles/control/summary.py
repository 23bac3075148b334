"""The run's summary (``summary.json``, laid out in ``roles.job.summary``) from control's
components, part by part: the figures from the nodes' counters are assembled in
``roles.algorithms.control.summary``; the parts here come from what the components hold."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson

from roles.algorithms.control import summary as figures
from roles.algorithms.control.membership import Members, Stalls
from roles.control.recovery import recovery_counts
from roles.control.rounds import Rounds
from roles.control.state import ControlComponents
from roles.job.settings import Job
from roles.job.summary import (
    SUMMARY_FILE,
    Aggregation,
    Exports,
    Nodes,
    Recoveries,
    Settings,
    Summary,
)
from roles.storage.fs import StorageError
from roles.storage.store import Store
from zbus.files import atomic_write

log = logging.getLogger(__name__)


def run_summary(p: ControlComponents, job: Job, status: str, reason: str, *,
                resume_from: int | None, counters: figures.Counters, wall_s: float,
                model_plan: dict | None, stalls: Stalls) -> Summary:
    """The summary of a run that ended with ``status`` (``reason``); ``counters``: every
    node's last counters, control's own too."""
    return {
        **figures.outcome(job, p.exports.run_id, str(p.exports.run_dir), status, reason,
                          resume_from),
        **figures.results(job, p.course.epochs, p.feeding.data),
        **figures.data_rows(p.feeding.data),
        **figures.throughput(job, p.course.epochs, counters, wall_s),
        **figures.feeding(job, counters, p.feeding.summary()),
        **figures.workers(job, counters),
        **figures.load(counters),
        **aggregation(job, p.rounds),
        **figures.exactly_once(counters),
        **nodes(p.members, stalls),
        **settings(p),
        **recoveries(p),
        **exports(p),
        **figures.traffic(counters),
        **figures.shards(job, counters, p.placement.summary(), model_plan),
        "stream": p.course.stream.summary(
            sum(e.get("rows_repeated", 0) for e in p.course.epochs),
            feeder_restarted=bool(p.feeding.recoveries)),
    }


def aggregation(job: Job, rounds: Rounds) -> Aggregation:
    mode = rounds.mode
    last = mode.last
    return {"sync": job.train.sync, "rounds": rounds.done_count, "round_samples": rounds.samples,
            "aggregation_decisions": mode.decision_counts(),
            "last_decision": last.reason if last else None}


def nodes(members: Members, stalls: Stalls) -> Nodes:
    return {"membership": members.events, "counters_not_final": members.not_final(),
            "stalls": list(stalls.events), "stalls_total": stalls.count}


def settings(p: ControlComponents) -> Settings:
    return {"settings": p.settings.values, "settings_changes": p.settings.changes}


def recoveries(p: ControlComponents) -> Recoveries:
    r = p.recovery
    recovered = recovery_counts(aggregator=r.recoveries, shard=r.shard_recoveries,
                                feeder=p.feeding.recoveries, feeder_handover=p.feeding.lost,
                                rollback=p.checkpoints.rollbacks)
    return {"backups": r.backups_written, "latest_backup": r.latest_backup() or None,
            # every recovery (the aggregator's, a shard's, a feeder's, the whole job's)
            "recoveries": sum(recovered.values()), "recovered": recovered,
            "recovery": r.recoveries, "shard_recoveries": r.shard_recoveries,
            "checkpoints": p.checkpoints.summary()}


def exports(p: ControlComponents) -> Exports:
    done = p.exports.exports
    return {"export": next((e["dir"] for e in reversed(done)
                            if e.get("final") and "error" not in e), None),
            "exports": done}


def write_summary(run_dir: Path, summary: Summary, beside_checkpoints: Store | None) -> Path:
    """The summary into the run directory, and into the checkpoint store when the job has one
    (``beside_checkpoints``: a pod whose disk is gone learns there that the run ended,
    ``zbus-pod``); its path in the run directory."""
    path = run_dir / SUMMARY_FILE
    data = orjson.dumps(summary, option=orjson.OPT_INDENT_2)
    atomic_write(path, data)
    if beside_checkpoints is not None:
        try:
            beside_checkpoints.put_bytes(SUMMARY_FILE, data)
        except (OSError, StorageError) as exc:
            log.warning("the summary is not in %s: %s", beside_checkpoints.root, exc)
    return path

