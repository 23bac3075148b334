"""Control's side of operators: the request endpoint (``zbus-ctl``, the console) with its
actions and the live settings (``roles.algorithms.live``), and the status it publishes for consoles
every ``status_s`` (``roles.algorithms.status``). ``Operators`` is a part of
``roles.control.Control`` (a mixin over its state), kept here to keep each module readable.

Actions: ``settings`` (read), ``set`` (live settings, all or none), ``export``, ``backup``,
``aggregate`` (a round now: sync modes every and lazy, while training), ``pause`` / ``resume``
(the feeder sends no new batch while paused; the stall timer does not run), ``stop`` (the job
ends as ``stopped``: nodes send their final counters, control writes the summary and exits 0).
"""

from __future__ import annotations

import logging
import time

from roles.algorithms import live
from roles.job.rundir import atomic_write
from roles.model.files import newest_backup
from roles.protocol.dense_sync import BackupNow
from roles.protocol.operator import (
    ACTIONS,
    STATUS_LAYOUT,
    ControlReply,
    ControlRequest,
    Feeding,
    Settings,
    Status,
)

log = logging.getLogger(__name__)


class Operators:
    """Requests of operators, and the status they watch."""

    def on_request(self, identity: bytes | None, env) -> None:
        match env.msg:
            case ControlRequest(action=action, changes=changes):
                ok, message = self.handle_request(action, changes, env.sender)
                log.info("request %s from %s: %s", action, env.sender,
                         message if ok else f"refused: {message}")
            case _:
                ok, message = False, f"{type(env.msg).__name__} is not a request"
                self.unexpected(env, "request endpoint")
        self.send(self.requests, ControlReply(ok=ok, message=message,
                                              settings=dict(self.settings)),
                  identity=identity)

    def handle_request(self, action: str, changes: dict, sender: str) -> tuple[bool, str]:
        running = self.phase in ("training", "syncing", "evaluating")
        match action:
            case "settings":
                return True, f"settings version {self.settings_version}"
            case "set":
                try:
                    new = live.apply(self.settings, changes)
                except live.SettingError as exc:
                    log.warning("refused a settings change from %s: %s", sender, exc)
                    return False, str(exc)
                return True, self.apply_settings(new, sender)
            case "export" if running and self.export is None:
                return True, f"exporting to {self.start_export(final=False)}"
            case "export":
                return False, f"cannot export now (phase {self.phase}, " + \
                    ("an export is in progress)" if self.export else "not training)")
            case "backup" if running:
                self.backup_request += 1
                self.publish(BackupNow(request=self.backup_request), "backup")
                return True, "the aggregator backs up now"
            case "backup":
                return False, f"cannot back up now (phase {self.phase})"
            case "aggregate":
                return self.aggregate_now(sender)
            case "pause" | "resume":
                return self.set_paused(action == "pause", sender)
            case "stop" if self.phase not in ("finishing", "done"):
                log.warning("stop requested by %s", sender)
                self.metrics.write("stop", by=sender)
                self.finish(status=("stopped", f"stopped by {sender}"))
                return True, "the job stops: nodes send their final counters"
            case "stop":
                return False, f"the job is already ending (phase {self.phase})"
            case _:
                return False, f"unknown action {action!r}; actions: {', '.join(ACTIONS)}"

    def aggregate_now(self, sender: str) -> tuple[bool, str]:
        if self.sync not in ("every", "lazy"):
            return False, (f"sync mode {self.sync} decides its rounds itself "
                           "(aggregate now works in modes every and lazy)")
        if self.phase != "training":
            return False, f"not training (phase {self.phase})"
        if self.round_in_flight:
            return False, f"round {self.round} is still in flight"
        if self.aggregator_lost_at is not None or not self.members.live_workers():
            return False, "no aggregator or no live worker to aggregate with"
        self.issue_round(f"aggregate now: asked by {sender}")
        return True, f"round {self.round} called"

    def set_paused(self, paused: bool, sender: str) -> tuple[bool, str]:
        if self.phase in ("finishing", "done"):
            return False, f"the job is ending (phase {self.phase})"
        if paused == self.paused:
            return True, "feeding is already " + ("paused" if paused else "running")
        self.paused = paused
        self.last_progress = time.monotonic()
        self.publish(Feeding(paused=paused), "feeding")
        self.metrics.write("pause" if paused else "resume", by=sender)
        return True, "feeding " + ("paused" if paused else "resumed")

    def apply_settings(self, new: dict, sender: str) -> str:
        changed = {k: v for k, v in new.items() if self.settings[k] != v}
        self.settings = new
        self.settings_version += 1
        self.publish(Settings(version=self.settings_version, values=new), "settings")
        record = {"version": self.settings_version, "changes": changed, "by": sender}
        self.settings_changes.append(record)
        self.metrics.write("setting", **record)
        config = self.run_dir / "config.toml"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        lines = "".join(f"# live change {self.settings_version} at {stamp} by {sender}: "
                        f"[aggregation] {k} = {v!r}\n" for k, v in changed.items())
        atomic_write(config, config.read_bytes() + lines.encode())
        log.info("settings version %d from %s: %s", self.settings_version, sender,
                 ", ".join(f"{k} = {v}" for k, v in changed.items()) or "no change")
        self.maybe_aggregate()
        return "applied: " + (", ".join(f"{k} = {v}" for k, v in changed.items())
                              or "no change")

    # -- the status consoles watch ---------------------------------------------------------
    def publish_status(self, now: float) -> None:
        self.next_status = now + self.job.cluster.status_s
        self.status.tick(now, self.feeding_counters())
        self.send(self.status_pub, Status.of(self.run_id, self.snapshot(now)))

    def snapshot(self, now: float) -> dict:
        nodes, s, d = self.members.nodes, self.settings, self.last_decision
        net_util, failures = self.cluster_figures()
        return {
            "layout": STATUS_LAYOUT, "job": self.job.name, "run_id": self.run_id,
            "run_dir": str(self.run_dir), "phase": self.phase, "sync": self.sync,
            "paused": self.paused, "uptime_s": round(now - self.started, 1),
            "status_s": self.job.cluster.status_s, "heartbeat_s": self.heartbeat_s,
            "epoch": self.epoch, "epochs": self.job.train.epochs, "round": self.round,
            "round_in_flight": self.round_in_flight,
            "nodes": self.status.node_rows(nodes, now, s["probe_timeout_s"]),
            "cluster": {
                "net_util": round(net_util, 6), "net_util_max": s["net_util_max"],
                "failure_rate": round(failures, 6), "failure_rate_max": s["failure_rate_max"],
                "live_workers": len(self.members.live_workers()),
                "decision": None if d is None else {
                    "round": d.round, "aggregate": d.aggregate, "reason": d.reason,
                    "age_s": round(now - self.last_decision_at, 1)},
                "decisions": dict(self.decisions), "rounds_done": self.rounds_done,
                "backups": len(self.backups), "latest_backup": newest_backup(self.backups),
                "recoveries": len(self.recoveries)},
            "training": self.status.training(
                feeding=self.feeding_counters(), samples_per_epoch=self.data.get(
                    "samples_in_data", 0), epoch=self.epoch, epochs=self.job.train.epochs,
                epochs_done=self.epochs,
                running=self.phase in ("training", "syncing", "evaluating")),
            "settings": {"version": self.settings_version, "values": dict(s),
                         "ranges": live.describe()},
            "partition": {"embeddings": self.status.embeddings(nodes, self.placement_state()),
                          "model": self.model_plan},
        }
