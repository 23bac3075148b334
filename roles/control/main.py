"""``zbus-control`` (``python -m roles.control``): start control on a new run, or on a run
whose control died (``--resume``); it prints the run's headline when the job ends."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from roles.control.process import Control
from roles.control.state import ResumeError, resumable_run
from roles.job.cli import load_job_or_exit, parse_role_args
from roles.job.rundir import shown
from roles.job.summary import Summary
from roles.storage.fs import StorageError
from zbus.endpoints import CONTROL_ID
from zbus.logs import setup_logging, to_file, to_run_dir
from zbus.node import install_signals


def headline(s: Summary, path: Any) -> list[str]:
    """The run's last lines: how it ended, what it recovered from, how to resume it."""
    lines = []
    st = s.get("stream")
    if s["ok"] and st is not None:
        auc, loss = st["progressive_auc"], st["progressive_logloss"]
        scored = f"progressive auc {auc:.4f}, logloss {loss:.4f}" if auc is not None \
            else "no event scored"
        lag = "unknown" if st["lag_events"] is None else f"{st['lag_events']} events"
        lines.append(f"zbus: job {s['job']} completed in {s['wall_s']:.1f} s: {scored}")
        lines.append(f"zbus: {st['events_trained']} events trained, {st['events_rejected']} "
                     f"rejected, lag {lag}; ended: {st['ended_by'] or 'stopped'}")
    elif s["ok"]:
        oracle = f" (oracle {s['oracle_auc']:.4f})" if s["oracle_auc"] else ""
        lines.append(f"zbus: job {s['job']} completed in {s['wall_s']:.1f} s: auc "
                     f"{s['auc']:.4f}{oracle}, logloss {s['logloss']:.4f}")
        workers = ", ".join(f"{w} {n}" for w, n in s["workers"].items())
        rate = s["samples_per_s"] or 0
        lines.append(f"zbus: {s['samples_trained']} samples trained at {rate:,.0f}/s "
                     f"({workers}); {s['rejected_rows'] or 0} rows rejected")
    else:
        lines.append(f"zbus: job {s['job']} {s['status']}: {s['reason']}")
    recovered = recovery_line(s)
    if recovered:
        lines.append(f"zbus: {recovered}")
    if s["resume_from"] is not None:
        run = shown(s["run_dir"])
        # the run's config.toml is the effective job (every ZBUS_* setting of the job in it;
        # live changes come back from control's records): nothing to remember
        lines.append(f"zbus: to go on from checkpoint {s['resume_from']}: "
                     f"ZBUS_JOB={run}/config.toml ZBUS_RESUME={run} scripts/start")
    elif s["status"] == "interrupted":
        every = s["checkpoints"]["every_s"]
        when = f"the first is taken [checkpoint] every_s = {every:g} s into training" if every \
            else "[checkpoint] every_s = 0: only when asked"
        lines.append(f"zbus: no checkpoint was complete, so it cannot be resumed ({when})")
    lines.append(f"zbus: summary in {shown(path)}")
    return lines


def recovery_line(s: Summary) -> str:
    """What the job recovered from and what that cost, in one line ("" when nothing)."""
    said = []
    shards = s["shard_recoveries"]
    if shards:
        lost = [r["updates_lost"] for r in shards if r.get("restored")]
        known = sum(n for n in lost if isinstance(n, int))
        names = ", ".join(sorted({r["shard"] for r in shards}))
        cost = f"{known:,} embedding updates lost" if lost else "no checkpoint to restore"
        if None in lost:
            cost += " and more not counted (a shard came back without its log of applied batches)"
        said.append(f"{count(len(shards), 'shard restart')} ({names}: {cost})")
    aggregator = s["recovery"]
    if aggregator:
        rounds = sum(r["round"] - r["backup_round"] for r in aggregator
                     if isinstance(r.get("backup_round"), int))
        said.append(f"{count(len(aggregator), 'aggregator restore')} (from its backups: "
                    f"{count(rounds, 'round')} of dense updates lost)")
    parts = s["parts"]
    feeders = parts["feeder_recoveries"] if parts else []
    if feeders:
        said.append(f"{count(len(feeders), 'feeder restart')} (nothing lost)")
    handed = parts["feeders_lost"] if parts else []
    if handed:
        said.append(f"{count(len(handed), 'lost feeder')} (parts handed over: up to a "
                    "heartbeat of batches trained twice)")
    rollbacks = s["checkpoints"]["rollbacks"]
    if rollbacks:
        again = sum(r.get("retrained_samples") or 0 for r in rollbacks)
        numbers = ", ".join(str(r["checkpoint"]) for r in rollbacks)
        said.append(f"{count(len(rollbacks), 'whole-job restart')} (back to checkpoint"
                    f"{'s' if len(rollbacks) > 1 else ''} {numbers}: {again:,} samples trained "
                    "again)")
    return "recovered from " + "; ".join(said) if said else ""


def count(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def headline_also_in_log(s: Summary, path: Any) -> None:
    """The headline on stdout, and at the end of control's log file (``zbus.logs``)."""
    text = "".join(line + "\n" for line in headline(s, path))
    sys.stdout.write(text)
    sys.stdout.flush()
    to_file(text)


def main(argv: list[str] | None = None) -> None:
    args = parse_role_args("control", argv)
    job = load_job_or_exit(args.job, "control")
    setup_logging(CONTROL_ID)
    try:
        resume = resumable_run(job.name, args.resume, dict(os.environ)) if args.resume \
            else None
        control = Control(job, resume=resume, headline=headline_also_in_log)
    except (OSError, ResumeError, StorageError) as exc:
        print(f"zbus control: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    to_run_dir(control.run_dir, CONTROL_ID)
    install_signals(control)
    code = control.run()
    # Everything is written (the summary and state atomically, metrics.jsonl closed): the
    # interpreter's last garbage collection need not hold the exit up.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
