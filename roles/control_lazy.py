"""Control's side of sync mode lazy and of operators: the figures the aggregation decision rests
on (network utilisation from heartbeats, failure rate from probes), the decision itself
(``roles.decision``), and the request endpoint with the live settings (``roles.live``).
``LazyControl`` is a part of ``roles.control.Control`` (a mixin over its state), kept here to
keep each module readable.
"""

from __future__ import annotations

import logging
import time

from roles import live
from roles.decision import HostMeter, counted_interfaces, decide, failure_rate, utilisation
from roles.membership import ALIVE, NodeState
from roles.rundir import atomic_write
from zbus.wire import (
    BackupNow,
    ControlReply,
    ControlRequest,
    Decision,
    Probe,
    ProtocolError,
    Settings,
)

log = logging.getLogger(__name__)


class LazyControl:
    """The aggregation decision, probes, network metering and operators' requests."""

    def on_request(self, identity: bytes | None, env) -> None:
        match env.msg:
            case ControlRequest(action=action, changes=changes):
                ok, message = self.handle_request(action, changes, env.sender)
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
            case _:
                return False, (f"unknown action {action!r}; actions: settings, set, export, "
                               "backup")

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

    def meter_network(self, node: NodeState, load: dict) -> None:
        net, speeds = load.get("net"), load.get("speed", {})
        c = self.job.cluster
        try:
            nics = counted_interfaces(list(net), c.interfaces, c.single_host())
            self.hosts.setdefault(node.host, HostMeter()).update(
                time.monotonic(), net, speeds, nics, c.link_mbps)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError):
            raise ProtocolError("bad_field", "heartbeat load.net/speed are not "
                                             "{interface: [sent, received]} / {interface: "
                                             "Mbit/s}") from None

    def cluster_figures(self) -> tuple[float, float]:
        """(network utilisation, failure rate) of the cluster now."""
        now = time.monotonic()
        pending = [n.probe_pending_since for n in self.members.live_nodes()]
        return (utilisation(list(self.hosts.values())),
                failure_rate(pending, now, self.settings["probe_timeout_s"]))

    def decide(self, live_workers: list[str]) -> None:
        """Sync mode lazy: aggregate when the network is quiet, the cluster healthy and every
        worker has done its local rounds; publish the decision and its reason either way."""
        net_util, failures = self.cluster_figures()
        s = self.settings
        verdict = decide(net_util=net_util, failure_rate=failures,
                         local_rounds=self.local_rounds, idle=self.idle_workers,
                         workers=live_workers, net_util_max=s["net_util_max"],
                         failure_rate_max=s["failure_rate_max"],
                         min_local_rounds=s["min_local_rounds"])
        now = time.monotonic()
        if not verdict.aggregate and now < self.next_decision:
            return  # a refusal is published once per heartbeat interval
        self.next_decision = now + self.heartbeat_s
        decision = Decision(round=self.round + 1, aggregate=verdict.aggregate,
                            reason=verdict.reason, net_util=round(net_util, 6),
                            failure_rate=round(failures, 6),
                            local_rounds={w: self.local_rounds.get(w, 0) for w in live_workers})
        kind = "aggregate" if verdict.aggregate else \
            ";".join(b.split(" ")[0] for b in verdict.blockers)
        changed, self.last_decision_kind = kind != self.last_decision_kind, kind
        self.last_decision = decision
        self.decisions["aggregate" if verdict.aggregate else "wait"] += 1
        self.send(self.pub, decision)
        if changed and not verdict.aggregate:
            self.metrics.write("decision", round=decision.round, aggregate=False,
                               reason=verdict.reason, net_util=decision.net_util,
                               failure_rate=decision.failure_rate)
        if verdict.aggregate:
            self.issue_round(verdict.reason)

    def probe(self, now: float) -> None:
        """Probe every live node; one not answering within probe_timeout_s is failing."""
        self.next_probe = now + self.heartbeat_s
        self.probe_nonce += 1
        for node_id, node in self.members.nodes.items():
            if node.status == ALIVE and node.ready:
                node.probe_pending_since = node.probe_pending_since or now
                self.send(self.router, Probe(nonce=self.probe_nonce),
                          identity=node_id.encode())

