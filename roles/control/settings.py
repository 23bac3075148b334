"""Control's live settings: the effective values of the thresholds an operator may change
while the job runs (``roles.algorithms.shared.live`` validates a change). A change is applied as a
whole or not at all, broadcast (``Settings``, standing), written to ``metrics.jsonl`` and
appended to the run's ``config.toml`` as a comment line per changed key."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roles.algorithms.shared import live
from roles.control.commands import Commands
from roles.job.rundir import MetricsLog
from roles.job.settings import AggregationConfig
from roles.protocol.operator import Settings
from zbus.files import atomic_write

log = logging.getLogger(__name__)


@dataclass
class SettingsState:
    values: dict[str, Any] = field(default_factory=dict)
    version: int = 0


class LiveSettings:
    def __init__(self, config: AggregationConfig, config_file: Path, commands: Commands,
                 metrics: MetricsLog):
        self.values = live.initial(config)
        self.version = 0
        self.changes: list[dict] = []
        self.config_file = config_file
        self.commands = commands
        self.metrics = metrics

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def publish(self) -> None:
        self.commands.publish(Settings(version=self.version, values=self.values), "settings")

    def change(self, changes: dict, sender: str) -> tuple[bool, str]:
        """Apply an operator's changes (all or none); (applied, what happened or why not)."""
        try:
            new = live.apply(self.values, changes)
        except live.SettingError as exc:
            log.warning("refused a settings change from %s: %s", sender, exc)
            return False, str(exc)
        changed = {k: v for k, v in new.items() if self.values[k] != v}
        self.values = new
        self.version += 1
        self.publish()
        record = {"version": self.version, "changes": changed, "by": sender}
        self.changes.append(record)
        self.metrics.write("setting", **record)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        lines = "".join(f"# live change {self.version} at {stamp} by {sender}: "
                        f"[aggregation] {k} = {v!r}\n" for k, v in changed.items())
        atomic_write(self.config_file, self.config_file.read_bytes() + lines.encode())
        log.info("settings version %d from %s: %s", self.version, sender,
                 ", ".join(f"{k} = {v}" for k, v in changed.items()) or "no change")
        return True, "applied: " + (", ".join(f"{k} = {v}" for k, v in changed.items())
                                    or "no change")

    def to_state(self) -> SettingsState:
        return SettingsState(dict(self.values), self.version)

    def from_state(self, s: SettingsState) -> None:
        self.values, self.version = dict(s.values), s.version
