"""A stream job's part of the status (pure): each feeder's stream figures from its last
heartbeat's counters, the job's totals, and one point per status of the recent lag, rate and
progressive AUC (of the newest closed window and of every event so far, the lowest feeder's)
(``StreamStatus``; docs/streams.md, "Figures")."""

from __future__ import annotations

from collections import deque
from typing import Any

from roles.protocol.status import StreamRow, StreamView

HISTORY_POINTS = 120
GROWING_POINTS = 4   # the lag rose at each of this many statuses in a row: it grows


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _counts(value: Any) -> dict[str, int] | None:
    """A feeder's label join counts (None: no join)."""
    if not isinstance(value, dict):
        return None
    return {str(k): v for k, v in value.items() if _int(v) is not None}


def _tasks(value: Any) -> dict[str, dict[str, float | None]] | None:
    """A feeder's figures per label (None: one label)."""
    if not isinstance(value, dict):
        return None
    return {str(name): {k: _float(figures.get(k)) for k in ("progressive_auc", "window_auc")}
            for name, figures in value.items() if isinstance(figures, dict)}


def lowest_by_task(rows: list[StreamRow]) -> dict[str, dict[str, float | None]] | None:
    """Several labels: each one's lowest progressive and window AUC over the feeders that have
    one (what an operator watches is the worst); None with one label."""
    names = [name for r in rows for name in (r["tasks"] or {})]
    if not names:
        return None
    out: dict[str, dict[str, float | None]] = {}
    for name in dict.fromkeys(names):
        out[name] = {}
        for key in ("progressive_auc", "window_auc"):
            values = [v for r in rows if (v := (r["tasks"] or {}).get(name, {}).get(key))
                      is not None]
            out[name][key] = min(values) if values else None
    return out


class StreamStatus:
    def __init__(self) -> None:
        self.history: deque[tuple[float, int | None, float | None, float | None,
                                  float | None, float | None]] = deque(maxlen=HISTORY_POINTS)
        self.last: tuple[float, int] | None = None   # (t, events trained) of the last point
        # several labels: each label's lowest (window, every event's) AUC at each point of
        # ``history``
        self.task_points: deque[dict[str, tuple[float | None, float | None]]] = deque(
            maxlen=HISTORY_POINTS)

    def view(self, t: float, counters: dict[str, dict[str, Any]]) -> StreamView:
        """``counters``: each feeder's last heartbeat counters, by node; ``t``: seconds since
        control started."""
        rows: list[StreamRow] = []
        for node, c in sorted(counters.items()):
            st = c.get("stream")
            if not isinstance(st, dict):
                continue
            rows.append({"node": node, "events_read": _int(st.get("events_read")) or 0,
                         "events_trained": _int(st.get("events_trained")) or 0,
                         "events_rejected": _int(st.get("events_rejected")) or 0,
                         "lag_events": _int(st.get("lag_events")),
                         "lag_s": _float(st.get("lag_s")),
                         "progressive_auc": _float(st.get("progressive_auc")),
                         "window_auc": _float(st.get("window_auc")),
                         "broker_down_since": _float(st.get("broker_down_since")),
                         "acks_refused": _int(st.get("acks_refused")) or 0,
                         "join": _counts(st.get("join")),
                         "tasks": _tasks(st.get("tasks"))})
        trained = sum(r["events_trained"] for r in rows)
        lags = [r["lag_events"] for r in rows]
        lag = None if not rows or any(v is None for v in lags) else sum(
            v for v in lags if v is not None)
        seconds = [r["lag_s"] for r in rows if r["lag_s"] is not None]
        lag_s = max(seconds) if seconds else None
        rate = None
        if self.last is not None and t > self.last[0]:
            rate = round(max(0.0, (trained - self.last[1]) / (t - self.last[0])), 1)
        windows = [r["window_auc"] for r in rows if r["window_auc"] is not None]
        lifetimes = [r["progressive_auc"] for r in rows if r["progressive_auc"] is not None]
        tasks = lowest_by_task(rows)
        if self.last is None or t > self.last[0]:   # the lowest feeder's: what an operator
            self.history.append((round(t, 2), lag, lag_s, rate,   # watches is the worst
                                 min(windows) if windows else None,
                                 min(lifetimes) if lifetimes else None))
            self.task_points.append({name: (f["window_auc"], f["progressive_auc"])
                                     for name, f in (tasks or {}).items()})
            self.last = (t, trained)
        recent = [p[1] for p in list(self.history)[-GROWING_POINTS - 1:]]
        growing = len(recent) == GROWING_POINTS + 1 and all(
            a is not None and b is not None and b > a
            for a, b in zip(recent, recent[1:], strict=False))
        points = list(self.history)
        return {"feeders": rows, "events_trained": trained, "lag_events": lag, "lag_s": lag_s,
                "growing": growing, "tasks": tasks,
                "task_history": self._task_history(tasks, 0),
                "task_progressive_history": self._task_history(tasks, 1),
                "history": {"t": [p[0] for p in points],
                            "lag_events": [None if p[1] is None else float(p[1])
                                           for p in points],
                            "lag_s": [p[2] for p in points],
                            "events_per_s": [p[3] for p in points],
                            "window_auc": [p[4] for p in points],
                            "progressive_auc": [p[5] for p in points]}}

    def _task_history(self, tasks: dict[str, dict[str, float | None]] | None, which: int
                      ) -> dict[str, list[float | None]] | None:
        """Each label's window (``which`` 0) or every event's (1) AUC at each point."""
        if not tasks:
            return None
        return {name: [p[name][which] if name in p else None for p in self.task_points]
                for name in tasks}
