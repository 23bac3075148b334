"""Live settings: the thresholds an operator may change while a job runs (pure).

They are the ``[aggregation]`` keys marked ``live`` in ``roles.job.settings``. Control holds the
effective values; a change is validated here (known name, right type, inside its range, and
``min_local_rounds <= max_local_rounds``), then control applies it, broadcasts the new values
(``Settings``) to every node, and records the change in ``metrics.jsonl`` and ``config.toml``.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from roles.job.settings import AggregationConfig
from roles.protocol.operator import Settings


class SettingError(ValueError):
    """A change that is refused; the message names the setting and its valid range."""


def live_fields() -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(AggregationConfig) if f.metadata.get("live")}


def describe() -> dict[str, dict[str, Any]]:
    """Name -> type, range and default of every live setting (for the console and zbus-ctl)."""
    return {name: {"type": f.type if isinstance(f.type, str) else f.type.__name__,
                   "min": f.metadata["min"], "max": f.metadata["max"], "default": f.default}
            for name, f in live_fields().items()}


def initial(config: AggregationConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in live_fields()}


def _coerce(name: str, value: Any, f: dataclasses.Field[Any]) -> Any:
    lo, hi = f.metadata["min"], f.metadata["max"]
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    what = "an integer" if kind == "int" else "a number"
    if isinstance(value, str):  # from a command line: "0.5"
        try:
            value = float(value) if kind != "int" or not value.strip().lstrip("+-").isdigit() \
                else int(value)
        except ValueError:
            raise SettingError(f"{name} must be {what} in [{lo}, {hi}], got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingError(f"{name} must be {what} in [{lo}, {hi}], got {value!r}")
    if kind == "int":
        if float(value) != int(value):
            raise SettingError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
        value = int(value)
    else:
        value = float(value)
    if not lo <= value <= hi:
        raise SettingError(f"{name} must be in [{lo}, {hi}], got {value!r}")
    return value


def apply(current: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The settings after ``changes``; SettingError (nothing applied) when any is refused."""
    if not changes:
        raise SettingError("no setting to change")
    known = live_fields()
    new = dict(current)
    for name, value in changes.items():
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise SettingError(f"{name!r} is not a live setting{hint}; live settings: "
                               f"{', '.join(known)}")
        new[name] = _coerce(name, value, known[name])
    if new["min_local_rounds"] > new["max_local_rounds"]:
        raise SettingError(f"min_local_rounds ({new['min_local_rounds']}) must be <= "
                           f"max_local_rounds ({new['max_local_rounds']})")
    return new


class LiveValues:
    """A node's copy of the live settings, kept up to date from control's ``Settings``
    broadcasts (re-published every heartbeat: only a newer version changes anything)."""

    def __init__(self, config: AggregationConfig):
        self.values = initial(config)
        self.version = -1

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def take(self, msg: Settings) -> bool:
        """Apply a broadcast; True when it was newer than what this node had."""
        if msg.version <= self.version:
            return False
        self.version = msg.version
        self.values.update({k: msg.values[k] for k in self.values if k in msg.values})
        return True
